"""`braid prune --storage-class CLASS:DAYS`: the option and its check (printing: braid.cli.storage_render).

The option is part of a stored policy (`--save-policy`): the name's chunks
move to CLASS (STANDARD_IA or GLACIER_IR) once a kept backup is DAYS old
(braid.ops.storage_class). A directory repository has no storage classes:
saving one there is refused (exit 2). The parser imports this module, so it
loads nothing of the format until the option is used.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from braid.errors import UsageError

if TYPE_CHECKING:
    from braid.format.storage_class import StoragePolicy


def _storage_policy(text: str) -> StoragePolicy:
    from braid.format.storage_class import StoragePolicy  # only when the option is given: `braid --version` loads no format

    try:
        return StoragePolicy.parse(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def add_prune_options(prune: argparse.ArgumentParser) -> None:
    prune.add_argument(
        "--storage-class",
        type=_storage_policy,
        metavar="CLASS:DAYS",
        help="with --save-policy: move the chunks of --name's backups to CLASS (STANDARD_IA or GLACIER_IR, both restorable"
        " without a restore request) once they are DAYS old; S3 repositories only. Manifests and the catalog stay in Standard",
    )


def check_prune_options(args: argparse.Namespace) -> StoragePolicy | None:
    """The `--storage-class` given, or None; a UsageError when it comes without --save-policy."""
    storage: StoragePolicy | None = args.storage_class
    if storage is not None and not args.save_policy:
        raise UsageError(f"--storage-class is part of a stored policy: give it with --name NAME --keep-... --storage-class {storage} --save-policy")
    return storage
