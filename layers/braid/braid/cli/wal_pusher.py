"""The resident WAL pusher behind `wal-push --async` (braid.ops.wal_async starts it).

It holds the spool's lock while it lives (one pusher per spool), and loops:
the files PostgreSQL marked ready (`pg_wal/archive_status/*.ready`, oldest
first) and those wal-push asked for (`queue/FILE`) are stored by up to
--workers threads with braid.ops.wal_push (durable, idempotent, never
overwriting); each stored file gets `ok/FILE`, each failure `error/FILE`
(one line), which the waiting wal-push reports. A failed file is tried
again after a pause. With nothing to do for IDLE_EXIT seconds it exits:
the next wal-push starts another.

Policy `async-bundle` (with the stack; off with BRAID_WAL_BUNDLE=off in the
pusher's environment, contract.ENV_WAL_BUNDLE): when two or more wanted
segments share a slot (braid.format.wal_bundle: a backlog), they are staged
in ONE PUT (braid.ops.wal_bundled.stage_bundle) and each gets its `ok`
marker only after that PUT succeeded. A slot is bundled once in a pusher's
life; one wanted segment (a quiet cluster) is staged alone, as before.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from braid.contract import ENV_WAL_BUNDLE
from braid.errors import BackupError
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_bundle import bundle_slot
from braid.ops.wal import ArchiveInfo, read_archive_info
from braid.ops.wal_async import ERROR, LOCK, OK, QUEUE
from braid.ops.wal_packed import PackListing

IDLE_EXIT = 60.0
RECORD_EVERY = 10.0  # seconds between reads of a missing archive record (the worker writes it from the first segment)
RETRY_AFTER = 2.0
SCAN_PAUSE = 0.02
MARKER_MAX_AGE = 7 * 86_400.0


def _write_marker(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Pusher:
    def __init__(self, options: argparse.Namespace) -> None:
        from braid.cli.compose import open_key_service, open_repository, wal_staging_for

        self.options = options
        self.spool = Path(options.spool)
        self.wal = Path(options.wal_dir)
        self.repository = open_repository(options.repo)
        # With the stack the host stages raw bytes and holds no key (braid.ops.wal_stage).
        self.staging = wal_staging_for(self.repository)
        self.keys = None if self.staging else open_key_service(self.repository, options.key_file)
        # The policy async-bundle, decided here: only with the stack (a local repository stores each file as it comes).
        self.bundling = self.staging is not None and os.environ.get(ENV_WAL_BUNDLE, "on") != "off"
        self.bundled: set[str] = set()  # slots bundled in this pusher's life: a slot has at most one bundle
        self.record: ArchiveInfo | None = None  # the archive's record, once it exists (create-only: it never changes)
        self.record_read = -RECORD_EVERY
        self.packs = PackListing()  # with the stack: each directory's packs listed once in this pusher's life (braid.ops.wal_stage)
        self.in_flight: dict[str, Future[None]] = {}
        self.failed: dict[str, float] = {}
        self.stored: set[str] = set()  # stored in this pusher's life: a .ready file not yet renamed is not pushed twice

    def wanted(self) -> list[tuple[str, Path]]:
        """Files to store now: ready or asked for, not stored, not in flight, not failed just now; oldest first."""
        found: dict[str, Path] = {}
        try:
            for entry in os.scandir(self.wal / "archive_status"):
                if entry.name.endswith(".ready") and entry.name[: -len(".ready")] not in self.stored:
                    file = entry.name[: -len(".ready")]
                    found[file] = self.wal / file
        except FileNotFoundError:
            pass
        for entry in os.scandir(self.spool / QUEUE):  # asked for by a waiting wal-push: always (again)
            if not entry.name.startswith("."):
                try:
                    found[entry.name] = Path(Path(entry.path).read_text())
                except FileNotFoundError:
                    continue
        now = time.monotonic()
        result = []
        for file, path in sorted(found.items(), key=lambda item: _order(item[0])):
            if file in self.in_flight or (self.spool / OK / file).exists():
                continue
            if now - self.failed.get(file, -RETRY_AFTER) < RETRY_AFTER:
                continue
            result.append((file, path))
        return result

    def may_bundle(self) -> bool:
        """async-bundle is on and the archive's record allows bundles (version 3; read until it exists, at most every
        RECORD_EVERY seconds): in an older archive a slot's files go one unit each, in parallel, as before."""
        if not self.bundling:
            return False
        if self.record is None and time.monotonic() - self.record_read >= RECORD_EVERY:
            self.record_read = time.monotonic()
            try:
                self.record = read_archive_info(self.repository.store, self.options.name)
            except BackupError:
                self.record = None  # each file's own push reports it
        return self.record is not None and self.record.may_stage_bundles

    def tasks(self, wanted: list[tuple[str, Path]]) -> list[list[tuple[str, Path]]]:
        """`wanted` as units of work, in order: the segments of one slot together (a bundle), with async-bundle on."""
        if len(wanted) < 2 or not self.may_bundle():
            return [[item] for item in wanted]
        units: list[list[tuple[str, Path]]] = []
        slots: dict[str, list[tuple[str, Path]]] = {}
        for file, path in wanted:
            slot = _slot(file)
            if slot is None or slot in self.bundled:
                units.append([(file, path)])
            elif slot in slots:
                slots[slot].append((file, path))
            else:
                slots[slot] = [(file, path)]
                units.append(slots[slot])
        return units

    def store_bundle(self, members: list[tuple[str, Path]]) -> None:
        from braid.ops.wal_bundled import stage_bundle

        assert self.staging is not None
        slot = _slot(members[0][0])
        if slot is not None:
            self.bundled.add(slot)
        try:
            results = stage_bundle(self.repository, self.staging, self.options.name, [path for _f, path in members], self.packs)
        except Exception as exc:  # a bug: reported for every member like any failure, never taken for success
            for file, _path in members:
                self.failed[file] = time.monotonic()
                _write_marker(self.spool / ERROR / file, f"unexpected {type(exc).__name__}: {exc}\n")
            raise
        for (file, _path), result in zip(members, results, strict=True):
            if isinstance(result, BackupError):
                self._failed(file, result)
            else:
                self._stored(file)

    def _failed(self, file: str, exc: BackupError) -> None:
        self.failed[file] = time.monotonic()
        _write_marker(self.spool / ERROR / file, f"{exc}\n")
        print(f"braid wal-push --async: {file}: {exc}", file=sys.stderr, flush=True)

    def store(self, file: str, path: Path) -> None:
        from braid.cli.commands.wal import push_to

        try:
            push_to(self.repository, self.options.key_file, None, self.options.name, path, self.options.level, self.keys, self.packs)
        except BackupError as exc:
            self._failed(file, exc)
            return
        except Exception as exc:  # a bug: reported for the file like any failure, never taken for success
            self.failed[file] = time.monotonic()
            _write_marker(self.spool / ERROR / file, f"unexpected {type(exc).__name__}: {exc}\n")
            raise
        self._stored(file)

    def _stored(self, file: str) -> None:
        _write_marker(self.spool / OK / file, "")  # only now: the file is durable in the repository
        self.stored.add(file)
        try:
            (self.spool / QUEUE / file).unlink()
        except FileNotFoundError:
            pass

    def run(self) -> None:
        idle_since = time.monotonic()
        with ThreadPoolExecutor(self.options.workers) as pool:
            while True:
                for file, future in list(self.in_flight.items()):
                    if future.done():
                        del self.in_flight[file]
                        future.result()
                free = self.options.workers - len(set(self.in_flight.values()))
                for unit in self.tasks(self.wanted())[: max(free, 0)]:
                    future = pool.submit(self.store_bundle, unit) if len(unit) > 1 else pool.submit(self.store, *unit[0])
                    for file, _path in unit:
                        self.in_flight[file] = future
                if self.in_flight:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > IDLE_EXIT:
                    return
                time.sleep(SCAN_PAUSE)


def _slot(file: str) -> str | None:
    """The bundle slot of a whole segment (braid.format.wal_bundle), None for any other file."""
    try:
        parsed = WalFile.parse(file)
    except BackupError:
        return None
    return bundle_slot(parsed) if parsed.kind == SEGMENT else None


def _order(file: str) -> tuple[int, str]:
    """History files first (a new timeline's segments need theirs), then by name (segment order)."""
    try:
        kind = WalFile.parse(file).kind
    except BackupError:
        return (2, file)
    return (0 if kind == "history" else 1, file)


def _clean_old_markers(spool: Path) -> None:
    """Markers no wal-push consumed within a week (files PostgreSQL never asked about again)."""
    now = time.time()
    for directory in (OK, ERROR, QUEUE):
        for entry in os.scandir(spool / directory):
            try:
                if now - entry.stat().st_mtime > MARKER_MAX_AGE:
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue


def _lock(spool: Path) -> int | None:
    """The spool's lock, taken within a second or two (the wal-push that started us may hold it for an instant), else None."""
    fd = os.open(spool / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for _ in range(100):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, b"%d\n" % os.getpid())  # who serves the spool (for an operator, and tests that stop it)
            return fd
        except BlockingIOError:
            time.sleep(0.02)
    os.close(fd)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid.cli.wal_pusher")
    for option in ("--repo", "--name", "--wal-dir", "--spool", "--key-file"):
        parser.add_argument(option)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--level", type=int, default=3)
    options = parser.parse_args(argv)
    spool = Path(options.spool)
    lock = _lock(spool)
    if lock is None:
        return 0  # another pusher serves this spool
    for directory in (OK, ERROR, QUEUE):
        (spool / directory).mkdir(mode=0o700, exist_ok=True)
    _clean_old_markers(spool)
    try:
        Pusher(options).run()
    except BackupError as exc:
        print(f"braid wal-push --async: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
