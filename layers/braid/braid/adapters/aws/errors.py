"""One way to read an AWS error, one mapping to Braid's typed errors.

Every AWS adapter (S3, KMS, Step Functions, EventBridge, CloudFormation)
reads an error's code here and reports the failures all services share in
the same words: no credentials, no network, access denied, and throttling or
server errors that outlasted the client's retries (braid.adapters.aws.retries).
Each adapter adds only the codes that mean something particular for it
(S3's missing bucket, KMS's wrong key, Step Functions' missing state
machine) and picks the typed error, so the exit code says which part failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError, PartialCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from braid.errors import BackupError

ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "403",
        "Forbidden",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
    }
)
THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
    }
)
# Failures the client retries (or the conflict helper does) before one reaches a caller.
TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "ConditionalRequestConflict",
        "OperationAborted",
        "500",
        "502",
        "503",
        "504",
    }
)

# A service's own reading of a code and message; None leaves it to the common mapping.
Specific = Callable[[str, str], BackupError | None]


def error_code(exc: BaseException) -> str:
    """The service's error code, or the HTTP status when the body named none ("404" for a HEAD)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return ""


def http_status(exc: BaseException) -> int:
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def error_message(exc: BaseException) -> str:
    """The service's message, or the code when it sent none."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Message") or error_code(exc))
    return str(exc)


def is_unreachable(exc: BaseException) -> bool:
    """No answer from the service at all: DNS, TCP, TLS, a proxy, a timeout."""
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


def is_transient(exc: BaseException) -> bool:
    """A failure that another attempt may not see: throttling, server errors, dropped connections."""
    if is_unreachable(exc):
        return True
    code = error_code(exc)
    return code in THROTTLING_CODES or code in TRANSIENT_CODES or http_status(exc) >= 500


@dataclass(frozen=True)
class AwsCall:
    """What was asked of which service: the words a failure's one line is made of."""

    service: str  # as users know it: "S3", "KMS", "Step Functions"
    doing: str  # "writing s3://bucket/key"
    permission: str  # the IAM action(s) the caller's role needs for it
    advice: str = "run it again"  # what to do once the retries ran out


def aws_error(exc: BaseException, call: AwsCall, kind: type[BackupError], specific: Specific | None = None) -> BackupError:
    """One actionable line for a failed AWS call, as `kind` unless `specific` knows the code better."""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return kind(
            f"no AWS credentials found while {call.doing}: configure a profile, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an instance role"
        )
    if is_unreachable(exc):
        return kind(f"cannot reach {call.service} while {call.doing}: {exc}; check the network, proxy or AWS_ENDPOINT_URL")
    if not isinstance(exc, ClientError):
        return kind(f"error while {call.doing}: {exc}")
    code, message = error_code(exc), error_message(exc)
    if specific is not None:
        found = specific(code, message)
        if found is not None:
            return found
    if code in ACCESS_CODES:
        return kind(f"access denied while {call.doing}: the role needs {call.permission} on it ({message})")
    if code in THROTTLING_CODES:
        return kind(f"{call.service} kept throttling while {call.doing} ({code}) after retries; {call.advice}")
    if is_transient(exc):
        return kind(f"{call.service} kept failing while {call.doing} after retries: {code}: {message}")
    return kind(f"{call.service} refused {call.doing}: {code}: {message}")
