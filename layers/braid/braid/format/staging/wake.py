"""The wake record: how a sleeping backup pipeline asks the agent to wake it.

While the stream arrives slowly, the planner would otherwise watch staging
in a Lambda billed by the second for hours. It sleeps instead: the state machine's SleepUntilWoken state writes this
record, `<staging>/wake`, holding the state's task token, and waits for it
(an S3 PutObject with `.waitForTaskToken`; a timeout wakes it in any case).
The agent reads the record after each segment record it writes and at the
stream's end, and sends the token back (SendTaskSuccess) once what the
planner asked for has arrived.

The body is what the state machine can write with one intrinsic
(`States.Format`): `CHUNKS AFTER TOKEN`, three fields separated by single
spaces. CHUNKS: wake once the agent has recorded this many chunks in all
(-1: only at the stream's end); AFTER: and not sooner than this many
seconds after the agent first read this token (by the agent's own clock, so
a skewed clock can delay a round, never hurry one); TOKEN: the task token
(no spaces). The stream's end always wakes.
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
        if ended:
            return True
        return self.chunks != ONLY_AT_END and recorded_chunks >= self.chunks and seen_for_seconds >= self.after_seconds
