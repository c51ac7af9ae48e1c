"""The repository's price table: read (over the defaults), written by `braid prices set`, removed by `reset`.

Stored at `prices.json` (braid.format.layout.PRICES), in the repository,
so every host that shows a backup's cost prices it alike. Not sealed: it
holds no secret and changes no backup, only what `show` prints; a table
that does not parse is an error naming the file, never a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping

from braid.errors import NotFoundError
from braid.format.layout import PRICES
from braid.format.prices import DEFAULT, PriceTable, parse_prices
from braid.ports.store import ObjectStore


def load_prices(store: ObjectStore) -> PriceTable:
    """The repository's table, or the defaults when it stores none."""
    try:
        raw = store.get(PRICES)
    except NotFoundError:
        return DEFAULT
    return parse_prices(raw, f"{store.url}/{PRICES}")


def set_prices(store: ObjectStore, settings: Mapping[str, str]) -> PriceTable:
    """Apply `KEY=VALUE` settings to the stored table (or the defaults) and store the result."""
    table = load_prices(store).with_settings(settings)
    store.put(PRICES, table.to_bytes())
    return table


def reset_prices(store: ObjectStore) -> PriceTable:
    """Remove the stored table: the defaults apply again."""
    store.delete([PRICES])
    return DEFAULT
