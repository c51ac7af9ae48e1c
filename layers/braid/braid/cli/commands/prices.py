"""`braid prices show|set KEY=VALUE...|reset`: the price table `show` prices each backup's usage with.

The table lives in the repository (braid.ops.prices), so every host prices
alike; a user sets the prices of their region, discount or currency here
or by editing `prices.json` (docs/cloud.md, Cost of a backup).
"""

from __future__ import annotations

import argparse

from braid.cli.compose import open_repository, repo_url
from braid.cli.render import print_prices
from braid.errors import UsageError
from braid.ops.prices import load_prices, reset_prices, set_prices


def parse_settings(words: list[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, not {word!r} (e.g. s3_put_request=0.0000054; 'braid prices show' lists the keys)")
        settings[key.strip()] = value
    return settings


def cmd_prices(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    if args.action != "set" and args.settings:
        raise UsageError(f"'braid prices {args.action}' takes no KEY=VALUE settings")
    if args.action == "set":
        if not args.settings:
            raise UsageError("'braid prices set' needs at least one KEY=VALUE")
        table = set_prices(repository.store, parse_settings(args.settings))
    elif args.action == "reset":
        table = reset_prices(repository.store)
    else:
        table = load_prices(repository.store)
    print_prices(table, args.json)
    return 0
