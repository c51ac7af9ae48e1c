"""`braid backup` and `braid status`: run a backup through the repository's engine, and follow a cloud one.

The repository's config picks the engine (a pipeline named in it, or this
machine), so both commands print the same outcome either way: NAME@ID on
stdout once the backup is published, or one error line.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from braid.cli.budget import check_backup_memory
from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.progress import Progress
from braid.cli.sizes import MAX_CHUNK, MIN_CHUNK, default_chunk_size, format_size, parse_size
from braid.engine.gate import stream_gate
from braid.engine.port import BackupEngine, BackupRequest
from braid.engine.stream import sources_from_args
from braid.errors import BackupError, ExecutionError, NotFoundError, UsageError
from braid.format.chain import Lineage
from braid.format.ids import BackupRef, validate_name
from braid.format.labels import labels_of
from braid.format.repository import Repository
from braid.ports.progress import ProgressFn

if TYPE_CHECKING:
    from braid.engine.capture import Captured
    from braid.engine.producer import Producer
    from braid.engine.stream import InputSource
    from braid.format.manifest import Manifest
    from braid.ops.open import OpenedBackup

_CLOUD_ONLY = ("concurrency", "fan_out", "no_wait", "stall_timeout", "resume")


def _uses_pipeline(repository: Repository, args: argparse.Namespace) -> bool:
    """`--engine`, else the repository's config: a pipeline named in it, or this machine."""
    engine = getattr(args, "engine", None)
    if engine == "stepfunctions" and not repository.config.cloud:
        raise UsageError(f"--engine stepfunctions: repository {repository.url} has no pipeline (made without 'braid init --stack')")
    return bool(repository.config.cloud) and engine != "local"


def _engine_for(repository: Repository, args: argparse.Namespace) -> BackupEngine:
    """The cloud pipeline, or this machine (`--engine local`, or a repository without one)."""
    if _uses_pipeline(repository, args):
        from braid.adapters.aws.wiring import cloud_engine

        args.rate_limit_bytes = parse_size(args.rate_limit) if args.rate_limit else None
        if args.rate_limit_bytes == 0:
            raise UsageError("--rate-limit must be more than 0")
        return cloud_engine(repository, args)
    typed = getattr(args, "typed", _CLOUD_ONLY)  # set in the environment or a config file for every run, they are ignored here
    given = [f"--{name.replace('_', '-')}" for name in _CLOUD_ONLY if getattr(args, name) and name in typed]
    if given:
        where = "the cloud pipeline, not --engine local" if repository.url.startswith("s3://") else "s3:// repositories"
        raise UsageError(f"{given[0]} applies only to {where}" if len(given) == 1 else f"{', '.join(given)}: each applies only to {where}")
    from braid.engine.local import LocalEngine

    requests = None
    if repository.url.startswith("s3://") or repository.config.key.get("type") == "kms":  # billed per request: counted
        from braid.adapters.aws.clients import process_requests

        requests = process_requests
    return LocalEngine(repository, open_key_service(repository, args.key_file, strict=args.strict_permissions), requests)


def _backup_ref(args: argparse.Namespace) -> BackupRef:
    """A new NAME@ID, or the interrupted one `--resume` continues."""
    if args.resume:
        ref = BackupRef.parse(args.resume)
        if ref.is_latest or (args.name and args.name != ref.name):
            raise UsageError("--resume takes the exact NAME@ID the interrupted backup printed")
        return ref
    if not args.name:
        raise UsageError("the following arguments are required: --name")
    return BackupRef.new(validate_name(args.name))


def _producer(args: argparse.Namespace, progress: ProgressFn | None = None, echo: Callable[[bytes], None] | None = None) -> Producer | None:
    """The command after `--` (not started yet), or None for stdin / --input."""
    if args.run is None:
        if args.pipes is not None:
            raise UsageError("--pipes N makes pipes for a command to write: give it after --, e.g. -- db2 backup db SAMPLE to {pipes}")
        return None
    if args.input:
        raise UsageError("--input and a command after -- exclude each other: the command's output is the backup")
    from braid.engine.producer import Producer  # with its subprocess and pipe machinery, only when there is a command to run

    return Producer(args.run, pipes=args.pipes, open_timeout=args.open_timeout, progress=progress, echo=echo)


def cmd_backup(args: argparse.Namespace) -> int:
    if getattr(args, "abandon", None):
        return _abandon(args)
    ref = _backup_ref(args)
    with Progress.for_command(args) as progress:  # from here on, a failure is in the --log-file too
        progress.backup = str(ref)
        return _backup(args, ref, progress)


def _backup(args: argparse.Namespace, ref: BackupRef, progress: Progress) -> int:
    chunk_size = parse_size(args.chunk_size) if args.chunk_size else None
    if chunk_size is not None and not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise UsageError(f"--chunk-size must be between {format_size(MIN_CHUNK)} and {format_size(MAX_CHUNK)}")
    if args.resume and getattr(args, "incremental", None) is not None:
        raise UsageError("--incremental and --resume exclude each other: the resumed backup keeps the parent it started with")
    if args.resume and args.run is not None:
        return _resume_command_backup(args, ref, progress)
    producer = _producer(args, lambda event: progress({"backup": str(ref), **event}), echo=progress.echo)
    sources = sources_from_args(args.input) if producer is None else []
    for source in sources:
        source.check()
    inputs = len(sources) if producer is None else (args.pipes or 1)
    repository = open_repository(repo_url(args.repo), light=True)
    if chunk_size is None:
        chunk_size = default_chunk_size(repository.url)
    cloud = _uses_pipeline(repository, args)
    if cloud:
        from braid.agent.limits import check_worker_chunk_size

        check_worker_chunk_size(chunk_size)
    check_backup_memory(cloud=cloud, inputs=inputs, chunk_size=chunk_size, workers=args.workers, concurrency=args.concurrency)
    labels = labels_of(args.label or [])
    if labels and cloud:
        raise UsageError("--label is not carried through the cloud pipeline yet: give --engine local to label this backup")
    progress.estimate(_expected_size(args, repository, ref))
    engine = _engine_for(repository, args)
    lineage, parent = _lineage(repository, args, ref, cloud)
    if cloud and lineage.is_incremental:
        return _cloud_incremental(args, ref, progress, engine, producer, sources, chunk_size, lineage)
    # The parent's values for {parent_manifest} / {parent_lsn}, or the refusal of one it lacks (exit 2), before the producer runs.
    values: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if parent is not None or (producer is not None and any("{parent_" in arg for arg in producer.argv)):
        from braid.ops.chain_placeholders import ParentValues  # reads metadata: only for a chain's backup

        placeholders = ParentValues(repository.store, parent, producer.argv if producer is not None else [])
        if producer is not None:
            producer.argv = placeholders.substitute(producer.argv)
        values = placeholders
    # The producer starts only now that the repository and its key are ready,
    # and is stopped on the way out if the backup failed.
    with values, producer if producer is not None else contextlib.nullcontext():
        request = BackupRequest(
            ref,
            producer.sources if producer is not None else sources,
            chunk_size,
            args.level,
            args.workers,
            resume=bool(args.resume),
            gate=stream_gate(verdict=producer.verdict if producer is not None else None, allow_empty=args.allow_empty),
            resumable=producer is None,
            open_timeout=args.open_timeout,
            lineage=lineage,
            wal_gate=_wal_gate(repository, ref, args, staged=cloud),
            labels=labels,
            rate_limit=None if cloud or not args.rate_limit else parse_size(args.rate_limit),
        )
        manifest = engine.run(request, progress)
    return _outcome(manifest, args, ref, progress)


def _outcome(manifest: Manifest | None, args: argparse.Namespace, ref: BackupRef, progress: Progress) -> int:
    if manifest is None:
        if args.json:
            from braid.cli.render import print_json  # the renderers (prices, summaries): only for what is printed

            print_json({"backup": str(ref), "name": ref.name, "id": ref.id, "status": "staged"}, indent=None)
        elif not progress.quiet:
            print(f"{ref} staged; the pipeline is running: follow it with 'braid status {ref}'", file=sys.stderr)
            print(ref)
        return 0
    _published(manifest, args, progress)
    return 0


def _cloud_incremental(
    args: argparse.Namespace, ref: BackupRef, progress: Progress, engine: BackupEngine, producer: Producer | None,
    sources: list[InputSource], chunk_size: int, lineage: Lineage,
) -> int:
    """An incremental through the cloud pipeline: the host holds no key, so Prepare opens the parent's chain and hands
    its values over (braid.agent.parent_wait); only then is the producer started, with them (braid.ops.chain_placeholders)."""
    from braid.ops.chain_placeholders import ParentValues

    values = ParentValues.handed_over(producer.argv if producer is not None else [])
    started = contextlib.ExitStack()

    def start(lsn: str | None, manifest: bytes | None) -> list[InputSource]:
        assert producer is not None
        values.fill(str(lineage.parent), lsn, manifest)
        producer.argv = values.substitute(producer.argv)
        started.enter_context(producer)  # stopped on the way out if the backup failed
        return producer.sources

    with values, started:
        request = BackupRequest(
            ref,
            sources,
            chunk_size,
            args.level,
            args.workers,
            gate=stream_gate(verdict=producer.verdict if producer is not None else None, allow_empty=args.allow_empty),
            resumable=False,  # --resume of an incremental is refused: a failed one is abandoned, not kept
            open_timeout=args.open_timeout,
            lineage=lineage,
            parent_values=tuple(values.names),
            start_sources=start if producer is not None else None,
            input_labels=tuple(producer.labels()) if producer is not None else (),
        )
        manifest = engine.run(request, progress)
    return _outcome(manifest, args, ref, progress)


def _wal_gate(repository: Repository, ref: BackupRef, args: argparse.Namespace, *, staged: bool = False) -> Callable[[Captured], None]:
    """A PostgreSQL base backup without its WAL (-X none) is published once its WAL range is archived (with the stack:
    archived or staged, checked by the agent before its stream-end record). The archive's code loads only when a
    stream ends, so a backup that is no base backup never loads it (tests/cloud/test_agent_startup.py)."""

    def gate(captured: Captured) -> None:
        if captured.wal is None:  # no PostgreSQL base backup in the stream: nothing to wait for
            return
        from braid.ops.wal_wait import wal_gate

        wal_gate(repository.store, ref.name, max(0.0, args.wal_wait), include_staged=staged)(captured)

    return gate


def _lineage(repository: Repository, args: argparse.Namespace, ref: BackupRef, cloud: bool) -> tuple[Lineage, OpenedBackup | None]:
    """A full backup, or with --incremental the link on top of its parent (returned, opened), whose chain is checked
    readable first (exit 6)."""
    given = getattr(args, "incremental", None)
    if given is None:
        return Lineage(), None
    if cloud:  # no key on this host: the parent by its manifest's checksum; Prepare authenticates the chain (braid.pipeline.parent)
        from braid.ops.chain import parent_lineage

        return parent_lineage(repository, ref.name, given or None), None
    from braid.ops.chain import resolve_parent

    parent = resolve_parent(repository, ref.name, given or None, open_key_service(repository, args.key_file))
    return Lineage.incremental(BackupRef.parse(parent.manifest.backup), parent.manifest.lineage), parent


def _expected_size(args: argparse.Namespace, repository: Repository, ref: BackupRef) -> int | None:
    """--expected-size, else the size of the newest backup of the same name (its summary), else None."""
    if args.expected_size:
        return parse_size(args.expected_size)
    from braid.format.layout import summary_key

    try:
        previous = repository.backups(ref.name)
        if not previous:
            return None
        from braid.format.summary import open_summary  # a first backup of the name reads no summary

        return open_summary(repository.store.get(summary_key(previous[-1])), "summary").summary.plaintext_bytes or None
    except BackupError:
        return None  # only the estimate is at stake


def _abandon(args: argparse.Namespace) -> int:
    """`--abandon NAME@ID`: a held backup's execution ends now and its staging goes (CloudEngine.abandon_held)."""
    from braid.agent.cloud_engine import CloudEngine

    ref = BackupRef.parse(args.abandon)
    if ref.is_latest or args.resume or args.run or args.input or args.name:
        raise UsageError("--abandon takes the exact NAME@ID of a held backup, and nothing else to back up")
    engine = _engine_for(open_repository(repo_url(args.repo), light=True), args)
    if not isinstance(engine, CloudEngine):
        raise UsageError("--abandon gives up a held cloud backup; this is a local repository")
    with Progress.for_command(args) as progress:
        progress.backup = str(ref)
        engine.abandon_held(ref, progress)
    print(f"{ref} abandoned: its execution ended and its staging is removed", file=sys.stderr)
    return 0


def _resume_command_backup(args: argparse.Namespace, ref: BackupRef, progress: Progress) -> int:
    """`--resume NAME@ID -- COMMAND`: the command is not run again (it would make a new stream); a backup whose
    stream was staged whole finishes from staging, any other is refused with how to start again."""
    if args.input:
        raise UsageError("--input and a command after -- exclude each other: the command's output is the backup")
    from braid.agent.cloud_engine import CloudEngine

    engine = _engine_for(open_repository(repo_url(args.repo), light=True), args)
    if not isinstance(engine, CloudEngine):
        raise UsageError("--resume continues a cloud backup; a local backup of a command cannot be resumed: run it again")
    manifest = engine.resume_staged(ref, progress)
    _published(manifest, args, progress)
    return 0


def _newest(repository: Repository, ref: BackupRef) -> BackupRef:
    """NAME@latest for `status`: the newest backup of NAME, published or still staged (a --no-wait one has no manifest yet)."""
    if not ref.is_latest:
        return ref
    from braid.ops.incomplete import incomplete_backups

    candidates = repository.backups(ref.name) + [BackupRef.parse(found.backup) for found in incomplete_backups(repository, ref.name)]
    if not candidates:
        raise NotFoundError(f"no backups named {ref.name!r} in {repository.url}{repository.suggest_name(ref.name)}")
    return max(candidates, key=lambda candidate: candidate.id)


def _published(manifest: Manifest, args: argparse.Namespace, progress: Progress) -> None:
    """The `done` event and the result on stdout: NAME@ID, or with --json the summary document."""
    from braid.cli.render import operation_summary, print_backup_result

    elapsed = progress.elapsed()
    summary = operation_summary(manifest, "backup", elapsed)
    progress({"event": "done", **summary})
    print_backup_result(summary, elapsed, args.json, progress.quiet)


def cmd_status(args: argparse.Namespace) -> int:
    from braid.adapters.aws.wiring import cloud_engine

    repository = open_repository(repo_url(args.repo), light=True)
    if not repository.config.cloud:
        raise UsageError("status follows cloud pipeline executions; this is a local repository: use braid show NAME@ID / braid list")
    ref = _newest(repository, BackupRef.parse(args.backup))
    engine = cloud_engine(repository, args)
    status, processed = engine.status(ref)
    if args.once:
        doc: dict[str, object] = {"backup": str(ref), "status": status.status, "chunks": processed, "chunks_done": processed, "execution": status.arn}
        cause = status.failure_message(ref) if status.done and status.status != "SUCCEEDED" else None
        if not status.done:
            cause = engine.held_message(ref)  # held for --resume: still running, but waiting on a person
        if cause is not None:
            doc["cause"] = cause
        from braid.cli.render import print_execution_status

        print_execution_status(doc, args.json)
        if cause is not None:
            raise ExecutionError(cause)
        return 0
    # Following: the same outcome as a waiting backup (NAME@ID on stdout, or the failure).
    with Progress.for_command(args) as progress:
        progress.backup = str(ref)
        manifest = engine.wait(ref, progress, expected=engine.staged_stream_end(ref))
        _published(manifest, args, progress)
    return 0
