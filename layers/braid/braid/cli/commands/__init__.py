"""One module per command family: parse nothing, decide nothing about layout.

Each `cmd_*` takes the parsed namespace, opens what it needs through the
composition root (braid.cli.compose), calls a use case (braid.ops, or an
engine), hands the result to braid.cli.render, and returns the exit code.
Failures are raised as braid.errors types; braid.cli.main prints them.
"""
