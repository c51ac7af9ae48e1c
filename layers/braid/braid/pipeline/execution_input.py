"""The input of one backup's Step Functions execution: the agent ↔ pipeline contract.

The agent starts one execution per backup, named `NAME@ID`, with this tiny
document as input; everything else is in staging (braid.format.staging):

    {"protocol": 5, "backup": "NAME@ID", "prefix": "repo/prefix", "max_concurrency": 100,
     "max_chunks_per_item": 16, "poll_seconds": 15, "stall_seconds": 3600,
     "policies": {"cut_items": true, ...}}

`protocol`: the staging protocol the agent speaks (another is refused:
ProtocolMismatchError). `policies`: braid.pipeline.policies (absent: all
on). `prefix`: the repository's key prefix in the bucket ("": its root).
Integers must be JSON integers. The first state adds
`{"execution": {"name": $$.Execution.Name}}`, and every step checks it
against `backup` (`check_execution`): an execution started under one
backup's name cannot process, or clean up, another backup.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from braid import contract
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.staging.protocol import PROTOCOL, ProtocolMismatchError, check_protocol
from braid.pipeline.policies import Policies

DEFAULT_MAX_CONCURRENCY = 100
# Chunks per map item at most: 16 (1 GiB). At the published Lambda network rate (~76 MB/s per function,
# scripts/bench_lib/scale_sim.LAMBDA_NIC_MB_S) the worker is network-bound, and a 32-chunk item took ~44 s
# of its 60 s timeout (0.73); 16 chunks keep it near a third, with room for a slow S3 minute and every retry.
DEFAULT_MAX_CHUNKS_PER_ITEM = 16
DEFAULT_POLL_SECONDS = contract.DEFAULT_POLL_SECONDS
DEFAULT_STALL_SECONDS = contract.DEFAULT_STALL_SECONDS
# Step Functions caps a Distributed Map at 10,000 concurrent child executions.
MAX_CONCURRENCY_LIMIT = 10_000
# Step Functions execution names: 1-80 characters, no spaces, brackets, wildcards or "#%\\^|~`$&,;:/".
_EXECUTION_NAME = re.compile(r"[A-Za-z0-9._@-]{1,80}")  # fullmatch: `$` admits a trailing newline


class ExecutionMismatchError(UsageError):
    """The execution's name is not the backup its input names (see check_execution)."""


def running_execution(event: Mapping[str, Any]) -> str | None:
    """The execution's own name as the state machine added it to the state; None when the
    step was not invoked by the state machine (a direct call, e.g. a test)."""
    execution = event.get("execution")
    if execution is None:
        return None
    name = execution.get("name") if isinstance(execution, Mapping) else None
    if not isinstance(name, str):
        raise ExecutionMismatchError(f"invalid pipeline input: execution must be {{'name': NAME}}, not {execution!r}")
    return name


def check_execution(event: Mapping[str, Any], ref: BackupRef) -> None:
    """Refuse to work on a backup that is not the one this execution is named after."""
    name = running_execution(event)
    if name is not None and name != str(ref):
        raise ExecutionMismatchError(
            f"execution {name!r} was asked to process backup {ref}; an execution may only process the backup it is named"
            " after (start backups with the braid agent)"
        )


def execution_name(ref: BackupRef) -> str:
    """The execution is named `NAME@ID`, so the console shows which backup it is
    and a resumed start finds the same execution."""
    name = str(ref)
    if not _EXECUTION_NAME.fullmatch(name):
        raise UsageError(f"backup {name!r} cannot name a Step Functions execution")
    return name


@dataclass(frozen=True)
class ExecutionInput:
    backup: str
    prefix: str = ""
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    max_chunks_per_item: int = DEFAULT_MAX_CHUNKS_PER_ITEM
    poll_seconds: int = DEFAULT_POLL_SECONDS
    stall_seconds: int = DEFAULT_STALL_SECONDS
    protocol: int = PROTOCOL
    policies: Policies = field(default_factory=Policies)

    def __post_init__(self) -> None:
        BackupRef.parse(self.backup)
        if self.protocol != PROTOCOL:
            raise ProtocolMismatchError(f"execution input of {self.backup} speaks staging protocol {self.protocol}; this braid speaks protocol {PROTOCOL}")
        if not 1 <= self.max_concurrency <= MAX_CONCURRENCY_LIMIT:
            raise UsageError(f"max_concurrency must be 1..{MAX_CONCURRENCY_LIMIT}, not {self.max_concurrency}")
        if not 1 <= self.max_chunks_per_item <= 64:
            raise UsageError(f"max_chunks_per_item must be 1..64, not {self.max_chunks_per_item}")
        if self.poll_seconds < 1 or self.stall_seconds < self.poll_seconds:
            raise UsageError("poll_seconds must be >= 1 and stall_seconds >= poll_seconds")
        if self.prefix.startswith("/") or ".." in self.prefix.split("/"):
            raise UsageError(f"invalid repository prefix {self.prefix!r}")

    @property
    def ref(self) -> BackupRef:
        return BackupRef.parse(self.backup)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "policies": self.policies.to_json()}

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> ExecutionInput:
        """Read the fields the pipeline defined; ignore what steps added to the state.
        Refuses (ExecutionMismatchError) a backup other than the running execution's."""
        what = f"pipeline input of {event.get('backup')!r}" if isinstance(event, Mapping) else "pipeline input"
        check_protocol(dict(event), what)
        from braid.pipeline.failure import invalid_input  # the pipeline's: the agent only writes the input

        with invalid_input("invalid pipeline input"):
            request = cls(
                backup=_typed(event, "backup", str, None),
                prefix=_typed(event, "prefix", str, ""),
                max_concurrency=_typed(event, "max_concurrency", int, DEFAULT_MAX_CONCURRENCY),
                max_chunks_per_item=_typed(event, "max_chunks_per_item", int, DEFAULT_MAX_CHUNKS_PER_ITEM),
                poll_seconds=_typed(event, "poll_seconds", int, DEFAULT_POLL_SECONDS),
                stall_seconds=_typed(event, "stall_seconds", int, DEFAULT_STALL_SECONDS),
                policies=Policies.from_json(event["policies"]) if "policies" in event else Policies(),
            )
        check_execution(event, request.ref)
        return request


def _typed(event: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    """`event[name]`, which must be of `kind` exactly (a JSON integer is no bool, string or float); `default` when absent (None: required)."""
    if name not in event:
        if default is None:
            raise KeyError(name)
        return default
    value = event[name]
    if type(value) is not kind:
        raise TypeError(f"{name} must be a JSON {'integer' if kind is int else 'string'}, not {value!r}")
    return value
