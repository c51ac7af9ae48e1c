"""Braid: database backup fan-out.

One package serves the agent CLI on the database host, the local engine, and
the Lambda handlers (shipped as a layer), so every path runs the same code.
The modules at this level are the pure core: no AWS import. Adapters live in
`braid.adapters`.
"""

__version__ = "0.1.0"
