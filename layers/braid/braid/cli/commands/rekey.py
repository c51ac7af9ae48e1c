"""`braid rekey [--kms-key ARN | --new-key-file PATH]`: re-wrap every backup's data key (braid.ops.rekey).

Local repositories: the current master-key file (`--key-file`, as for every
command) unwraps, `--new-key-file` (created 0600 if missing) wraps; without
it, the current key does, which finishes an interrupted run. s3://
repositories: KMS ReEncrypt to `--kms-key`, or to the repository's key; the
host needs kms:Decrypt (to re-seal each manifest) and kms:ReEncryptFrom /
kms:ReEncryptTo. The WAL archive's objects and packs are re-wrapped too
(braid.ops.wal_rekey: each is rewritten, its key being in its head). Exit 0
when every backup and WAL object is under the target key; 4 or 6 naming the
first backup (or else WAL object) that could not be re-wrapped (the rest are
done; the config keeps its key).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from braid.cli.compose import key_file_path, open_key_service, open_repository, repo_url, warn_key_file
from braid.cli.render import print_rekey
from braid.errors import BackupError, IntegrityError, KeyAccessError, UsageError
from braid.ops.rekey import rekey_repository


def cmd_rekey(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    kind = repository.config.key.get("type")
    if kind == "local":
        if args.kms_key:
            raise UsageError(f"--kms-key is for s3:// repositories; {repository.url} uses a local master-key file: give --new-key-file PATH")
        from braid.adapters.local.keys import LocalKeyFile

        current = repository.config.key.get("key_id")
        new = open_key_service(repository, args.key_file, strict=args.strict_permissions) if not args.new_key_file else None
        if args.new_key_file:
            path = Path(args.new_key_file).expanduser()
            new = LocalKeyFile.open(path, strict=args.strict_permissions, warn=warn_key_file) if path.exists() else LocalKeyFile.create(path)
        assert isinstance(new, LocalKeyFile)
        if current != new.key_id:
            old = open_key_service(repository, args.key_file, strict=args.strict_permissions)  # the key the repository names, checked against it
        else:
            # The repository names the target already (a finished run, or stragglers published under the
            # old key while it ran): the key file of --key-file or the default path unwraps what is left.
            path = key_file_path(args.key_file, repository.config.id)
            old = LocalKeyFile.open(path, strict=args.strict_permissions, warn=warn_key_file) if path.exists() else new
        assert isinstance(old, LocalKeyFile)
        report = rekey_repository(repository, old, new, old.rewrapper(new), {"type": "local", "key_id": new.key_id})
    else:
        if args.new_key_file:
            raise UsageError(f"--new-key-file is for local repositories; {repository.url} uses KMS: give --kms-key ARN")
        from braid.adapters.aws.clients import kms_client
        from braid.adapters.aws.kms import KmsKeyService, KmsRewrap

        client = kms_client()
        rewrap = KmsRewrap.to_key(client, args.kms_key or repository.config.key["key_id"])
        unwrap = KmsKeyService.for_unwrap(client)
        report = rekey_repository(repository, unwrap, unwrap, rewrap, {"type": "kms", "key_id": rewrap.target_key_id})
    if args.json or not args.quiet or report.failed or report.wal.failed:
        print_rekey(report, args.json)
    if kind == "local" and args.new_key_file and report.config_switched and not args.json:
        path = Path(args.new_key_file).expanduser().absolute()
        print(
            f"escrow the new key now: keep a copy of {path} somewhere safe (copies of the old key no longer open this repository);"
            f" then point the config file at it: key_file = \"{path}\" (or BRAID_KEY_FILE={path})",
            file=sys.stderr,
        )
    failed, what = (report.failed, "backup(s)") if report.failed else (report.wal.failed, "WAL object(s)")
    if failed:
        where, first = failed[0]
        message = f"{len(failed)} {what} could not be re-wrapped (the others were); first: {where}: {first}"
        if not report.config_switched:
            message += "; the repository still names its old key: fix this and run rekey again"
        error: BackupError = KeyAccessError(message) if all(isinstance(e, KeyAccessError) for _, e in failed) else IntegrityError(message)
        raise error
    return 0
