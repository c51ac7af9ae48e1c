"""What a backup used: the manifest's `usage` section (docs/format.md, Usage).

A bill is made of counted things: requests by operation, Lambda
invocations and their billed GB-seconds, Step Functions state transitions
and Express children, bytes staged and stored. Each is recorded where it
happened (a worker counts its own requests and duration into its result
record, the agent into its stream-end record, Plan and Finalize into the
execution's state) and Finalize adds them up into the manifest, where the
manifest's MAC covers them like everything else. Quantities, not dollars:
prices change and differ by region, so `braid show` prices a usage with the
repository's price table (braid.format.prices) when it is read.

Requests are keyed `service:Operation` as the AWS SDK names them
(`s3:PutObject`, `kms:Decrypt`), one per HTTP attempt, retries included,
since every attempt is billed. `s3_request_class` sorts S3's operations into
the price classes of S3's price list.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

FIELD = "usage"

# S3 bills "PUT, COPY, POST, LIST requests" at one price, "GET, SELECT, and
# all other requests" at another, and DELETE and CANCEL (abort) requests not
# at all.
_S3_PUT_CLASS = frozenset(
    {"PutObject", "CopyObject", "UploadPart", "UploadPartCopy", "CreateMultipartUpload", "CompleteMultipartUpload", "PostObject", "RestoreObject"}
)
_S3_FREE = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})

S3_PUT = "put"
S3_GET = "get"
S3_FREE = "free"

# Express child workflows are billed per 100 ms of duration at 64 MB of memory
# for a payload as small as a map item (Step Functions pricing).
EXPRESS_BILLING_SECONDS = 0.1
EXPRESS_MEMORY_GB = 64 / 1024


# The billed quantities, flat: what a price table prices (braid.format.prices), what the
# catalog summary keeps of a usage (so `list` reads a dozen numbers per backup, not the
# request map), and the first fields of the CLI's `usage` object.
BILLED_INTEGERS = (
    "lambda_invocations",
    "s3_put_requests",
    "s3_get_requests",
    "s3_free_requests",
    "kms_requests",
    "sfn_transitions",
    "sfn_express_requests",
    "staged_bytes",
    "stored_bytes",
)
BILLED_AMOUNTS = ("lambda_gb_seconds", "sfn_express_gb_seconds", "cpu_seconds")
BILLED_FIELDS = frozenset((*BILLED_INTEGERS, *BILLED_AMOUNTS))
Billed = dict[str, int | float]


def check_billed(doc: Any, what: str = "usage") -> Billed:
    """A flat billed-quantities object (`Usage.billed`), every field present and a non-negative number."""
    if not isinstance(doc, dict) or doc.keys() != BILLED_FIELDS:
        raise ValueError(f"{what} must be {{{', '.join(sorted(BILLED_FIELDS))}}}")
    # At once for the common case (`list` checks one per backup), field by field to name a bad one.
    if not all(type(doc[name]) is int and doc[name] >= 0 for name in BILLED_INTEGERS):
        for name in BILLED_INTEGERS:
            _count(doc[name], f"{what}.{name}")
    for name in BILLED_AMOUNTS:
        value = doc[name]
        if type(value) not in (int, float) or not 0 <= value < math.inf:
            _amount(value, f"{what}.{name}")
    return doc


@cache
def s3_request_class(operation: str) -> str:
    """`put`, `get` or `free`: the S3 price class of an operation (e.g. `ListObjectsV2` is `put`, `HeadObject` `get`)."""
    if operation in _S3_PUT_CLASS or operation.startswith("List"):
        return S3_PUT
    if operation in _S3_FREE:
        return S3_FREE
    return S3_GET


def express_gb_seconds(seconds: float) -> float:
    """What one Express child running `seconds` bills: rounded up to 100 ms, at 64 MB."""
    steps = math.ceil(round(seconds / EXPRESS_BILLING_SECONDS, 6))
    return max(1, steps) * EXPRESS_BILLING_SECONDS * EXPRESS_MEMORY_GB


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, not {value!r}")
    return value


def _amount(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or not math.isfinite(value):
        raise ValueError(f"{what} must be a non-negative number, not {value!r}")
    return float(value)


def _rounded(value: float) -> float:
    """Six decimals: a microsecond or a micro-GB-second, and stable JSON."""
    return round(value, 6)


_FUNCTION_FIELDS = {"invocations", "seconds", "gb_seconds"}
_FIELDS = {"requests", "lambda", "stepfunctions", "bytes", "cpu_seconds"}
_SFN_FIELDS = {"transitions", "express_requests", "express_gb_seconds"}
_BYTES_FIELDS = {"staged", "stored"}


@dataclass(frozen=True)
class FunctionUse:
    """One Lambda function's share: invocations and their billed duration in seconds and GB-seconds."""

    invocations: int = 0
    seconds: float = 0.0
    gb_seconds: float = 0.0

    def __add__(self, other: FunctionUse) -> FunctionUse:
        return FunctionUse(self.invocations + other.invocations, self.seconds + other.seconds, self.gb_seconds + other.gb_seconds)

    def to_json(self) -> dict[str, Any]:
        return {"invocations": self.invocations, "seconds": _rounded(self.seconds), "gb_seconds": _rounded(self.gb_seconds)}

    @classmethod
    def from_json(cls, doc: Any, what: str) -> FunctionUse:
        if not isinstance(doc, dict) or doc.keys() != _FUNCTION_FIELDS:
            raise ValueError(f"{what} must be {{invocations, seconds, gb_seconds}}")
        invocations, seconds, gb_seconds = doc["invocations"], doc["seconds"], doc["gb_seconds"]
        if type(invocations) is int and invocations >= 0 and type(seconds) in (int, float) and type(gb_seconds) in (int, float):
            if 0 <= seconds < math.inf and 0 <= gb_seconds < math.inf:  # the common case, checked at once
                return cls(invocations, float(seconds), float(gb_seconds))
        return cls(_count(invocations, f"{what}.invocations"), _amount(seconds, f"{what}.seconds"), _amount(gb_seconds, f"{what}.gb_seconds"))


def billed_invocation(seconds: float, memory_mb: int) -> FunctionUse:
    """One Lambda invocation of `seconds` wall time: Lambda bills duration rounded up to the millisecond."""
    billed = math.ceil(round(seconds * 1000, 6)) / 1000
    return FunctionUse(1, billed, billed * memory_mb / 1024)


@dataclass(frozen=True)
class Usage:
    """Counted quantities; `+` adds two (a worker's to the backup's, one Plan call's to the last)."""

    requests: Mapping[str, int] = field(default_factory=dict)  # "service:Operation" -> HTTP attempts
    functions: Mapping[str, FunctionUse] = field(default_factory=dict)  # Lambda function role -> its use
    transitions: int = 0  # Step Functions Standard state transitions of the backup's execution
    express_requests: int = 0  # Express child workflows (one per map item run)
    express_gb_seconds: float = 0.0
    staged_bytes: int = 0  # plaintext staged in S3 by the agent (cloud path)
    stored_bytes: int = 0  # what the backup's chunks take in the repository
    cpu_seconds: float = 0.0  # the local engine's process CPU time

    def __add__(self, other: Usage) -> Usage:
        requests = dict(self.requests)
        for name, n in other.requests.items():
            requests[name] = requests.get(name, 0) + n
        functions = dict(self.functions)
        for name, use in other.functions.items():
            functions[name] = functions.get(name, FunctionUse()) + use
        return Usage(
            requests=requests,
            functions=functions,
            transitions=self.transitions + other.transitions,
            express_requests=self.express_requests + other.express_requests,
            express_gb_seconds=self.express_gb_seconds + other.express_gb_seconds,
            staged_bytes=self.staged_bytes + other.staged_bytes,
            stored_bytes=self.stored_bytes + other.stored_bytes,
            cpu_seconds=self.cpu_seconds + other.cpu_seconds,
        )

    @classmethod
    def total(cls, parts: Iterable[Usage]) -> Usage:
        found = cls()
        for part in parts:
            found = found + part
        return found

    def requests_of(self, service: str) -> dict[str, int]:
        """{operation: attempts} of one service (`s3`, `kms`, ...)."""
        prefix = f"{service}:"
        return {name[len(prefix) :]: n for name, n in self.requests.items() if name.startswith(prefix)}

    @cached_property
    def _request_totals(self) -> dict[str, int]:
        """Attempts by S3 price class (`put`, `get`, `free`) and by service, in one pass (`list --json` prices thousands)."""
        totals: dict[str, int] = {}
        for name, n in self.requests.items():
            service, _, operation = name.partition(":")
            key = s3_request_class(operation) if service == "s3" else service
            totals[key] = totals.get(key, 0) + n
        return totals

    def s3_requests(self, price_class: str) -> int:
        return self._request_totals.get(price_class, 0)

    def service_requests(self, service: str) -> int:
        """Every attempt to a service other than S3 (`kms`, ...)."""
        return self._request_totals.get(service, 0)

    @property
    def lambda_invocations(self) -> int:
        return sum(f.invocations for f in self.functions.values())

    @property
    def lambda_gb_seconds(self) -> float:
        """The sum of what each function's record says (rounded first, exactly summed): the same figure
        whether it comes from the counted use or from the record written of it, in any order."""
        return math.fsum(_rounded(f.gb_seconds) for f in self.functions.values())

    def billed(self) -> Billed:
        """The quantities a bill is made of (BILLED_FIELDS), flat."""
        return {
            "lambda_invocations": self.lambda_invocations,
            "lambda_gb_seconds": _rounded(self.lambda_gb_seconds),
            "s3_put_requests": self.s3_requests(S3_PUT),
            "s3_get_requests": self.s3_requests(S3_GET),
            "s3_free_requests": self.s3_requests(S3_FREE),
            "kms_requests": self.service_requests("kms"),
            "sfn_transitions": self.transitions,
            "sfn_express_requests": self.express_requests,
            "sfn_express_gb_seconds": _rounded(self.express_gb_seconds),
            "staged_bytes": self.staged_bytes,
            "stored_bytes": self.stored_bytes,
            "cpu_seconds": _rounded(self.cpu_seconds),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": {name: self.requests[name] for name in sorted(self.requests)},
            "lambda": {name: self.functions[name].to_json() for name in sorted(self.functions)},
            "stepfunctions": {
                "transitions": self.transitions,
                "express_requests": self.express_requests,
                "express_gb_seconds": _rounded(self.express_gb_seconds),
            },
            "bytes": {"staged": self.staged_bytes, "stored": self.stored_bytes},
            "cpu_seconds": _rounded(self.cpu_seconds),
        }

    @classmethod
    def from_json(cls, doc: Any, what: str = "usage") -> Usage:
        """Every field checked (ValueError naming it); the record's reader wraps it in its own error."""
        if not isinstance(doc, dict) or doc.keys() != _FIELDS:
            raise ValueError(f"{what} must be {{requests, lambda, stepfunctions, bytes, cpu_seconds}}")
        requests, functions, sfn, sizes = doc["requests"], doc["lambda"], doc["stepfunctions"], doc["bytes"]
        if not isinstance(requests, dict) or not all(isinstance(k, str) and ":" in k for k in requests):
            raise ValueError(f"{what}.requests must map service:Operation to counts")
        if not all(type(v) is int and v >= 0 for v in requests.values()):
            requests = {k: _count(v, f"{what}.requests.{k}") for k, v in requests.items()}  # raises, naming the first bad one
        if not isinstance(functions, dict):
            raise ValueError(f"{what}.lambda must map functions to their use")
        if not isinstance(sfn, dict) or sfn.keys() != _SFN_FIELDS:
            raise ValueError(f"{what}.stepfunctions must be {{transitions, express_requests, express_gb_seconds}}")
        if not isinstance(sizes, dict) or sizes.keys() != _BYTES_FIELDS:
            raise ValueError(f"{what}.bytes must be {{staged, stored}}")
        return cls(
            requests=dict(requests),
            functions={str(k): FunctionUse.from_json(v, f"{what}.lambda.{k}") for k, v in functions.items()},
            transitions=_count(sfn["transitions"], f"{what}.stepfunctions.transitions"),
            express_requests=_count(sfn["express_requests"], f"{what}.stepfunctions.express_requests"),
            express_gb_seconds=_amount(sfn["express_gb_seconds"], f"{what}.stepfunctions.express_gb_seconds"),
            staged_bytes=_count(sizes["staged"], f"{what}.bytes.staged"),
            stored_bytes=_count(sizes["stored"], f"{what}.bytes.stored"),
            cpu_seconds=_amount(doc["cpu_seconds"], f"{what}.cpu_seconds"),
        )
