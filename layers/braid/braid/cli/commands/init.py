"""`braid init`: a local repository with its master key, or a cloud one on a deployed stack."""

from __future__ import annotations

import argparse

from braid.cli.compose import init_local, init_store_with_key_file, init_store_with_kms, is_s3_url, open_store, repo_url
from braid.cli.render import print_cloud_init, print_local_init, print_store_init
from braid.errors import UsageError
from braid.format.lock import ObjectLock
from braid.format.repository import Repository
from braid.format.timestamps import utc_now


def cmd_init(args: argparse.Namespace) -> int:
    url = repo_url(args.repo)
    engine = getattr(args, "engine", None)
    if args.kms_key and engine != "local":
        raise UsageError("--kms-key is for 'braid init --repo s3://... --engine local'; a stack's repository uses the stack's key")
    if getattr(args, "object_lock", None) and (engine != "local" or not is_s3_url(url)):
        raise UsageError(
            "--object-lock is for 'braid init --repo s3://... --engine local' (a bucket with Object Lock enabled);"
            " a stack's repository takes the stack's setting (braid:objectLock)"
        )
    if is_s3_url(url):
        if engine == "local":
            return _init_store(url, args)
        return _init_cloud(url, args)
    if args.stack:
        raise UsageError("--stack is for s3:// repositories")
    if engine == "stepfunctions":
        raise UsageError("--engine stepfunctions needs an s3:// repository and a deployed stack (--stack NAME)")
    print_local_init(init_local(url, args.key_file), args.json)
    return 0


def _init_cloud(url: str, args: argparse.Namespace) -> int:
    """The stack's outputs name the pipeline and the KMS key; the config records both."""
    from braid.adapters.aws.s3 import S3Store
    from braid.adapters.aws.stack_outputs import config_from_stack

    if not args.stack:
        raise UsageError(
            "an s3:// repository is served by a deployed stack: give --stack NAME (see docs/cloud.md, 'Deploy on AWS'),"
            " or --engine local to compress and encrypt on this host (see docs/cloud.md, 'S3 without the stack')"
        )
    store = open_store(url)
    assert isinstance(store, S3Store)  # is_s3_url(url)
    config = config_from_stack(args.stack, store, utc_now())
    print_cloud_init(url, Repository.create(store, config).config, args.stack, args.json)
    return 0


def _init_store(url: str, args: argparse.Namespace) -> int:
    """No stack: this host compresses and encrypts; a master-key file (default) or a KMS key wraps the data keys."""
    if args.stack:
        raise UsageError("--stack and --engine local exclude each other: a stack's repository runs its pipeline; --engine local needs none")
    lock = ObjectLock.parse(args.object_lock) if getattr(args, "object_lock", None) else None
    if args.kms_key:
        if args.key_file:
            raise UsageError("--kms-key and --key-file exclude each other: the data keys are wrapped by one of them")
        print_store_init(url, init_store_with_kms(url, args.kms_key, lock).config, args.json)
        return 0
    print_local_init(init_store_with_key_file(url, args.key_file, lock), args.json)
    return 0
