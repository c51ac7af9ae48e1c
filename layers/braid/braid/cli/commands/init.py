"""`braid init`: a local repository with its master key, or a cloud one on a deployed stack."""

from __future__ import annotations

import argparse

from braid.cli.compose import init_local, is_s3_url, open_store, repo_url
from braid.cli.render import print_cloud_init, print_local_init
from braid.errors import UsageError
from braid.format.repository import Repository
from braid.format.timestamps import utc_now


def cmd_init(args: argparse.Namespace) -> int:
    url = repo_url(args.repo)
    if is_s3_url(url):
        return _init_cloud(url, args)
    if args.stack:
        raise UsageError("--stack is for s3:// repositories")
    print_local_init(init_local(url, args.key_file), args.json)
    return 0


def _init_cloud(url: str, args: argparse.Namespace) -> int:
    """The stack's outputs name the pipeline and the KMS key; the config records both."""
    from braid.adapters.aws.s3 import S3Store
    from braid.adapters.aws.stack_outputs import config_from_stack

    if not args.stack:
        raise UsageError("an s3:// repository is served by a deployed stack: give --stack NAME (see README, 'Cloud')")
    store = open_store(url)
    assert isinstance(store, S3Store)  # is_s3_url(url)
    config = config_from_stack(args.stack, store, utc_now())
    print_cloud_init(url, Repository.create(store, config).config, args.stack, args.json)
    return 0
