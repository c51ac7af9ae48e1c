"""CopySchedule: copies to a second repository on a schedule, from the stack, without a host (`braid:copyTo`).

Configured by the `copy_to` prop, else the CDK context `braid:copyTo` (a
JSON object, or its text):

    cdk deploy -c 'braid:copyTo={"repo": "s3://braid-dr-bucket/prod", "kms_key": "arn:aws:kms:eu-west-1:111122223333:key/..."}'

- `repo`: the second repository, `s3://BUCKET[/PREFIX]`, made first with
  `braid init` (another region's or account's Braid stack, or any bucket);
- `kms_key`: the KMS key ARN its config.json names: each copy's data key
  is re-wrapped for it (braid.ops.copy);
- `schedule`: an EventBridge expression, default
  contract.DEFAULT_COPY_SCHEDULE (`rate(15 minutes)`).

By default there is none. The Copy function (functions/copy) copies every
backup the second repository is missing (braid.ops.copy_pending), stops
before Lambda's 15 minutes and leaves the backup it was copying
unpublished for the next run. Its role reads the source repository
(config, manifests, chunks), writes only the second one's chunks,
manifests and catalog (and withdraws a manifest whose read-back failed),
and uses only the two keys, each with the Braid encryption context. The
second repository's own key policy (and its bucket policy, in another
account) must grant the role too: docs/cloud.md, A lost region or account.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from braid import contract
from braid_infra.functions import FunctionSpec, PipelineFunctions
from braid_infra.keys import CONTEXT_CONDITION, Keys
from braid_infra.storage import CATALOG_OBJECTS, CONFIG, DATA_OBJECTS, MANIFEST_OBJECTS, Storage, key_prefix

SPEC = FunctionSpec(
    "copy", contract.COPY_MEMORY_MB, Duration.seconds(contract.COPY_TIMEOUT_SECONDS), "Braid Copy: copy backups to the second repository (braid:copyTo)"
)
_REPO = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/([^\s]*))?")
_KEY = re.compile(r"arn:aws[\w-]*:kms:[a-z0-9-]+:\d{12}:key/[\w-]+")
_EXPRESSION = re.compile(r"(cron|rate)\(.+\)")
_FIELDS = {"repo", "kms_key", "schedule"}


@dataclass(frozen=True)
class CopySetting:
    bucket: str
    prefix: str
    kms_key: str
    schedule: str = contract.DEFAULT_COPY_SCHEDULE

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def copy_setting(value: Any) -> CopySetting | None:
    """The scheduled copy from a prop or context value (None, "": none); a bad value fails synth."""
    if value is None or value == "":
        return None
    example = f'e.g. {{"repo": "s3://BUCKET/PREFIX", "kms_key": "arn:aws:kms:REGION:ACCOUNT:key/ID"}}, not {value!r}'
    try:
        doc = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise ValueError(f"{contract.COPY_CONTEXT}: not JSON; {example}") from None
    if not isinstance(doc, Mapping) or set(doc) - _FIELDS or not {"repo", "kms_key"} <= set(doc):
        raise ValueError(f"{contract.COPY_CONTEXT}: an object with repo, kms_key and optionally schedule; {example}")
    repo, key, schedule = doc["repo"], doc["kms_key"], doc.get("schedule", contract.DEFAULT_COPY_SCHEDULE)
    found = _REPO.fullmatch(repo) if isinstance(repo, str) else None
    if found is None:
        raise ValueError(f"{contract.COPY_CONTEXT}: repo is s3://BUCKET[/PREFIX] (the scheduled copy runs in Lambda: no directory), not {repo!r}")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"{contract.COPY_CONTEXT}: kms_key is the key's ARN (arn:aws:kms:REGION:ACCOUNT:key/ID), not {key!r}")
    if not isinstance(schedule, str) or not _EXPRESSION.fullmatch(schedule):
        raise ValueError(f"{contract.COPY_CONTEXT}: schedule is an EventBridge expression, rate(15 minutes) or cron(...), not {schedule!r}")
    return CopySetting(found.group(1), (found.group(2) or "").strip("/"), key, schedule)


class CopySchedule(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, setting: CopySetting, storage: Storage, keys: Keys, functions: PipelineFunctions,
        repository_prefix: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.setting = setting
        self.function, self.role = functions.add(SPEC, {contract.ENV_COPY_TO: setting.url, contract.ENV_COPY_KMS_KEY: setting.kms_key})
        # A failed run is retried by the next scheduled one, never twice at once (async retries would overlap it).
        self.function.configure_async_invoke(retry_attempts=0)
        self._grant(storage, keys)
        self.rule = events.Rule(
            self, "Schedule", description=f"Braid: copy new backups to {setting.url}", schedule=events.Schedule.expression(setting.schedule)
        )
        self.rule.add_target(
            targets.LambdaFunction(self.function, event=events.RuleTargetInput.from_object({"prefix": repository_prefix}), retry_attempts=2)
        )

    def _grant(self, storage: Storage, keys: Keys) -> None:
        role, setting = self.role, self.setting
        partition = Stack.of(self).partition
        bucket = f"arn:{partition}:s3:::{setting.bucket}"
        base = f"{bucket}/{key_prefix(setting.prefix)}"

        def allow(actions: list[str], resources: list[str], conditions: dict[str, Any] | None = None) -> None:
            role.add_to_policy(iam.PolicyStatement(actions=actions, resources=resources, conditions=conditions))

        # The source: read what a copy reads (braid.ops.copy), write nothing.
        allow(["s3:GetObject"], [storage.arn(p) for p in (CONFIG, MANIFEST_OBJECTS, DATA_OBJECTS)])
        allow(["s3:ListBucket"], [storage.bucket.bucket_arn])
        # The second repository: its config and manifests (a copy already there opens under its key),
        # create-only chunks and manifests (with the bucket's Object Lock retention when it has one), the
        # catalog summary and marker, and withdrawing a manifest and its catalog records whose check failed.
        allow(["s3:GetObject"], [f"{base}{CONFIG}", f"{base}{MANIFEST_OBJECTS}"])
        allow(["s3:PutObject", "s3:PutObjectRetention"], [f"{base}{DATA_OBJECTS}", f"{base}{MANIFEST_OBJECTS}"])
        allow(["s3:PutObject", "s3:DeleteObject"], [f"{base}{CATALOG_OBJECTS}"])
        allow(["s3:DeleteObject"], [f"{base}{MANIFEST_OBJECTS}"])
        allow(["s3:ListBucket"], [bucket])
        # Keys: the stack's unwraps and re-encrypts from (its key policy names the role); the second
        # repository's re-encrypts to (same region), or encrypts (another region), and unwraps to check.
        keys.allow_copy_from(role)
        allow(["kms:Decrypt", "kms:ReEncryptTo", "kms:Encrypt"], [setting.kms_key], CONTEXT_CONDITION)


def add_copy_schedule(
    scope: Construct, *, value: Any, storage: Storage, keys: Keys, functions: PipelineFunctions, repository_prefix: str
) -> CopySchedule | None:
    """The stack's CopySchedule when `braid:copyTo` (or the prop) configures one."""
    setting = copy_setting(value if value is not None else scope.node.try_get_context(contract.COPY_CONTEXT))
    if setting is None:
        return None
    return CopySchedule(scope, "CopySchedule", setting=setting, storage=storage, keys=keys, functions=functions, repository_prefix=repository_prefix)

