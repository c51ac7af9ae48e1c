"""The wake record `<staging>/wake`: how a sleeping backup pipeline asks the agent to wake it (docs/format.md).

SleepUntilWoken writes it with its task token (a timeout wakes it in any
case); the agent sends the token back once due. The body is one
`States.Format`: `CHUNKS AFTER TOKEN`, single spaces, TOKEN without any:
wake once CHUNKS chunks are recorded in all (-1: only at the stream's end)
and AFTER seconds passed since the agent first read the token (its own
clock: a skewed clock delays a round, never hurries one), or once the
stream ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from braid.errors import IntegrityError

ONLY_AT_END = -1


@dataclass(frozen=True)
class WakeRecord:
    chunks: int  # wake once this many chunks are recorded (ONLY_AT_END: only at the stream's end)
    after_seconds: int  # and not sooner than this after the agent first read the record
    token: str

    def to_bytes(self) -> bytes:
        return f"{self.chunks} {self.after_seconds} {self.token}".encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> WakeRecord:
        try:
            chunks, after, token = raw.decode("ascii").strip().split(" ", 2)
            record = cls(int(chunks), int(after), token)
        except (UnicodeDecodeError, ValueError) as exc:
            raise IntegrityError(f"wake record {where} is malformed: {exc}") from None
        if not record.token or " " in record.token or record.chunks < ONLY_AT_END or record.after_seconds < 0:
            raise IntegrityError(f"wake record {where} is malformed")
        return record

    def due(self, recorded_chunks: int, seen_for_seconds: float, ended: bool) -> bool:
        """Whether the agent should send the token now."""
        return ended or (self.chunks != ONLY_AT_END and recorded_chunks >= self.chunks and seen_for_seconds >= self.after_seconds)
