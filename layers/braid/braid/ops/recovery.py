"""Recovery settings for a restored PostgreSQL data directory, and picking the base backup for a target time.

`braid restore NAME@ID --pgdata DIR` extracts the base backup
(braid.ops.pgdata), then writes `recovery.signal` and appends to
`postgresql.auto.conf` (the file ALTER SYSTEM writes, read last, so these
settings win) the `restore_command` that fetches WAL from this repository
(`braid wal-fetch`) and at most one recovery target, with its action and
timeline. `pg_ctl start` then replays WAL to the target; with no target it
replays to the end of the archive and promotes (PostgreSQL's default).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from braid.errors import NotFoundError, UsageError
from braid.format.ids import BackupRef
from braid.format.pg_backup import parse_lsn
from braid.format.repository import Repository
from braid.format.timestamps import parse_timestamp
from braid.ops.spool import PGDATA_SPOOL

__all__ = ["RecoveryTarget", "backup_before", "fetch_spool", "parse_target_time", "restore_command", "write_recovery"]

ACTIONS = ("promote", "pause", "shutdown")


@dataclass(frozen=True)
class RecoveryTarget:
    """At most one of time / lsn / xid / name (`kind`, `value`), plus the action and timeline (None: PostgreSQL's default)."""

    kind: str | None = None  # "time", "lsn", "xid" or "name"
    value: str = ""
    action: str | None = None
    timeline: str | None = None

    def check(self) -> None:
        """UsageError (exit 2) for a value PostgreSQL would refuse at start, so it is refused before anything is written."""
        if self.kind is None and self.action is not None:
            raise UsageError("--target-action needs a target: --target-time, --target-lsn, --target-xid or --target-name")
        if "\n" in self.value or "\0" in self.value:
            raise UsageError(f"--target-{self.kind} must be one line")
        if self.kind == "lsn":
            try:
                parse_lsn(self.value)
            except ValueError:
                raise UsageError(f"--target-lsn {self.value!r} is not an LSN (X/Y in hexadecimal, e.g. 0/3000060)") from None
        elif self.kind == "xid" and not self.value.isdigit():
            raise UsageError(f"--target-xid {self.value!r} is not a transaction id (a number)")
        elif self.kind == "name" and not self.value:
            raise UsageError("--target-name must not be empty")
        elif self.kind == "time":
            parse_target_time(self.value)
        if self.action is not None and self.action not in ACTIONS:
            raise UsageError(f"--target-action must be one of {', '.join(ACTIONS)}")
        if self.timeline is not None and self.timeline not in ("latest", "current") and not self.timeline.isdigit():
            raise UsageError(f"--target-timeline must be latest, current or a timeline number, not {self.timeline!r}")

    def settings(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if self.kind is not None:
            found.append((f"recovery_target_{self.kind}", self.value))
        if self.action is not None:
            found.append(("recovery_target_action", self.action))
        if self.timeline is not None:
            found.append(("recovery_target_timeline", self.timeline))
        return found


_OFFSET = re.compile(r"([+-]\d{2})(:?\d{2})?$")


def parse_target_time(text: str) -> datetime:
    """A recovery_target_time as PostgreSQL writes timestamps (`2026-11-28 14:03:00[.ffffff][+00[:00]]`, or ISO 8601 with T / Z).

    Without an offset it is this host's local time. UsageError for anything else.
    """
    value = text.strip()
    if len(value) > 10 and value[10] in "Tt":  # ISO 8601's date-time separator, not a T elsewhere (UTC)
        value = value[:10] + " " + value[11:]
    if value.endswith(("Z", "z")) or value.endswith(" UTC"):
        value = value.removesuffix(" UTC").rstrip("Zz") + "+00:00"
    match = _OFFSET.search(value)
    if match is not None and match.group(2) is None and re.search(r"\d{2}:\d{2}:\d{2}(\.\d+)?[+-]\d{2}$", value):
        value += ":00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"--target-time {text!r} is not a time Braid can compare: give YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM]] (PostgreSQL's form)"
        ) from None
    return moment if moment.tzinfo is not None else moment.astimezone()


def backup_before(repository: Repository, name: str, target: datetime) -> BackupRef:
    """The newest published backup of `name` that completed before `target` (a base backup must end before the recovery target)."""
    found = repository.backups(name)
    if not found:
        raise NotFoundError(f"no backups named {name!r} in {repository.url}{repository.suggest_name(name)}")
    for ref in reversed(found):
        manifest = repository.load(ref).manifest
        if parse_timestamp(manifest.completed) <= target.astimezone(UTC):
            return ref
    oldest = repository.load(found[0]).manifest.completed
    raise NotFoundError(f"no backup of {name} ended before {target.isoformat()} (the oldest ended {oldest}); choose a later --target-time")


def restore_command(executable: Sequence[str], repo: str, name: str, key_file: str | None, spool: tuple[str, str] | None = None) -> str:
    """`braid wal-fetch --repo R --name NAME %f %p` as a shell command line, every path absolute but the spool's.

    With `spool` (the --spool root given to wal-fetch, and the prefetch spool
    it resolves to, on DEST's file system; both relative to the data
    directory, see fetch_spool), a POSIX sh fast path comes first: a segment
    the prefetcher already spooled (verified, written atomically) is
    recorded as the spool's position (a temporary file renamed onto it) and
    hard-linked to %p, with no process but sh, mv and ln; anything else (not
    spooled, the spool removed by the prefetcher's idle exit, another file
    system, a failed step) runs wal-fetch.
    """
    words = [*executable, "wal-fetch", "--repo", repo, "--name", name]
    if key_file is not None:
        words += ["--key-file", key_file]
    if spool is not None:
        words += ["--spool", spool[0]]
    full = " ".join(_word(word) for word in words) + " %f %p"
    if spool is None:
        return full
    return (
        f"f=%f s={_word(spool[1])}; if [ -f \"$s/$f\" ] && echo \"$f\" >\"$s/.position.$$\" && mv -f \"$s/.position.$$\" \"$s/position\""
        f" && ln \"$s/$f\" %p 2>/dev/null; then rm -f \"$s/$f\"; exit 0; fi; exec {full}"
    )


SPOOL_ROOT = "pg_wal/" + PGDATA_SPOOL  # relative to the data directory


def fetch_spool(directory: str, repo: str, name: str) -> tuple[str, str] | None:
    """wal-fetch's --spool root and prefetch spool inside DIR/pg_wal (the file system of %p, this user's, 0700), both
    relative to DIR; None when not made there.

    Relative, so that a data directory moved or renamed after the restore keeps a working fast path and no process
    writes to its old place: PostgreSQL runs restore_command in the data directory. The postmaster chdir's there at
    start (src/backend/postmaster/postmaster.c, PostmasterMain: "And switch working directory into it",
    ChangeToDataDir(); src/backend/utils/init/miscinit.c: "Most of the postmaster and backend code assumes that we
    are in DataDir so it can use relative paths"), its children inherit it, %p is relative to it (xlogarchive.c, RestoreArchivedFile:
    XLOGDIR "/" RECOVERYXLOG, i.e. pg_wal/RECOVERYXLOG), and the documentation of restore_command says so: "The path
    name is relative to the current working directory, i.e., the cluster's data directory." wal-fetch starts the
    prefetcher in that directory too, with the spool's relative name. Inside pg_wal, a base backup of the recovered
    cluster leaves the spool out, and the fast path can hard-link a spooled segment to %p without a copy.
    """
    from pathlib import Path

    from braid.errors import BackupError
    from braid.ops.spool import spool_for

    wal_directory = Path(directory, "pg_wal")
    if not wal_directory.is_dir() or wal_directory.is_symlink():
        return None  # pg_wal elsewhere: the default spool and plain wal-fetch
    try:
        spool = spool_for(str(wal_directory / PGDATA_SPOOL), "fetch", repo, name, wal_directory)
    except (BackupError, OSError):
        return None
    return SPOOL_ROOT, f"{SPOOL_ROOT}/{spool.name}"


def _word(word: str) -> str:
    """One shell word, with PostgreSQL's placeholder character doubled (%% is a literal %)."""
    return shlex.quote(word).replace("%", "%%")


def _conf_value(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def write_recovery(directory: str, command: str, target: RecoveryTarget, backup: str) -> None:
    """recovery.signal and the settings appended to postgresql.auto.conf, both fsynced."""
    lines = [f"# braid restore {backup} --pgdata: recovery settings (remove them once the server is promoted)"]
    lines += [f"{key} = {_conf_value(value)}" for key, value in [("restore_command", command), *target.settings()]]
    conf = os.path.join(directory, "postgresql.auto.conf")
    fd = os.open(conf, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, ("\n" + "\n".join(lines) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    signal = os.open(os.path.join(directory, "recovery.signal"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fsync(signal)
    finally:
        os.close(signal)
    dirfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
