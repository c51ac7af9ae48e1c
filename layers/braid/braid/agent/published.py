"""Does a published manifest hold what the agent sent? Checks made with what only the agent knows.

`check_covers_stream`: the manifest's per-input lengths equal the agent's stream-end record.
`same_inputs`: a --resume of a backup published meanwhile succeeds only when the given
inputs have the published sizes; nothing of them is read. Both raise typed errors
(IntegrityError, NotFoundError) whose message the CLI prints as is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid.engine.stream import InputSource, input_lengths
from braid.errors import IntegrityError, NotFoundError
from braid.format.staging import StreamEnd

if TYPE_CHECKING:
    from braid.format.manifest import Manifest  # the published one, loaded by whoever read it


def check_covers_stream(manifest: Manifest, expected: StreamEnd) -> None:
    lengths = [entry.length for entry in manifest.inputs]
    if lengths != list(expected.lengths):
        raise IntegrityError(f"the published manifest of {manifest.backup} covers {lengths} bytes per input, but the agent sent {expected.lengths}")


def same_inputs(manifest: Manifest, sources: list[InputSource]) -> Manifest:
    """A --resume of a backup published meanwhile succeeds only for the inputs it holds (their sizes, at least).

    Nothing of the given inputs is read: a retry that passes another stream
    (or one whose size cannot be told, a pipe) must not get exit 0 and a
    NAME@ID that holds none of it.
    """
    published = [entry.length for entry in manifest.inputs]
    given = input_lengths(sources)
    if given != published:
        what = "a stream whose size cannot be checked" if given is None else f"inputs of {given} bytes"
        raise NotFoundError(
            f"backup {manifest.backup} is already published ({len(published)} input(s) of {published} bytes); nothing to resume,"
            f" and {what} were given: none of it was read. Start a new backup for new data"
        )
    return manifest
