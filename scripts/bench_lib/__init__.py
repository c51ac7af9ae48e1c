"""Braid's benchmark harness (`scripts/bench`). Not a test; not run in CI.

Layout:
- `cli.py`: argument parsing, subcommands, running and reporting;
- `context.py`: what a benchmark gets (options, work directory, the data set,
  paths to the project's tools);
- `data.py`: the shared deterministic data set;
- `timing.py`: wall/CPU measurement of in-process code and child processes;
- `report.py`: the result types and the table/JSON printers;
- `benchmarks/`: one module per benchmark, discovered automatically.

To add a benchmark, drop a module into `benchmarks/` that defines

    NAME = "cloud"                 # the subcommand
    HELP = "one line for --help"
    ORDER = 30                     # position in `all` and in reports
    IN_ALL = True                  # whether `scripts/bench all` runs it
    def add_arguments(parser): ... # optional: its own options
    def run(ctx: Context) -> Section: ...

and it appears as `scripts/bench NAME` and in `scripts/bench all`.
"""
