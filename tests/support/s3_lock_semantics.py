"""S3 Object Lock as AWS applies it, where moto (5.2.5) differs and Braid depends on it.

moto keeps what Braid relies on as AWS does: a PUT with retention needs
Content-MD5 or an SDK checksum and a bucket with Object Lock; a DELETE
without a version id leaves a delete marker over a locked object; a DELETE
of a locked version is refused, a GOVERNANCE one allowed with
x-amz-bypass-governance-retention (the permission that takes,
s3:BypassGovernanceRetention, is support.emulated_iam's to check, as is
s3:PutObjectRetention for a PUT with retention).

One difference matters: moto stores any retain-until date, one in the past
included, where AWS refuses a PutObject whose
x-amz-object-lock-retain-until-date is not in the future (400
InvalidArgument; "Using S3 Object Lock": a retain-until date must lie in
the future). Braid's writers never send one (braid.format.lock retains a
late write a day from now instead), and with `AwsObjectLock` installed a
regression there fails the PUT here as it would on AWS instead of passing
unseen. PutObjectRetention likewise: moto sets any date and mode, where AWS
refuses a date not in the future (400 InvalidArgument), and a date earlier
than the version's own (403 AccessDenied: in COMPLIANCE always, in
GOVERNANCE without x-amz-bypass-governance-retention), as it refuses a
COMPLIANCE version turned GOVERNANCE ("Using S3 Object Lock": a compliance
retention can be lengthened, never shortened), so a writer that shortened a
date fails here as it would there. It patches this process's moto (a test's in-process moto, a
ThreadedMotoServer in this process, the emulated cloud's server).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import xmltodict
from moto.s3.exceptions import AccessDeniedByLock, InvalidArgumentError
from moto.s3.responses import S3Response

_original = S3Response._get_lock_details
_original_retention = S3Response.put_object_retention


def _parse(text: str) -> datetime | None:
    for form in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(text, form).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def _get_lock_details(self: Any, bucket: Any, lock_enabled: bool) -> tuple[str | None, str | None, str | None]:
    named = self.headers.get("x-amz-object-lock-retain-until-date")
    if named:
        until = _parse(named)
        if until is None or until <= datetime.now(UTC):
            raise InvalidArgumentError("The retain until date must be in the future!", "x-amz-object-lock-retain-until-date", named)
    return _original(self, bucket, lock_enabled)


def _put_object_retention(self: Any) -> Any:
    retention = xmltodict.parse(self.body).get("Retention") or {}
    mode, named = retention.get("Mode"), retention.get("RetainUntilDate")
    until = _parse(named) if named else None
    if named and (until is None or until <= datetime.now(UTC)):
        raise InvalidArgumentError("The retain until date must be in the future!", "RetainUntilDate", named)
    key = self.backend.get_object(self.bucket_name, self.parse_key_name(), version_id=self._get_param("versionId"))
    held = _parse(key.lock_until) if key is not None and key.lock_until else None
    if held is not None and held > datetime.now(UTC):
        bypass = self.headers.get("x-amz-bypass-governance-retention", "").lower() == "true"
        shorter = until is None or until < held or (key.lock_mode == "COMPLIANCE" and mode != "COMPLIANCE")
        if shorter and (key.lock_mode == "COMPLIANCE" or not bypass):
            raise AccessDeniedByLock
    return _original_retention(self)


class AwsObjectLock:
    """Install (and uninstall) the patch; also a context manager."""

    def install(self) -> AwsObjectLock:
        S3Response._get_lock_details = _get_lock_details  # type: ignore[method-assign]
        S3Response.put_object_retention = _put_object_retention  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        S3Response._get_lock_details = _original  # type: ignore[method-assign]
        S3Response.put_object_retention = _original_retention  # type: ignore[method-assign]

    def __enter__(self) -> AwsObjectLock:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
