"""One module per benchmark; see bench_lib/__init__.py for the interface."""
