"""Functions: the pipeline Lambdas, each with its own least-privilege role.

All arm64 (Graviton: cheaper per GB-s and as fast for zstd/AES here), one
shared layer, Powertools configured through the environment, X-Ray active.

Memory: the worker gets contract.WORKER_MEMORY_MB (1,472 MB), chosen from the
cost model's sensitivity table: at Lambda's published network rate it is
network-bound, so less memory bills fewer GB-s for the same seconds; its
bytes (the chunks it reads ahead, two packs' frames and its encoders'
buffers: ~1,125 MB process peak with 64 MiB chunks, scripts/bench
pack-memory) fit with headroom. The verify worker keeps 1,769 MB. The
coordinating functions (prepare, plan, cleanup) move only small JSON and get 256 MB.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from braid import contract
from braid.format.storage_class import StoragePolicy
from braid_infra.keys import Keys
from braid_infra.layer import ARCHITECTURE, RUNTIME
from braid_infra.storage import (
    CATALOG_INDEX_OBJECTS,
    CATALOG_LOG_OBJECTS,
    CATALOG_OBJECTS,
    CONFIG,
    DATA_OBJECTS,
    FAILURE_OBJECTS,
    MANIFEST_OBJECTS,
    METADATA_OBJECTS,
    POLICY_OBJECTS,
    PRICES,
    PRUNE_OBJECTS,
    REKEY_OBJECTS,
    RESULT_OBJECTS,
    STAGING_OBJECTS,
    STORAGE_OBJECTS,
    SUMMARY_OBJECTS,
    VERIFY_OBJECTS,
    VERIFY_RUN_OBJECTS,
    WAL_FILE_OBJECTS,
    WAL_HISTORY_OBJECTS,
    WAL_RECORDS,
    Storage,
)

FUNCTIONS_DIR = Path(__file__).resolve().parents[2] / "functions"
WORKER_LANES = contract.DEFAULT_WORKER_LANES


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    memory: int
    timeout: Duration
    description: str


SPECS = {
    "prepare": FunctionSpec("prepare", 256, Duration.seconds(60), "Braid Prepare: make and stage the backup's data key"),
    # Each call watches staging for up to braid.pipeline.pacing.WATCH_SECONDS (420 s): half this timeout.
    "plan": FunctionSpec("plan", contract.PLAN_MEMORY_MB, Duration.seconds(contract.PLAN_TIMEOUT_SECONDS), "Braid Plan: completed staging segments to map rounds"),
    # EXPRESS child workflows end at 5 minutes: every attempt of the worker, and the
    # backoff between them, must fit (braid_infra.pipeline.WORKER_RETRY, checked in tests/infra).
    "worker": FunctionSpec(
        "worker", contract.WORKER_MEMORY_MB, Duration.seconds(contract.WORKER_TIMEOUT_SECONDS), "Braid Worker: compress, encrypt and store a few chunks"
    ),
    "finalize": FunctionSpec("finalize", contract.FINALIZE_MEMORY_MB, Duration.minutes(15), "Braid Finalize: check chunks, publish the manifest, drop staging"),
    "cleanup": FunctionSpec("cleanup", 256, Duration.minutes(15), "Braid Cleanup: abort uploads, remove partial backup data"),
    # The verify state machine (braid_infra.verify_pipeline). The planner runs a quick verify itself
    # (a LIST and a HEAD per chunk, 32 at once): I/O, not CPU.
    "verifyplan": FunctionSpec("verifyplan", 1024, Duration.minutes(15), "Braid verify planner: pick the chunks to check; quick verify"),
    # Deep checks decrypt and decompress: CPU-bound as the backup worker, in the same EXPRESS 5 minutes.
    "verifyworker": FunctionSpec(
        "verifyworker", contract.VERIFY_WORKER_MEMORY_MB, Duration.seconds(contract.WORKER_TIMEOUT_SECONDS), "Braid verify worker: deep-check a few chunks"
    ),
    "verifyrecord": FunctionSpec("verifyrecord", 512, Duration.minutes(5), "Braid verify recorder: verify records, events, metric"),
    # The scheduled maintenance only starts the prune run (its planner distrusts failed verifications).
    "verify": FunctionSpec("verify", 256, Duration.minutes(1), "Braid scheduled maintenance: starts the prune run"),
    # The prune state machine (braid_infra.prune_pipeline). PlanPrune authenticates the
    # manifests its plan keeps or removes (a few MB each at TiB sizes), many at once.
    "prune": FunctionSpec("prune", 1769, Duration.minutes(15), "Braid Prune planner: judge retention from the catalog, remove manifests first"),
    # Sweep items retry inside their EXPRESS child's 5 minutes (contract.SWEEP_*, checked in tests/infra).
    "sweep": FunctionSpec("sweep", 256, Duration.seconds(contract.SWEEP_TIMEOUT_SECONDS), "Braid Sweep: delete a slice of a pruned backup, or a leftover"),
    "tally": FunctionSpec("tally", 512, Duration.minutes(15), "Braid Prune tally: report the prune run, refresh the catalog snapshot"),
}


class PipelineFunctions(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        keys: Keys,
        layer: lambda_.ILayerVersion,
        worker_concurrency: int | None = None,
        storage_class: StoragePolicy | None = None,
    ) -> None:
        """`worker_concurrency`: reserved for the worker, and every map clamped to it; None reserves
        nothing and clamps maps to contract.DEFAULT_WORKER_CONCURRENCY. `storage_class`: the stack's
        default for moving old backups' chunks (braid:storageClass), which only PlanPrune reads."""
        super().__init__(scope, construct_id)
        self.storage = storage
        self.keys = keys
        self.worker_concurrency = worker_concurrency
        environment = {
            contract.ENV_BUCKET: storage.bucket.bucket_name,
            contract.ENV_KMS_KEY_ID: keys.key.key_arn,
            contract.ENV_EVENT_BUS: contract.DEFAULT_EVENT_BUS,
            contract.ENV_WORKER_LANES: str(WORKER_LANES),
            contract.ENV_WORKER_CONCURRENCY: str(worker_concurrency or contract.DEFAULT_WORKER_CONCURRENCY),
            "POWERTOOLS_SERVICE_NAME": contract.SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": contract.METRICS_NAMESPACE,
            "POWERTOOLS_LOG_LEVEL": "INFO",
        }
        if storage.object_lock is not None:
            # Every chunk and manifest the functions write carries it (braid.adapters.aws.lambda_env.object_lock).
            environment[contract.ENV_OBJECT_LOCK] = str(storage.object_lock)
        self.functions: dict[str, lambda_.Function] = {}
        self.roles: dict[str, iam.Role] = {}
        self._environment = environment
        self._layer = layer
        for spec in SPECS.values():
            self._add(spec, environment, layer)
        if storage_class is not None:
            self.functions["prune"].add_environment(contract.ENV_STORAGE_CLASS, str(storage_class))
        self._grant()

    def add(self, spec: FunctionSpec, environment: dict[str, str]) -> tuple[lambda_.Function, iam.Role]:
        """A function the stack has only when configured (the scheduled copy): the shared environment
        plus `environment`, its own role with only its log group; the caller grants the rest."""
        self._add(spec, {**self._environment, **environment}, self._layer)
        return self.functions[spec.name], self.roles[spec.name]

    def __getitem__(self, name: str) -> lambda_.Function:
        return self.functions[name]

    def pinned(self, name: str) -> lambda_.IVersion:
        """The function's version published with this deploy: what the state machines invoke.

        An execution keeps the definition it started with, so naming a version (not
        $LATEST, not an alias a deploy moves) makes a backup that runs for days finish on
        the code it started with. Old versions are retained: executions still running
        invoke them after the next deploy.
        """
        return self.functions[name].current_version

    def _add(self, spec: FunctionSpec, environment: dict[str, str], layer: lambda_.ILayerVersion) -> None:
        title = spec.name.capitalize()
        log_group = logs.LogGroup(
            self, f"{title}Logs", retention=logs.RetentionDays.THREE_MONTHS, removal_policy=RemovalPolicy.DESTROY
        )
        role = iam.Role(self, f"{title}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=spec.description)
        role.add_to_policy(
            iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[f"{log_group.log_group_arn}:*"])
        )
        function = lambda_.Function(
            self,
            title,
            description=spec.description,
            code=lambda_.Code.from_asset(str(FUNCTIONS_DIR / spec.name), exclude=["__pycache__", "*.pyc"]),
            handler="app.handler",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            layers=[layer],
            memory_size=spec.memory,
            timeout=spec.timeout,
            role=role,
            log_group=log_group,
            tracing=lambda_.Tracing.ACTIVE,
            environment=environment,
            reserved_concurrent_executions=self.worker_concurrency if spec.name == "worker" else None,
            current_version_options=lambda_.VersionOptions(removal_policy=RemovalPolicy.RETAIN),
        )
        self.functions[spec.name] = function
        self.roles[spec.name] = role

    def _s3(self, name: str, actions: list[str], *patterns: str) -> None:
        self.roles[name].add_to_policy(iam.PolicyStatement(actions=actions, resources=[self.storage.arn(p) for p in patterns]))

    def _retention(self, name: str, pattern: str) -> None:
        """Under Object Lock, a PUT carrying a retention date also needs s3:PutObjectRetention (no grant without a lock)."""
        if self.storage.object_lock is not None:
            self._s3(name, ["s3:PutObjectRetention"], pattern)

    def _list(self, name: str) -> None:
        """Unconditional: without s3:ListBucket S3 answers 403, not 404, for a missing key,
        and the steps must tell "not there yet" from "denied". Key names carry no content."""
        self.roles[name].add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.storage.bucket.bucket_arn]))

    def _list_versions(self, name: str) -> None:
        """Plan, Finalize and Cleanup purge the versions of staging objects (raw database bytes)."""
        self.roles[name].add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucketVersions"],
                resources=[self.storage.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [self.storage.prefix_pattern(STAGING_OBJECTS)]}},
            )
        )

    def _events(self, name: str) -> None:
        stack = self.storage.bucket.stack
        self.roles[name].add_to_policy(
            iam.PolicyStatement(
                actions=["events:PutEvents"],
                resources=[f"arn:{stack.partition}:events:{stack.region}:{stack.account}:event-bus/default"],
            )
        )

    def _uploads(self, name: str) -> None:
        self.roles[name].add_to_policy(
            iam.PolicyStatement(actions=["s3:ListBucketMultipartUploads"], resources=[self.storage.bucket.bucket_arn])
        )
        self._s3(name, ["s3:AbortMultipartUpload"], STAGING_OBJECTS)

    def _grant(self) -> None:
        # Prepare: read the session and the repository config, stage the wrapped key.
        self._s3("prepare", ["s3:GetObject"], CONFIG, STAGING_OBJECTS)
        self._s3("prepare", ["s3:PutObject"], STAGING_OBJECTS)
        self._list("prepare")
        self.keys.allow_generate(self.roles["prepare"])
        # ...and, for an incremental, open its parent's chain (manifests, each link's data key under that backup's own
        # encryption context) and read the parent's metadata, for the agent's {parent_manifest} / {parent_lsn}
        # (braid.pipeline.parent). Never chunks: the metadata objects only.
        self._s3("prepare", ["s3:GetObject"], MANIFEST_OBJECTS, METADATA_OBJECTS)
        self.keys.allow_decrypt(self.roles["prepare"])
        # Plan: read staging records, write plan rounds; delete segments whose chunks are
        # all stored and its own hold record (braid.pipeline.replan). Never data or manifests.
        self._s3("plan", ["s3:GetObject"], STAGING_OBJECTS)
        self._s3("plan", ["s3:PutObject", "s3:DeleteObject"], STAGING_OBJECTS)
        self._list("plan")
        # ...by version id, so the versioned bucket keeps no noncurrent copy of raw bytes (StagingArea.remove_segments).
        self._s3("plan", ["s3:DeleteObjectVersion"], STAGING_OBJECTS)
        self._list_versions("plan")
        # Worker: ranged GETs of staging, create-only chunk PUTs, its item's result or failure record: no other
        # staging object (never a segment, a round or a record of the agent's).
        self._s3("worker", ["s3:GetObject"], STAGING_OBJECTS, DATA_OBJECTS)
        self._s3("worker", ["s3:PutObject"], DATA_OBJECTS, RESULT_OBJECTS, FAILURE_OBJECTS)
        self._retention("worker", DATA_OBJECTS)
        self._list("worker")
        self.keys.allow_decrypt(self.roles["worker"])
        # Finalize: read everything it checks, publish the manifest, delete staging.
        self._s3("finalize", ["s3:GetObject"], CONFIG, STAGING_OBJECTS, DATA_OBJECTS, MANIFEST_OBJECTS)
        self._s3("finalize", ["s3:PutObject"], MANIFEST_OBJECTS, METADATA_OBJECTS)
        self._retention("finalize", METADATA_OBJECTS)
        self._retention("finalize", MANIFEST_OBJECTS)
        self._s3("finalize", ["s3:DeleteObject", "s3:DeleteObjectVersion"], STAGING_OBJECTS)
        # ...and withdraw a manifest it published whose read-back check failed (finalize_backup).
        self._s3("finalize", ["s3:DeleteObject"], MANIFEST_OBJECTS)
        # ...with the backup's catalog summary and log marker, written before the manifest (braid.ops.catalog).
        self._s3("finalize", ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], CATALOG_OBJECTS)
        # ...and, under Object Lock, keep the history file of a backup's timeline as long as the backup before publishing it
        # (braid.ops.wal_history_lock): its date by a HEAD (s3:GetObject, with s3:GetObjectRetention for the date), then a
        # longer one (s3:PutObjectRetention; never s3:BypassGovernanceRetention), on history files only.
        if self.storage.object_lock is not None:
            self._s3("finalize", ["s3:GetObject", "s3:GetObjectRetention", "s3:PutObjectRetention"], WAL_HISTORY_OBJECTS)
        self._list("finalize")
        self._list_versions("finalize")
        self._uploads("finalize")
        self._events("finalize")
        self.keys.allow_decrypt(self.roles["finalize"])
        # Cleanup: never publishes and never decrypts; removes a failed backup's data.
        self._s3("cleanup", ["s3:GetObject"], MANIFEST_OBJECTS, STAGING_OBJECTS)
        self._s3("cleanup", ["s3:DeleteObject"], STAGING_OBJECTS, DATA_OBJECTS)
        self._s3("cleanup", ["s3:DeleteObjectVersion"], STAGING_OBJECTS)
        self._list("cleanup")
        self._list_versions("cleanup")
        self._uploads("cleanup")
        self._events("cleanup")
        # PlanVerify: read manifests (authenticated: decrypt), chunks' size and checksum (HEAD), earlier
        # verify records (the rotation's part); write the run's plan and items. Never writes data or records.
        self._s3("verifyplan", ["s3:GetObject"], CONFIG, MANIFEST_OBJECTS, DATA_OBJECTS, VERIFY_OBJECTS)
        self._s3("verifyplan", ["s3:PutObject"], VERIFY_RUN_OBJECTS)
        self._list("verifyplan")
        self.keys.allow_decrypt(self.roles["verifyplan"])
        # VerifyWorker: reads and decrypts; writes nothing at all (no byte leaves the worker).
        self._s3("verifyworker", ["s3:GetObject"], CONFIG, MANIFEST_OBJECTS, DATA_OBJECTS)
        self._list("verifyworker")
        self.keys.allow_decrypt(self.roles["verifyworker"])
        # RecordVerify: read the run's plan and the map's results, write the records, drop the run's work.
        self._s3("verifyrecord", ["s3:GetObject", "s3:DeleteObject"], VERIFY_RUN_OBJECTS)
        self._s3("verifyrecord", ["s3:PutObject"], VERIFY_OBJECTS)
        self._list("verifyrecord")
        self._events("verifyrecord")
        # Verify (the scheduled maintenance) reads no object: it lists staging/'s prefixes (the age of
        # the oldest staged backup) and starts the prune state machine (braid_infra.prune_pipeline grants that).
        self._list("verify")
        # PlanPrune: judge from the catalog, stored policies and verify records (a failed one is
        # distrusted), authenticate manifests, then take each pruned backup out of the catalog (marker,
        # summary) and delete its manifest (and any rekey copy, and its verify records); writes the
        # run's plan and items. Never data: that is Sweep's.
        # It also plans storage class moves: the price table prices early deletions; a pruned backup's storage records go with it.
        self._s3("prune", ["s3:GetObject"], CONFIG, MANIFEST_OBJECTS, CATALOG_OBJECTS, POLICY_OBJECTS, VERIFY_OBJECTS, PRICES)
        self._s3("prune", ["s3:PutObject"], CATALOG_LOG_OBJECTS, PRUNE_OBJECTS)
        self._s3("prune", ["s3:DeleteObject"], MANIFEST_OBJECTS, REKEY_OBJECTS, SUMMARY_OBJECTS, VERIFY_OBJECTS, STORAGE_OBJECTS)
        # ...then the archived WAL no kept backup needs (braid.ops.wal_retention): it reads each archive's record, deletes
        # files and packs in segment directories only (never archive.json, never a history file), and, under Object Lock,
        # reads each one's retention first (HEAD: s3:GetObject, with s3:GetObjectRetention for the date) so a locked one is not hidden.
        self._s3("prune", ["s3:GetObject"], WAL_RECORDS)
        self._s3("prune", ["s3:DeleteObject"], WAL_FILE_OBJECTS)
        if self.storage.object_lock is not None:
            self._s3("prune", ["s3:GetObject", "s3:GetObjectRetention"], WAL_FILE_OBJECTS)
        self._list("prune")
        self._events("prune")
        self.keys.allow_decrypt(self.roles["prune"])
        # Sweep: look for a manifest (HEAD), read leases, delete data and staging, and a
        # leftover's summary; write its result record. No key: it never reads a chunk.
        self._s3("sweep", ["s3:GetObject"], MANIFEST_OBJECTS, DATA_OBJECTS, STAGING_OBJECTS)
        self._s3("sweep", ["s3:DeleteObject"], DATA_OBJECTS, STAGING_OBJECTS, SUMMARY_OBJECTS)
        # ...staging as Cleanup removes it: open uploads aborted, versions purged (no raw bytes kept as noncurrent versions).
        self._s3("sweep", ["s3:DeleteObjectVersion"], STAGING_OBJECTS)
        self._list_versions("sweep")
        self._uploads("sweep")
        self._s3("sweep", ["s3:PutObject"], PRUNE_OBJECTS)
        # ...and move a kept backup's chunks to another storage class: CopyObject onto itself is a GET of the
        # source and a PUT of the copy, which the bucket policy allows under data/ only as a class change.
        self._s3("sweep", ["s3:PutObject"], DATA_OBJECTS)
        self._retention("sweep", DATA_OBJECTS)
        if self.storage.object_lock is not None:  # the moved version keeps the original's date: HEAD returns it only with this
            self._s3("sweep", ["s3:GetObjectRetention"], DATA_OBJECTS)
        self._list("sweep")
        # TallyPrune: read the run's records, write its report and delete the rest; fold the
        # catalog log into a snapshot (reading summaries, or manifests where one is missing)
        # and collect superseded snapshots and log days. No key: the catalog needs none.
        self._s3("tally", ["s3:GetObject"], CONFIG, MANIFEST_OBJECTS, CATALOG_OBJECTS, PRUNE_OBJECTS)
        self._s3("tally", ["s3:PutObject", "s3:DeleteObject"], CATALOG_INDEX_OBJECTS, CATALOG_LOG_OBJECTS, PRUNE_OBJECTS)
        self._s3("tally", ["s3:PutObject"], STORAGE_OBJECTS)  # a record per backup whose chunks all moved
        self._list("tally")
        self._events("tally")
