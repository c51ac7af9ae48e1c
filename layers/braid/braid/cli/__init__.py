"""`braid`, the command line: parser, commands, rendering, progress, and the
composition root that turns what the user typed into live ports."""

from braid.cli.main import main

__all__ = ["main"]
