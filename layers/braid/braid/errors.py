"""Typed errors for every way a backup can go wrong.

Each error carries a message that tells the user what to fix, and an exit code
the CLI returns, so scripts around `braid` can tell a wrong key from a corrupt
chunk without parsing text. The codes are a contract (docs/usage.md, `braid --help`).
"""

from __future__ import annotations

from collections.abc import Iterable


class BackupError(Exception):
    """Base of every error Braid reports to a user."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(BackupError):
    """The command line asks for something impossible or contradictory."""

    exit_code = 2


class RepositoryError(BackupError):
    """The repository is missing, not initialised, or of an unknown format."""

    exit_code = 3


class KeyAccessError(BackupError):
    """The key file or key service cannot provide the key a backup needs."""

    exit_code = 4


class InputError(BackupError):
    """A backup input (stdin, file, named pipe) or restore output cannot be used."""

    exit_code = 5


class IntegrityError(BackupError):
    """Stored data failed authentication or a checksum: never trust it."""

    exit_code = 6


class StorageError(BackupError):
    """The object store refused or failed a read or write."""

    exit_code = 7


class PermissionDeniedError(StorageError):
    """The operating system refused access (EACCES/EPERM): a permissions problem, never evidence of damage.

    Verify does not record it as a failed check, list skips what it cannot
    read with a warning, and prune says to fix permissions rather than to
    forget the backup.
    """

    exit_code = 7


class NotFoundError(BackupError):
    """The named backup (or object) does not exist in the repository."""

    exit_code = 8


class AlreadyExistsError(StorageError):
    """A create-only write found an object already there."""

    exit_code = 7


class ExecutionError(BackupError):
    """The cloud fan-out (Step Functions execution) failed or was aborted."""

    exit_code = 9


class LimitError(BackupError):
    """A hard format limit would be exceeded (chunks per key, part counts)."""

    exit_code = 10


class EmptyStreamError(InputError):
    """The backup stream ended without a byte: refused, so a failed producer never becomes the newest backup."""


class ProducerError(BackupError):
    """The command Braid ran failed: the producer of a backup (nothing is published) or the consumer of a restore.

    Its own exit code, so a script tells "the database tool failed" from
    Braid's own failures without parsing text.
    """

    exit_code = 11


class RetentionLockError(BackupError):
    """A backup is still under its Object Lock retention: it cannot be removed before the date the message gives.

    Its own exit code: not a failure of the store, nor of the backup, but a
    date to wait for (or a policy to revisit), which a script can tell apart.
    """

    exit_code = 12


class DependentsError(BackupError):
    """A backup other backups restore on top of (an incremental chain's parent): not removed without its children.

    Its own exit code: nothing is wrong with the backup or the store; the
    person asked for a removal that would leave incrementals unrestorable.
    """

    exit_code = 14


class WalConflictError(AlreadyExistsError):
    """A WAL file of the same name, with different content, is already archived: nothing is overwritten."""


class WalNotArchivedError(NotFoundError):
    """`wal-fetch`: the file is not in the archive. Exit 1, which PostgreSQL's restore_command takes as the archive's end."""

    exit_code = 1


WAL_FETCH_UNEXPECTED = 13


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "unexpected error (run with --debug for the traceback); for wal-fetch: the file is not in the archive",
    2: "usage error: bad arguments or options",
    3: "repository missing, not initialised or unreadable",
    4: "key error: key file missing or wrong key for this repository/backup",
    5: "input/output error: a stream, file or named pipe cannot be read or written",
    6: "integrity error: a chunk or manifest failed authentication or a checksum",
    7: "storage error: the repository refused or failed a read or write",
    8: "backup not found",
    9: "cloud execution failed",
    10: "format limit exceeded",
    11: "the producer (backup) or consumer (restore) command failed",
    12: "a backup is under Object Lock retention: not removed before the date given",
    13: "wal-fetch: an unexpected error (run with --debug for the traceback); exit 1 is kept for a file not in the archive",
    14: "a backup has incremental children: not removed without --with-children",
    130: "interrupted",
}


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean pg?)" for the closest known word, or "": a typo is told apart from a real absence."""
    import difflib  # on an error path only: every process imports this module

    close = difflib.get_close_matches(word, sorted(set(known) - {word}), n=1)  # never the word itself: it exists, the id does not
    return f" (did you mean {close[0]}?)" if close else ""
