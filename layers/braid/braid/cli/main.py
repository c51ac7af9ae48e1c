"""`braid`: the agent CLI on the database host.

Every failure is one line on stderr that says what to fix, and an exit code
from braid.errors.EXIT_CODES; `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from braid import __version__
from braid.cli.compose import is_s3_url, key_file_path, open_key_service, open_repository, open_store, repo_url
from braid.cli.progress import Progress
from braid.cli.sizes import format_size, parse_size
from braid.engine.port import BackupEngine, BackupRequest
from braid.engine.stream import sources_from_args
from braid.errors import EXIT_CODES, BackupError, UsageError
from braid.format.ids import BackupRef, validate_name
from braid.format.manifest import Manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now

MIN_CHUNK = 4 * 1024
MAX_CHUNK = 1024**3


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _epilog() -> str:
    lines = ["exit codes:"] + [f"  {code:>3}  {text}" for code, text in EXIT_CODES.items()]
    lines += [
        "",
        "environment:",
        "  BRAID_REPO      repository (directory or s3://BUCKET/PREFIX) when --repo is not given",
        "  BRAID_KEY_FILE  master-key file of a local repository when --key-file is not given",
    ]
    return "\n".join(lines)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError("--sample must be in (0, 100]")
    return value


def _level(text: str) -> int:
    value = _positive_int(text)
    if value > 19:
        raise argparse.ArgumentTypeError("--level must be 1..19")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit code 2
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo", help="repository: a directory, or s3://BUCKET/PREFIX (env BRAID_REPO)")
    common.add_argument("--key-file", help="master-key file of a local repository (env BRAID_KEY_FILE)")
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common.add_argument("--json", action="store_true", help="machine-readable output (and JSON-lines progress)")

    parser = _Parser(
        prog="braid",
        description="Stream database backups off the host; compress and encrypt them in parallel; restore them verified.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"braid {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    init = sub.add_parser("init", parents=[common], help="create a repository (and, locally, its master key)")
    init.add_argument("--stack", help="s3:// repositories: the deployed CloudFormation stack whose pipeline and key to use")
    init.set_defaults(handler=cmd_init)

    backup = sub.add_parser("backup", parents=[common], help="back up stdin or --input streams")
    backup.add_argument("--name", help="backup name, e.g. the database name")
    backup.add_argument("--input", action="append", metavar="PATH", help="file or named pipe; repeat for several (read concurrently)")
    backup.add_argument("--chunk-size", default="64MiB", help="chunk size (default 64MiB)")
    backup.add_argument("--workers", type=_positive_int, default=_cores(), help="worker threads (default: cores)")
    backup.add_argument("--level", type=_level, default=3, help="zstd level (default 3)")
    cloud = backup.add_argument_group("s3:// repositories (the cloud pipeline)")
    cloud.add_argument("--concurrency", type=_positive_int, help="uploads in flight (default 8); memory is (concurrency + 2) chunks")
    cloud.add_argument("--rate-limit", metavar="SIZE", help="cap upload bandwidth, bytes per second (e.g. 200MiB)")
    cloud.add_argument("--fan-out", type=_positive_int, help="Lambda workers at once for this backup (map MaxConcurrency, default 100)")
    cloud.add_argument("--no-wait", action="store_true", help="return once the stream is staged; follow with 'braid status'")
    cloud.add_argument("--resume", metavar="NAME@ID", help="continue an interrupted upload: sends only the parts S3 lacks")
    backup.set_defaults(handler=cmd_backup)

    status = sub.add_parser("status", parents=[common], help="follow a cloud backup's pipeline execution")
    status.add_argument("backup", metavar="NAME@ID")
    status.add_argument("--once", action="store_true", help="print the current state and exit (code 9 if the execution failed)")
    status.set_defaults(handler=cmd_status)

    restore = sub.add_parser("restore", parents=[common], help="write a backup's original bytes to stdout or --output")
    restore.add_argument("backup", metavar="NAME@ID", help="backup to restore (NAME@latest for the newest)")
    restore.add_argument("--output", action="append", metavar="PATH", help="one per backup input, in order")
    restore.add_argument("--workers", type=_positive_int, default=_cores(), help="decode threads (default: cores)")
    restore.add_argument("--force", action="store_true", help="overwrite existing output files")
    restore.set_defaults(handler=cmd_restore)

    lister = sub.add_parser("list", parents=[common], help="list complete backups")
    lister.add_argument("--name", help="only backups with this name")
    lister.set_defaults(handler=cmd_list)

    show = sub.add_parser("show", parents=[common], help="show one backup's manifest summary")
    show.add_argument("backup", metavar="NAME@ID")
    show.set_defaults(handler=cmd_show)

    verify = sub.add_parser("verify", parents=[common], help="check backups: quick (presence, size, checksum) or --deep")
    target = verify.add_mutually_exclusive_group(required=True)
    target.add_argument("backup", nargs="?", metavar="NAME@ID")
    target.add_argument("--all", action="store_true", help="every backup in the repository")
    verify.add_argument("--deep", action="store_true", help="decrypt, decompress and check every chunk's plaintext")
    verify.add_argument("--sample", type=_percent, metavar="PCT", help="check a random PCT%% of chunks")
    verify.add_argument("--workers", type=_positive_int, default=max(4, _cores()), help="parallel checks")
    verify.set_defaults(handler=cmd_verify)

    prune = sub.add_parser("prune", parents=[common], help="forget backups a retention policy lets go, and collect leftovers")
    prune.add_argument("--keep-last", type=_positive_int, metavar="N", help="keep the newest N backups of each name")
    prune.add_argument("--keep-days", type=float, metavar="D", help="keep every backup started in the last D days")
    prune.add_argument("--orphan-grace-hours", type=float, default=48.0, metavar="H",
                       help="collect data of backups that never completed once older than H hours (default 48)")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    prune.set_defaults(handler=cmd_prune)
    return parser


# -- commands ---------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from braid.adapters.local.keys import LocalKeyFile
    from braid.adapters.local.store import LocalStore

    url = repo_url(args.repo)
    if is_s3_url(url):
        return _init_cloud(url, args)
    if args.stack:
        raise UsageError("--stack is for s3:// repositories")
    root = Path(url).expanduser().absolute()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UsageError(f"{root} exists and is not an empty directory; choose a new path for the repository")
    store = open_store(url)
    assert isinstance(store, LocalStore)
    # The key file path depends on the repository id; make the id first.
    provisional = RepositoryConfig.new({"type": "local", "key_id": ""}, utc_now())
    path = key_file_path(args.key_file, provisional.id)
    if path.absolute() == root or root in path.absolute().parents:
        raise UsageError(f"key file {path} would be inside the repository; keep the master key outside it (anyone with both can read every backup)")
    if path.exists():
        keys = LocalKeyFile.open(path)
        note = f"using existing key file {path}"
    else:
        keys = LocalKeyFile.create(path)
        note = f"created key file {path} (0600): keep a copy somewhere safe; without it no backup can be restored"
    config = RepositoryConfig(provisional.id, provisional.created, {"type": "local", "key_id": keys.key_id})
    root.mkdir(parents=True, exist_ok=True)
    Repository.create(store, config)
    if args.json:
        print(json.dumps({"repository": str(root), "id": config.id, "key_file": str(path), "key_id": keys.key_id}))
    else:
        print(f"initialised repository {root} (id {config.id})", file=sys.stderr)
        print(note, file=sys.stderr)
    return 0


def _init_cloud(url: str, args: argparse.Namespace) -> int:
    from braid.adapters.aws.stack_outputs import config_from_stack

    if not args.stack:
        raise UsageError("an s3:// repository is served by a deployed stack: give --stack NAME (see README, 'Cloud')")
    store = open_store(url)
    config = config_from_stack(args.stack, store, utc_now())
    Repository.create(store, config)
    if args.json:
        print(json.dumps({"repository": url, "id": config.id, "key_id": config.key["key_id"], **config.cloud}))
    else:
        print(f"initialised repository {url} (id {config.id}) on stack {args.stack}", file=sys.stderr)
    return 0


_CLOUD_ONLY = ("concurrency", "rate_limit", "fan_out", "no_wait", "resume")


def _engine_for(repository: Repository, args: argparse.Namespace) -> BackupEngine:
    """The repository's config decides: a pipeline named in it, or this machine."""
    if repository.config.cloud:
        from braid.agent.cloud_engine import cloud_engine

        args.rate_limit_bytes = parse_size(args.rate_limit) if args.rate_limit else None
        if args.rate_limit_bytes == 0:
            raise UsageError("--rate-limit must be more than 0")
        return cloud_engine(repository, args)
    given = [f"--{name.replace('_', '-')}" for name in _CLOUD_ONLY if getattr(args, name)]
    if given:
        raise UsageError(f"{', '.join(given)} only apply to s3:// repositories")
    from braid.engine.local import LocalEngine

    return LocalEngine(repository, open_key_service(repository, args.key_file))


def cmd_backup(args: argparse.Namespace) -> int:
    if args.resume:
        ref = BackupRef.parse(args.resume)
        if ref.is_latest or (args.name and args.name != ref.name):
            raise UsageError("--resume takes the exact NAME@ID the interrupted backup printed")
    else:
        if not args.name:
            raise UsageError("the following arguments are required: --name")
        ref = BackupRef.new(validate_name(args.name))
    chunk_size = parse_size(args.chunk_size)
    if not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise UsageError(f"--chunk-size must be between {format_size(MIN_CHUNK)} and {format_size(MAX_CHUNK)}")
    sources = sources_from_args(args.input)
    for source in sources:
        source.check()
    repository = open_repository(repo_url(args.repo))
    progress = Progress.for_terminal(args.json)
    request = BackupRequest(ref, sources, chunk_size, args.level, args.workers, resume=bool(args.resume))
    engine = _engine_for(repository, args)
    manifest = engine.run(request, progress or (lambda event: None))
    if manifest is None:
        print(f"{ref} staged; the pipeline is running: follow it with 'braid status {ref}'", file=sys.stderr)
        print(ref)
        return 0
    if progress:
        progress({"event": "done", **_summary(manifest)})
    print(manifest.backup)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from braid.agent.cloud_engine import cloud_engine, stream_end_of

    repository = open_repository(repo_url(args.repo))
    if not repository.config.cloud:
        raise UsageError("status follows cloud pipeline executions; this is a local repository")
    ref = BackupRef.parse(args.backup)
    engine = cloud_engine(repository, args)
    status, processed = engine.status(ref)
    if args.once:
        doc = {"backup": str(ref), "status": status.status, "chunks_done": processed, "execution": status.arn}
        failed = status.done and status.status != "SUCCEEDED"
        if failed:
            doc["cause"] = status.failure_message(ref)
        print(json.dumps(doc) if args.json else f"{ref}: {status.status}, {processed} chunks processed")
        if failed:
            from braid.errors import ExecutionError

            raise ExecutionError(doc["cause"])
        return 0
    # Following: the same outcome as a waiting backup (NAME@ID on stdout, or the failure).
    progress = Progress.for_terminal(args.json)
    manifest = engine.wait(ref, progress or (lambda event: None), expected=stream_end_of(engine.store, ref))
    if progress:
        progress({"event": "done", **_summary(manifest)})
    print(manifest.backup)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from braid.ops.restore import restore_backup, targets_from_args

    repository = open_repository(repo_url(args.repo))
    sealed = repository.load(BackupRef.parse(args.backup))
    keys = open_key_service(repository, args.key_file, unwrap_only=True)
    key = keys.unwrap(sealed.manifest.key)
    manifest = sealed.authenticate(key)
    targets = targets_from_args(args.output, manifest)
    progress = Progress.for_terminal(args.json)
    restore_backup(repository.store, manifest, key, targets, workers=args.workers, force=args.force, progress=progress)
    if progress:
        progress({"event": "done", "backup": manifest.backup, "bytes_written": manifest.plaintext_bytes, "chunks_done": manifest.chunk_count})
    return 0


def _summary(manifest: Manifest) -> dict[str, Any]:
    return {
        "backup": manifest.backup,
        "name": manifest.name,
        "id": manifest.id,
        "created": manifest.created,
        "completed": manifest.completed,
        "engine": manifest.engine,
        "inputs": len(manifest.inputs),
        "chunks": manifest.chunk_count,
        "plaintext_bytes": manifest.plaintext_bytes,
        "stored_bytes": manifest.stored_bytes,
        "ratio": round(manifest.ratio, 4),
    }


def cmd_list(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    rows = []
    for ref in repository.backups(args.name):
        try:
            rows.append(_summary(repository.load(ref).manifest))
        except BackupError as exc:
            rows.append({"backup": str(ref), "error": str(exc), "created": ""})
    rows.sort(key=lambda row: (row["created"], row["backup"]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no backups", file=sys.stderr)
        return 0
    print(f"{'BACKUP':<48} {'CREATED':<20} {'SIZE':>10} {'STORED':>10} {'RATIO':>6} {'CHUNKS':>7}")
    for row in rows:
        if "error" in row:
            print(f"{row['backup']:<48} UNREADABLE: {row['error']}")
            continue
        print(
            f"{row['backup']:<48} {row['created'][:19]:<20} {format_size(row['plaintext_bytes']):>10}"
            f" {format_size(row['stored_bytes']):>10} {row['ratio']:>6.3f} {row['chunks']:>7}"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    manifest = repository.load(BackupRef.parse(args.backup)).manifest
    detail = {
        **_summary(manifest),
        "chunk_size": manifest.chunk_size,
        "algorithms": manifest.algorithms,
        "key_id": manifest.key.key_id,
        "timings": manifest.timings,
        "stats": manifest.stats,
        "input_details": [
            {"index": i.index, "source": i.source, "bytes": i.length, "chunks": len(i.chunks), "stored_bytes": sum(c.stored_length for c in i.chunks)}
            for i in manifest.inputs
        ],
    }
    if args.json:
        print(json.dumps(detail, indent=2))
        return 0
    print(f"backup      {manifest.backup}")
    print(f"created     {manifest.created}")
    print(f"completed   {manifest.completed}")
    print(f"engine      {manifest.engine}")
    print(f"size        {format_size(manifest.plaintext_bytes)} ({manifest.plaintext_bytes} bytes)")
    print(f"stored      {format_size(manifest.stored_bytes)} ({manifest.stored_bytes} bytes), ratio {manifest.ratio:.3f}")
    print(f"chunks      {manifest.chunk_count} of up to {format_size(manifest.chunk_size)}")
    print(f"algorithms  zstd level {manifest.algorithms.get('level')}, {manifest.algorithms.get('cipher')}")
    print(f"key         {manifest.key.key_id}")
    print("timings     " + ", ".join(f"{k} {v:.3f}s" for k, v in manifest.timings.items()))
    for entry in detail["input_details"]:
        print(f"input {entry['index']}     {entry['source']}: {format_size(entry['bytes'])} in {entry['chunks']} chunks")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from braid.ops.verify import verify_backup

    repository = open_repository(repo_url(args.repo))
    refs = repository.backups() if args.all else [repository.resolve(BackupRef.parse(args.backup))]
    keys = open_key_service(repository, args.key_file, unwrap_only=True) if args.deep else None
    reports = []
    for ref in refs:
        try:
            sealed = repository.load(ref)
            key = keys.unwrap(sealed.manifest.key) if keys else None
            manifest = sealed.authenticate(key) if key else sealed.manifest
            report = verify_backup(repository.store, manifest, key, deep=args.deep, sample_percent=args.sample, workers=args.workers)
            reports.append(report.to_json())
        except BackupError as exc:
            if not args.all:
                raise
            reports.append({"backup": str(ref), "ok": False, "failures": [str(exc)]})
    failed = [r for r in reports if not r["ok"]]
    if args.json:
        print(json.dumps(reports, indent=2))
    else:
        for r in reports:
            status = "ok" if r["ok"] else "FAILED"
            checked = f"{r.get('chunks_checked', 0)}/{r.get('chunks_total', '?')} chunks" if "chunks_total" in r else ""
            print(f"{r['backup']}: {status} ({r.get('mode', 'quick')}, {checked})")
            for failure in r["failures"]:
                print(f"  {failure}")
    if failed:
        from braid.errors import IntegrityError

        first = failed[0]["failures"][0] if failed[0]["failures"] else "verification failed"
        raise IntegrityError(f"{len(failed)} of {len(reports)} backup(s) failed verification; first: {first}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune

    policy = RetentionPolicy(args.keep_last, args.keep_days, args.orphan_grace_hours)
    repository = open_repository(repo_url(args.repo))
    plan = plan_prune(repository, policy)
    if not args.dry_run:
        execute_prune(repository, plan)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, **plan.to_json()}, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        for ref in plan.forget:
            print(f"{verb} {ref}")
        for ref in plan.orphans:
            print(f"{verb} leftovers of incomplete backup {ref}")
        print(f"kept {len(plan.keep)} backup(s)", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "handler", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.handler(args))
    except BackupError as exc:
        if debug:
            traceback.print_exc()
        print(f"braid: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print("; ".join(["braid: interrupted", *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 130
    except BrokenPipeError:
        print("braid: error: output closed by its reader", file=sys.stderr)
        return 5
    except Exception as exc:  # a bug: still one line, traceback on --debug
        if debug:
            traceback.print_exc()
        print(f"braid: error: unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
