"""Refuse to run as another user than the owner of a directory repository (`--allow-other-owner` overrides).

`sudo braid backup ...` once, as root, on the postgres user's repository
leaves root-owned 0600 files that postgres then cannot read: `list` and
`verify` fail and prune calls healthy backups unreadable. So before a
command touches a directory repository (`--repo`, and `copy --to`), the
effective user must be the directory's owner; the refusal names the owner
and the command to run instead, and nothing has been written. s3://
repositories have no owner here (IAM decides).
"""

from __future__ import annotations

import argparse
import os

from braid.contract import ENV_REPO
from braid.errors import RepositoryError


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_owner(url: str | None, allow: bool, command: str) -> None:
    """RepositoryError (exit 3) if `url` is a directory owned by another user than this process's effective one."""
    if not url or "://" in url or allow:
        return
    try:
        owner = os.stat(os.path.expanduser(url)).st_uid
    except OSError:
        return  # missing or unreadable: the command's own opening says so
    me = os.geteuid()
    if owner == me:
        return
    name = _user(owner)
    raise RepositoryError(
        f"repository {url} is owned by {name}, but braid runs as {_user(me)}: run it as {name} (sudo -u {name} braid {command} ...),"
        f" or give --allow-other-owner if {name} can still read what this user writes; nothing was written"
    )


def refuse_other_owner(args: argparse.Namespace) -> None:
    """The check for every repository the parsed command names (`--repo`/BRAID_REPO, `copy --to`)."""
    allow = bool(getattr(args, "allow_other_owner", False))
    command = str(getattr(args, "command", "") or "")
    if not hasattr(args, "repo"):
        return  # completion, manpage: no repository
    check_owner(args.repo or os.environ.get(ENV_REPO), allow, command)
    check_owner(getattr(args, "to", None), allow, command)
