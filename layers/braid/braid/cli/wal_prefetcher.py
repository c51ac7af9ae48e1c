"""The prefetch process `wal-fetch` starts (braid.ops.wal_prefetch): `python -m braid.cli.wal_prefetcher`.

A composition root like the commands: it opens the repository and its key
service, takes the spool's lock (one prefetcher per spool), and runs the
prefetch loop until it idles out.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from braid.cli.compose import open_key_service, open_repository, wal_staging_for
from braid.errors import BackupError
from braid.ops.wal_prefetch import locked, prefetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid.cli.wal_prefetcher")
    for option in ("--repo", "--name", "--spool", "--key-file"):
        parser.add_argument(option)
    parser.add_argument("--count", type=int, default=8)
    options = parser.parse_args(argv)
    spool = Path(options.spool)  # relative (restore --pgdata's): in the data directory, the working directory it inherits
    try:
        lock = locked(spool)
    except FileNotFoundError:
        return 0  # the spool was removed meanwhile (an idle prefetcher's cleanup): the next wal-fetch makes it again
    if lock is None:
        return 0  # another prefetcher serves this spool
    os.ftruncate(lock, 0)
    os.write(lock, b"%d\n" % os.getpid())
    try:
        repository = open_repository(options.repo)
        keys = open_key_service(repository, options.key_file, unwrap_only=True)
        prefetch(repository, keys, options.name, spool, options.count, wal_staging_for(repository))
    except BackupError as exc:  # the next wal-fetch fetches for itself and reports what is wrong
        print(f"braid wal-fetch prefetch: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
