"""Names shared by the stack (infra/) and the code it runs: one place for each.

The CDK app imports these instead of repeating strings, so a renamed output,
environment variable or error name breaks a test, not a deployment. Nothing
here imports anything heavier than the standard library: the CDK app, the
agent and the Lambda handlers all load it.
"""

from __future__ import annotations

from enum import StrEnum

# -- stack outputs: what `braid init --stack NAME` reads ---------------------
OUTPUT_BUCKET = "RepositoryBucket"
OUTPUT_REPOSITORY = "RepositoryUrl"
OUTPUT_KEY = "DataKeyArn"
OUTPUT_STATE_MACHINE = "BackupStateMachineArn"
OUTPUT_VERIFY_STATE_MACHINE = "VerifyStateMachineArn"
OUTPUT_AGENT_POLICY = "AgentPolicyArn"
OUTPUT_AGENT_ROLE = "AgentRoleArn"
OUTPUT_RESTORE_ROLE = "RestoreRoleArn"
OUTPUT_AGENT_INSTANCE_PROFILE = "AgentInstanceProfileName"
OUTPUT_RESTORE_INSTANCE_PROFILE = "RestoreInstanceProfileName"
OUTPUT_OPERATOR_ROLE = "OperatorRoleArn"  # the role an operator assumes for `braid rekey` (and init)
# The bucket's Object Lock retention as MODE:DAYS (GOVERNANCE:30); only when the stack configures one.
# `braid init --stack` copies it into config.json: the hosts' writers and prune read it there.
OUTPUT_OBJECT_LOCK = "ObjectLock"
OUTPUT_PRUNE_STATE_MACHINE = "PruneStateMachineArn"
OUTPUT_COPY_ROLE = "CopyRoleArn"  # with braid:copyTo: the role the second repository's key (and bucket) policy must name

# -- the pipeline functions' environment --------------------------------------
ENV_BUCKET = "BRAID_BUCKET"  # the repository bucket
ENV_KMS_KEY_ID = "BRAID_KMS_KEY_ID"  # the customer-managed key (ARN) wrapping data keys
ENV_EVENT_BUS = "BRAID_EVENT_BUS"  # EventBridge bus for outcome events
ENV_WORKER_LANES = "BRAID_WORKER_LANES"  # ranged GETs a worker reads ahead with at once
ENV_WORKER_CONCURRENCY = "BRAID_WORKER_CONCURRENCY"  # the worker's reserved concurrency: the most a map may run at once
# MODE:DAYS of the stack's Object Lock (the same value as OUTPUT_OBJECT_LOCK); absent without one.
ENV_OBJECT_LOCK = "BRAID_OBJECT_LOCK"
ENV_PRUNE_STATE_MACHINE = "BRAID_PRUNE_STATE_MACHINE"  # the scheduled maintenance starts the prune there
# The stack-wide storage class policy CLASS:DAYS (braid.format.storage_class) PlanPrune applies to names
# whose stored policy sets none; absent without one. Set by the CDK context CONTEXT_STORAGE_CLASS.
ENV_STORAGE_CLASS = "BRAID_STORAGE_CLASS"
CONTEXT_STORAGE_CLASS = "braid:storageClass"
# The scheduled copy (CDK context braid:copyTo): the second repository, s3://BUCKET[/PREFIX], and the
# KMS key (ARN) its config.json names, which its copies' data keys are re-wrapped for.
COPY_CONTEXT = "braid:copyTo"
ENV_COPY_TO = "BRAID_COPY_TO"
ENV_COPY_KMS_KEY = "BRAID_COPY_KMS_KEY"
# The copy function's timeout (Lambda's most), and how long before it a run stops starting objects and
# leaves the backup it was copying unpublished for the next run (braid.ops.copy_pending): time for the
# objects in flight and the publishing of a backup whose objects are all there.
COPY_TIMEOUT_SECONDS = 900
COPY_STOP_SECONDS = 120
# Up to DEFAULT_WORKERS stored objects in memory at once, each up to CHUNKS_PER_PACK chunks.
COPY_MEMORY_MB = 3008
DEFAULT_COPY_SCHEDULE = "rate(15 minutes)"  # a run stops by COPY_TIMEOUT - COPY_STOP seconds: runs do not overlap
DEFAULT_EVENT_BUS = "default"
# Ranged GETs a worker keeps in flight reading ahead of its codec (braid.pipeline.item_flow): enough to
# feed the codec, with the packs' PUTs on the same NIC (figures: docs/design/2026-11-cloud-figures.md).
DEFAULT_WORKER_LANES = 4
# Chunks per stored object (a pack, docs/format.md) at most: the worker stores each run of consecutive
# chunks of its item as one create-only PUT (as even as possible, larger first: braid.format.staging.rounds.pack_sizes),
# so chunk PUTs cost about 1/k. Bounded by memory: two packs' frames wait in their chunk buffers for the
# PUT (braid.pipeline.item_flow.chunk_buffers, braid.agent.limits). An item of 32 chunks is 7 packs (5, 5, 5, 5, 4, 4, 4).
CHUNKS_PER_PACK = 5
# The worker's memory, chosen from `scripts/bench cloud-model`'s sensitivity table (which prices exactly what
# the stack deploys): at the published ~76 MB/s per function below 2 GB the worker is network-bound, so a GB-s
# less is cheaper with the same tail. The least memory whose budget holds the default 64 MiB chunks' buffers
# (braid.agent.limits: 256 MB + 18 x 64 MiB = 1,408 MB) plus one chunk of headroom: 1,472 MB, $0.551/TiB
# against $0.638 at 1,769 MB (0.86x), +0.1 s after stream end (docs/design/2026-11-28-worker-memory.md).
WORKER_MEMORY_MB = 1472
# The verify worker keeps 1,769 MB (one full vCPU) until its own peak is measured at less.
VERIFY_WORKER_MEMORY_MB = 1769
# The most worker invocations one map runs at once: every map's MaxConcurrency (--fan-out) is clamped to it.
# Reserving it is opt-in (CDK context braid:worker-concurrency=N reserves N and clamps to N): a reservation
# must leave the account 100 unreserved, so a default one would fail `cdk deploy` on accounts with a low
# Lambda quota (new accounts often start low). Either way it is the budget every running backup of the stack
# shares: each map runs its backup's share (braid.pipeline.account_budget), and a throttled invoke is retried
# with back-off (LAMBDA_THROTTLED).
DEFAULT_WORKER_CONCURRENCY = 500
# Seconds per worker attempt, and retries after the first: attempts x (timeout + Lambda's 10 s INIT, which
# runs outside the timeout) plus the backoffs (2 s doubling) and the throttle retry's must leave an EXPRESS
# child's 300 s a 30 s margin for scheduling (review 3, L6; tests/infra): 3 x (55 + 10) + (2 + 4) + 62 = 263 s
# <= 270 s. Two retries leave the throttle retry a minute of back-off (braid_infra.steps.WORKER_THROTTLE_RETRY).
# 55 s is 2.5x the model's longest item at the published 76 MB/s: 16 chunks of 64 MiB in and 0.54 of them
# out is 1.65 GB over the function's network, 21.9 s (scripts/bench_lib/scale_sim.item_seconds; max_timeout_fraction 0.40).
WORKER_TIMEOUT_SECONDS = 55
WORKER_RETRIES = 2
LAMBDA_INIT_SECONDS = 10  # "The Init phase is limited to 10 seconds" (Lambda, Understanding the execution environment lifecycle)
# The WAL worker (infra/braid_infra/wal_archive.py), which scripts/bench_lib/wal_model.py prices: it is network-bound
# (~76 MB/s below 2 GB whatever the memory), so a smaller function bills fewer GB-s per segment than a full vCPU would.
WAL_MEMORY_MB = 512
WAL_TIMEOUT_SECONDS = 120  # a full batch of 16 MiB segments, with S3's retries
# SQS messages (staged files or bundles) per invocation. AWS allows up to 10,000 for a standard queue with a batching
# window of up to 300 s (Lambda, "Lambda parameters for Amazon SQS event source mappings":
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-parameters.html); 10 is the p99's bound: a batch of
# bundles is processed one segment after another, 10 x 7 x 0.53 s (docs/design/wal-archive.md, "Synchronous
# wal-push's cost": a larger batch was weighed there and rejected).
WAL_BATCH_SIZE = 10
WAL_BATCH_WINDOW_SECONDS = 5  # the longest the first file of a batch waits for the batch to fill
# The WAL worker's policy `wal-pack` (braid.ops.wal_pack_process): a batch's whole segments of one directory stored as
# packs of up to WAL_PACK_FILES, one PUT and one KMS data key each. Off when the function's ENV_WAL_PACK is "off".
WAL_PACK_FILES = WAL_BATCH_SIZE
ENV_WAL_PACK = "BRAID_WAL_PACK"
# Its policy `worker-list-once` (braid.ops.wal_bundle_process): a batch's bundles share one LIST per directory ("off": one each).
ENV_WAL_LIST_ONCE = "BRAID_WAL_LIST_ONCE"
# Its policy `worker-overlap`: a second lane reads a pack's next staged file while the codec encodes this one ("off": turns).
ENV_WAL_OVERLAP = "BRAID_WAL_OVERLAP"
# `wal-push --async`'s policy `async-bundle` (braid.cli.wal_pusher): at a backlog, the ready segments of one slot
# (braid.format.wal_bundle.BUNDLE_FILES wide) staged in one PUT. Off when the pusher's environment sets it to "off".
ENV_WAL_BUNDLE = "BRAID_WAL_BUNDLE"
# The plain `wal-push`'s policy `sync-bundle` (braid.ops.wal_lookahead): at a backlog, the call stages its segment's ready
# slot-mates with it in one PUT, and the next calls find theirs in it. Off when the environment sets it to "off".
ENV_WAL_SYNC_BUNDLE = "BRAID_WAL_SYNC_BUNDLE"
# The host's policy `pipe-buffer` (braid.engine.pipe_buffer): the pipes a backup is read from and a restore written
# into get a 1 MiB kernel buffer. Off when the process's environment sets it to "off".
ENV_PIPE_BUFFER = "BRAID_PIPE_BUFFER"
# The host's policy `direct-restore` (braid.ops.pg_direct): `restore --pgdata` writes large files with O_DIRECT.
# Off when the process's environment sets it to "off".
ENV_DIRECT_RESTORE = "BRAID_DIRECT_RESTORE"
# The agent's policy `part-grouping` (braid.agent.limits.default_part_chunks): staging parts of several chunks after
# the first segment, as far as the RTT to S3 allows. Off when the agent's environment sets it to "off".
ENV_PART_GROUPING = "BRAID_PART_GROUPING"
EXPRESS_CHILD_SECONDS = 300
# The Plan function watches staging for half of this (braid.pipeline.pacing).
PLAN_TIMEOUT_SECONDS = 900
# Its memory: what it holds fits 128 MB (tests/cloud/test_scale_simulation.py), but its share of
# a vCPU is the CPU it spends after the stream ends (why 256: docs/design/2026-11-cloud-figures.md).
PLAN_MEMORY_MB = 256
# The agent's chunks in flight (`braid backup --concurrency`, braid.agent.limits: memory and part size follow).
DEFAULT_AGENT_CONCURRENCY = 11
# The execution input's stall window (`braid backup --stall-timeout`): no upload progress
# for this long and the planner gives the backup up; at least the planner's Wait.
DEFAULT_POLL_SECONDS = 15
DEFAULT_STALL_SECONDS = 3600
# Finalize reads a result record per map item, many at once; botocore's CPU per
# request is what it waits on, so it gets a full vCPU (it runs once per backup).
FINALIZE_MEMORY_MB = 1769

# The prune's map (braid.pipeline.sweep): each item deletes one slice of a
# removed backup's chunks (PRUNE_SLICE_CHUNKS: a LIST and a DeleteObjects per
# 1,000, ~10 s) or collects one leftover; attempts x (timeout + Lambda's Init) plus
# backoffs (2 s doubling) stay inside an EXPRESS child's 300 s (tests/infra checks).
SWEEP_TIMEOUT_SECONDS = 80
SWEEP_RETRIES = 2
PRUNE_SLICE_CHUNKS = 16384
PRUNE_MAX_CONCURRENCY = 20  # items at once: S3 deletes ~3,500 keys/s per prefix, each item is one backup's prefix
# Chunks per map item that moves a kept backup to another storage class (CopyObject onto itself, server-side):
# 50 chunks are at most 10 packs (CHUNKS_PER_PACK) of 64 MiB chunks, 3.2 GiB copied, inside one Sweep attempt
# (SWEEP_TIMEOUT_SECONDS) at S3's in-region copy rates (docs/design/2026-11-28-storage-classes.md).
MOVE_SLICE_CHUNKS = 50

# -- the backup execution's state: what PlanSegments returns into `$.plan` ------
# The Plan function writes these keys (braid.pipeline.plan.PlanStatus, functions/plan/app.py) and the state machine
# reads them by JSONPath (braid_infra.pipeline: plan_path); tests/infra checks every `$.plan.X` it reads is one of them.
# The cloud pipeline's optimisations, each a named policy with an off switch (`braid backup --no-policy NAME`):
# braid.pipeline.policies.Policies has exactly these fields (a test holds it); named here so the CLI's parser
# need not import the pipeline.
PIPELINE_POLICIES = ("cut_items", "sleep_until_woken", "results_index")


class PlanKey(StrEnum):
    STATUS = "status"  # a PlanState
    ROUND = "round"
    ITEMS_KEY = "items_key"  # repository-relative key of the round file
    ITEMS_OBJECT = "items_object"  # its full S3 key, for the Distributed Map's ItemReader
    ITEMS = "items"
    CHUNKS = "chunks"
    PLANNED_CHUNKS = "planned_chunks"
    IDLE_SECONDS = "idle_seconds"
    WAIT_SECONDS = "wait_seconds"  # WaitForSegments' wait, SleepUntilWoken's timeout
    WAKE_CHUNKS = "wake_chunks"
    WAKE_AFTER_SECONDS = "wake_after_seconds"
    WAKE_OBJECT = "wake_object"  # full S3 key of the wake record SleepUntilWoken writes
    CURSOR = "cursor"
    MAX_CONCURRENCY = "max_concurrency"  # the map's MaxConcurrency
    USAGE = "usage"


class PlanState(StrEnum):
    """`$.plan.status`: what the SegmentsReady? choice does next."""

    READY = "ready"  # map a round
    WAITING = "waiting"  # WaitForSegments
    SLEEPING = "sleeping"  # SleepUntilWoken
    HELD = "held"  # waiting for --resume (WaitForSegments)
    DONE = "done"  # Finalize


STATE_PLAN = "plan"  # the state's key PlanSegments (and Hold) write their result to


def plan_path(key: PlanKey) -> str:
    """The JSONPath of `key` in the backup execution's state."""
    return f"$.{STATE_PLAN}.{key}"


# The Hold state's payload: {HOLD_ENTRY: {"step": the failed state's name, "error": its caught error}, HOLD_STATE: the
# state}. The Plan function holds the backup because the state machine called it so, never by comparing ids.
HOLD_ENTRY = "hold"
HOLD_STATE = "state"

# -- the agent's environment ---------------------------------------------------
ENV_REPO = "BRAID_REPO"
ENV_KEY_FILE = "BRAID_KEY_FILE"

# -- observability (Powertools) ----------------------------------------------
SERVICE_NAME = "braid"  # POWERTOOLS_SERVICE_NAME, the metrics' "service" dimension
METRICS_NAMESPACE = "Braid"  # POWERTOOLS_METRICS_NAMESPACE
METRIC_VERIFY_FAILURES = "VerifyFailures"  # backups a verification found damaged or could not check (scheduled and cloud verify)
# One datapoint per published backup, per backup name: the freshness alarm ("no backup of NAME for H hours").
METRIC_BACKUP_PUBLISHED = "BackupPublished"
DIMENSION_BACKUP_NAME = "backup_name"
METRIC_BACKUPS_PRUNED = "BackupsPruned"
METRIC_BACKUPS_COPIED = "BackupsCopied"  # the scheduled copy: backups published in the second repository
METRIC_COPY_FAILURES = "CopyFailures"  # backups the scheduled copy could not copy (the copy function's Errors alarm fires too)
METRIC_LEFTOVERS_COLLECTED = "LeftoversCollected"
METRIC_PRUNE_FAILURES = "PruneFailures"  # map items that did not finish: their data waits for the next run
METRIC_OLDEST_STAGING_HOURS = "OldestStagingHours"  # the scheduled maintenance: age of the oldest backup still in staging
STAGING_ALARM_HOURS = 24  # a backup in staging longer than this is stuck (or held): someone should look

# -- outcome events (EventBridge) ----------------------------------------------
EVENT_SOURCE = "braid"
BACKUP_COMPLETED = "Backup Completed"
BACKUP_FAILED = "Backup Failed"
VERIFY_FAILED = "Verify Failed"
PRUNE_FAILED = "Prune Failed"

# -- engines, as manifests record them (docs/format.md) ------------------------
ENGINE_LOCAL = "local"
ENGINE_STEPFUNCTIONS = "stepfunctions"

# -- errors the state machine retries ------------------------------------------
# Lambda's own transient failures, as Step Functions names them.
LAMBDA_TRANSIENT_ERRORS = (
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
)
# Lambda throttled the invoke (the account's or the function's concurrency is used up): nothing ran, so
# it is retried on its own policy, longer than the transient errors' (braid_infra.steps).
LAMBDA_THROTTLED = "Lambda.TooManyRequestsException"
# Braid's typed error for S3 that kept failing past the client's retries
# (braid.errors.StorageError), and a worker that ran out of time.
# Pipeline errors after which a backup can never finish: the state machine sends them to Cleanup;
# any other failure after Prepare holds the backup for `braid backup --resume` (braid.pipeline.replan).
FINAL_PIPELINE_ERRORS = (
    "ExecutionMismatchError",  # not this execution's backup: Cleanup touches nothing
    "UsageError",  # an invalid execution input
    "StreamAbandonedError",  # the agent gave the stream up
    "BackupHeldError",  # held, and nobody resumed it in time
    "StagingStalledError",  # the agent stopped uploading before the stream ended
    "ProtocolMismatchError",  # the agent speaks another staging protocol than the deployed pipeline
)

WORKER_TRANSIENT_ERRORS = (*LAMBDA_TRANSIENT_ERRORS, "StorageError", "Sandbox.Timedout")
