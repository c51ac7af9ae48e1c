"""The cloud agent's `ChunkSink`: the shared driver loop feeding the staging uploader.

A thin adapter, so the uploader keeps its own vocabulary (parts numbered
within each input) and the driver its own (chunks numbered across the
backup). The global index is not sent: the pipeline's planner assigns
chunk indexes to segments as they complete (braid.pipeline.plan).
"""

from __future__ import annotations

from braid.agent.uploader import StagingUpload
from braid.engine.driver import Release
from braid.engine.stream import Piece
from braid.format.staging import StreamEnd


class StagingSink:
    """Each piece becomes one part of its input's current staging segment."""

    def __init__(self, upload: StagingUpload) -> None:
        self.upload = upload

    def accept(self, index: int, piece: Piece, release: Release) -> None:
        self.upload.submit(piece.input_index, piece.number, piece.data, release)

    def end_input(self, input_index: int, length: int) -> None:
        self.upload.end_input(input_index, length)

    def finish(self) -> StreamEnd:
        return self.upload.finish()

    def abort(self, error: BaseException) -> None:
        self.upload.abort(error)
