"""Test support shared by the pytest suites and scripts (e.g. the emulated cloud).

Plain modules, not pytest fixtures, so scripts can import them with
`tests/` on sys.path.
"""
