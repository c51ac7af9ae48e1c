"""`braid verify`: quick (stored checksums) or --deep (authenticated and decoded), one backup or --all.

On an s3:// repository whose stack has a verify state machine, the cloud
checks the chunks (braid.pipeline.verify_*): this host starts one execution,
follows it and prints its reports, downloading nothing. `--engine local`
(and every other repository) checks them here. Either way each backup's
result is recorded beside it (braid.ops.verification), which `show` and
`list` print and the scheduled prune reads.

The exit code says what kind of trouble was found, as restore's would: 6
when something was read and found wrong, otherwise the code of what stopped
the check (7 for chunks the repository would not hand over, 4 for a key
that does not open a backup under --all, ...). A storage failure is never
reported as corruption: "permission denied" is not a bad chunk.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from datetime import UTC, datetime
from typing import Any

from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.render import print_verify_reports
from braid.contract import ENGINE_LOCAL, ENGINE_STEPFUNCTIONS
from braid.errors import BackupError, IntegrityError, PermissionDeniedError, StorageError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import manifest_key
from braid.format.repository import Repository
from braid.format.summary import catalog_stamp
from braid.format.verification import Selection
from braid.ops.chain import check_chain
from braid.ops.verification import new_record, next_rotation, record_of_report, write_record
from braid.ops.verify import verify_published


def cmd_verify(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    if args.wal:
        return _verify_wal(args, repository)
    engine = getattr(args, "engine", None)
    if engine != ENGINE_LOCAL:
        from braid.adapters.aws.wiring import cloud_verifier

        verifier = cloud_verifier(repository)
        if verifier is not None:
            return _finish(args, *_cloud_reports(args, repository, verifier))
        if engine == ENGINE_STEPFUNCTIONS:
            raise UsageError(
                f"repository {repository.url} has no verify state machine: deploy the stack and run"
                " 'braid init --repo s3://... --stack NAME', or verify on this host with --engine local"
            )
    return _finish(args, *_local_reports(args, repository))


def _verify_wal(args: argparse.Namespace, repository: Repository) -> int:
    """`verify --wal --name NAME`: exit 6 naming the first gap, after printing every one."""
    from braid.cli.compose import key_service_on_demand
    from braid.cli.render import print_json
    from braid.ops.wal_verify import describe, verify_wal

    if not args.name:
        raise UsageError("verify --wal needs --name NAME: the WAL archive to check")
    report = verify_wal(repository, key_service_on_demand(repository, args.key_file), args.name)
    if args.json:
        print_json(report.to_json())
    elif not args.quiet or report.gaps:
        print("\n".join(describe(report)))
    if report.gaps:
        backup, (first, last, missing) = report.gaps[0]
        raise IntegrityError(
            f"the WAL archive of {args.name} has {len(report.gaps)} gap(s); first: {first} .. {last} ({missing} segment(s) missing), needed by {backup}"
        )
    return 0


def _selection(args: argparse.Namespace, repository: Repository, ref: BackupRef) -> Selection:
    if args.rotate:
        return next_rotation(repository.store, ref, args.rotate)
    return Selection.sample(args.sample)


def _local_reports(args: argparse.Namespace, repository: Repository) -> tuple[list[dict[str, Any]], list[BackupError]]:
    refs = repository.backups() if args.all else [repository.resolve(BackupRef.parse(args.backup))]
    keys = open_key_service(repository, args.key_file, unwrap_only=True, strict=args.strict_permissions) if args.deep else None
    reports: list[dict[str, Any]] = []
    errors: list[BackupError] = []  # what stopped each failed backup's check, most serious first below
    if getattr(args, "chain", False) and not args.all:  # --deep --chain: every ancestor as deeply as the backup
        refs = [*check_chain(repository, refs[0], keys), *refs]
    for ref in refs:
        selection = _selection(args, repository, ref)
        try:
            check_chain(repository, ref, keys)  # an incremental is only as good as its chain (exit 6 otherwise)
            report = verify_published(repository, ref, keys, workers=args.workers, selection=selection)
        except PermissionDeniedError as exc:  # a permissions problem, never a failed check: nothing recorded
            _not_recorded(ref, exc)
            if not args.all:
                raise
            reports.append({"backup": str(ref), "ok": False, "failures": [str(exc)], "unreadable": [str(exc)]})
            errors.append(exc)
            continue
        except BackupError as exc:
            if not args.all:
                _record(repository, _failed_record(ref, args, selection, exc))
                raise
            # --all reports every backup: one that will not open is a failure among the others.
            reports.append({"backup": str(ref), "ok": False, "failures": [str(exc)], "unreadable": []})
            errors.append(exc)
            _record(repository, _failed_record(ref, args, selection, exc))
            continue
        reports.append({**report.to_json(), "selection": selection.to_json()})
        if report.denied:
            _not_recorded(ref, PermissionDeniedError(report.unreadable[0]))
        else:
            _record(repository, record_of_report(report, selection, ENGINE_LOCAL, datetime.now(UTC)))
        if report.corrupt:
            errors.append(IntegrityError(next(f for f in report.failures if f not in report.unreadable)))
        elif not report.ok:
            errors.append(StorageError(report.unreadable[0]))
    return reports, errors


def _not_recorded(ref: BackupRef, exc: BackupError) -> None:
    print(f"braid: warning: {ref} was not verified, and no result was recorded: {exc}", file=sys.stderr)


def _failed_record(ref: BackupRef, args: argparse.Namespace, selection: Selection, exc: BackupError) -> Any:
    return new_record(
        str(ref), mode="deep" if args.deep else "quick", selection=selection, engine=ENGINE_LOCAL, chunks_total=0, chunks_checked=0,
        bytes_checked=0, failures=[str(exc)], corrupt=isinstance(exc, IntegrityError), at=datetime.now(UTC),
    )


def _record(repository: Repository, record: Any) -> None:
    """Record the result; a repository this host may not write to still gets its verify, with a warning."""
    try:
        write_record(repository.store, record)
    except BackupError as exc:
        print(f"braid: warning: the result of verifying {record.backup} was not recorded: {exc}", file=sys.stderr)


def _cloud_reports(args: argparse.Namespace, repository: Repository, verifier: Any) -> tuple[list[dict[str, Any]], list[BackupError]]:
    # Resolved here, so a backup that does not exist is this host's error (exit 8), not a failed run.
    backups: str | list[str] = "all"
    if not args.all:
        ref = repository.resolve(BackupRef.parse(args.backup))
        if repository.store.head(manifest_key(ref)) is None:
            repository.load(ref)  # raises NotFoundError, saying which backups the name has
        ancestors = check_chain(repository, ref, None)  # present and checksummed here; the cloud checks the chunks
        backups = [*(str(a) for a in ancestors if getattr(args, "chain", False)), str(ref)]
    document: dict[str, Any] = {
        "backups": backups,
        "prefix": getattr(repository.store, "prefix", ""),
        "deep": bool(args.deep),
        "sample_percent": args.sample,
        "rotate": args.rotate,
    }
    name = f"verify-{catalog_stamp().replace('.', '-')}-{secrets.token_hex(4)}"
    execution = verifier.start(name, document)
    if not args.quiet and not args.json:  # a deep verify of TiBs takes minutes: say where to watch it
        print(f"verifying in the cloud: {execution}", file=sys.stderr)
    output = verifier.wait(execution)
    reports = [dict(r) for r in output.get("reports", [])]
    if output.get("omitted_ok") and not args.json and not args.quiet:  # a run over thousands of backups lists only what failed
        print(f"{output['omitted_ok']} more backup(s) verified ok (braid list shows each one's result)", file=sys.stderr)
    errors: list[BackupError] = []
    for report in reports:
        if report.get("ok"):
            continue
        first = (report.get("failures") or ["unknown failure"])[0]
        errors.append(IntegrityError(first) if report.get("corrupt") else StorageError(first))
    return reports, errors


def _finish(args: argparse.Namespace, reports: list[dict[str, Any]], errors: list[BackupError]) -> int:
    failed = [r for r in reports if not r["ok"]]
    if args.json or not args.quiet:
        print_verify_reports(reports, args.json)
    elif failed:  # --quiet: only what failed, for the cron mail
        print_verify_reports(failed, args.json)
    if failed:
        # Corruption outranks an unreadable chunk: the one is proof of damage, the other only a check not done.
        worst = next((e for e in errors if isinstance(e, IntegrityError)), errors[0])
        what = "failed verification" if isinstance(worst, IntegrityError) else "could not be verified"
        raise type(worst)(f"{len(failed)} of {len(reports)} backup(s) {what}; first: {worst}")
    return 0
