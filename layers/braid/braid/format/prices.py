"""The price table: what one unit of each counted quantity costs, and a usage priced with it.

One table in one place. `DEFAULT` holds AWS's us-east-1 list prices (arm64
Lambda, S3 Standard, Step Functions, KMS); a repository may store its own,
`prices.json` (braid.format.layout.PRICES), for another region, a discount
or a currency: every key it sets overrides the default, every key it leaves
out keeps it. `braid prices show|set|reset` edits it; the file is plain
indented JSON a person may edit too:

    {"version": 1, "name": "eu-central-1", "date": "2026-11-01", "currency": "USD",
     "prices": {"lambda_gb_second": 0.0000133334, "s3_put_request": 0.0000054, ...}}

Prices are per single unit (one request, one GB-second, one GB-month; GB is
2^30 bytes, as AWS bills), so a table reads without a "per 1,000" column.
A usage is a record of quantities (braid.format.usage); `price` turns it
into lines of item, quantity and cost, so the stored manifests never hold a
price that may have changed since.

The benchmark model (scripts/bench cloud-model) prices its simulated
backups with the same DEFAULT.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from braid.errors import IntegrityError, UsageError
from braid.format.usage import Billed, Usage

VERSION = 1
GB = 2**30

# key -> (what one unit is, us-east-1 list price in USD)
_DEFAULTS: dict[str, tuple[str, float]] = {
    # $0.20 per million invocations, $0.005 per 1,000 PUTs, ...: written out per unit.
    "lambda_request": ("a Lambda invocation", 0.0000002),
    "lambda_gb_second": ("a GB-second of arm64 Lambda duration", 0.0000133334),
    "s3_put_request": ("an S3 PUT, COPY, POST or LIST request", 0.000005),
    "s3_get_request": ("an S3 GET, HEAD or other request", 0.0000004),
    "sfn_transition": ("a Step Functions Standard state transition", 0.000025),
    "sfn_express_request": ("a Step Functions Express (map child) request", 0.000001),
    "sfn_express_gb_second": ("a GB-second of Express duration", 0.00001667),
    "kms_request": ("a KMS request", 0.000003),
    "s3_storage_gb_month": ("a GB-month of S3 Standard storage", 0.023),
    # Old backups' chunks (braid.format.storage_class); source and date: docs/design/2026-11-28-storage-classes.md.
    "s3_standard_ia_gb_month": ("a GB-month of S3 Standard-IA storage (30-day minimum)", 0.0125),
    "s3_glacier_ir_gb_month": ("a GB-month of S3 Glacier Instant Retrieval storage (90-day minimum)", 0.004),
}
PRICE_KEYS = tuple(_DEFAULTS)
UNITS = {key: unit for key, (unit, _) in _DEFAULTS.items()}
META_KEYS = ("name", "date", "currency")


@dataclass(frozen=True)
class PriceTable:
    name: str
    date: str  # when its prices were read off the price list
    currency: str
    prices: Mapping[str, float]
    stored: bool = False  # a repository's own table (some keys may still be the default)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "name": self.name, "date": self.date, "currency": self.currency, "prices": dict(sorted(self.prices.items()))}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=2, sort_keys=True).encode() + b"\n"

    def with_settings(self, settings: Mapping[str, str]) -> PriceTable:
        """This table with `KEY=VALUE` settings applied (`braid prices set`): price keys take numbers, name/date/currency text."""
        prices = dict(self.prices)
        meta = {"name": self.name, "date": self.date, "currency": self.currency}
        for key, text in settings.items():
            if key in META_KEYS:
                if not text.strip():
                    raise UsageError(f"{key} must not be empty")
                meta[key] = text.strip()
            elif key in _DEFAULTS:
                prices[key] = _price(text, key)
            else:
                raise UsageError(f"unknown price {key!r}: one of {', '.join((*PRICE_KEYS, *META_KEYS))}")
        return PriceTable(meta["name"], meta["date"], meta["currency"], prices, stored=True)


DEFAULT = PriceTable("aws us-east-1 list prices", "2026-11-23", "USD", {key: price for key, (_, price) in _DEFAULTS.items()})


def _price(value: Any, key: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise UsageError(f"price {key} must be a number, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UsageError(f"price {key} must be a non-negative number, not {value!r}")
    return float(value)


def _number(value: Any, key: str) -> Any:
    """In the file a price is a JSON number, never text."""
    if isinstance(value, str):
        raise UsageError(f"price {key} must be a non-negative number, not {value!r}")
    return value


def parse_prices(raw: bytes, where: str) -> PriceTable:
    """A stored table over DEFAULT; IntegrityError naming `where` for anything else, so no cost is ever shown from a table half read."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not set(doc) <= {"version", *META_KEYS, "prices"}:
            raise UsageError(f"expected {{'version': {VERSION}, 'name', 'date', 'currency', 'prices': {{...}}}}")
        prices = doc.get("prices", {})
        if not isinstance(prices, dict):
            raise UsageError("prices must be an object")
        unknown = sorted(set(prices) - set(_DEFAULTS))
        if unknown:
            raise UsageError(f"unknown price {', '.join(unknown)}")
        meta = {key: doc.get(key, getattr(DEFAULT, key)) for key in META_KEYS}
        if not all(isinstance(v, str) and v for v in meta.values()):
            raise UsageError("name, date and currency must be non-empty text")
        table = replace(DEFAULT, **meta, prices={**DEFAULT.prices, **{k: _price(_number(v, k), k) for k, v in prices.items()}}, stored=True)
    except (ValueError, UsageError) as exc:
        raise IntegrityError(f"price table {where} is not valid ({exc}); fix it, or go back to the defaults with 'braid prices reset'") from None
    return table


def significant(amount: float) -> float:
    """Six significant digits: a small backup costs fractions of a cent, and the JSON shows no float noise."""
    return float(f"{amount:.6g}")


@dataclass(frozen=True)
class CostLine:
    item: str
    quantity: float
    unit_price: float
    cost: float

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "quantity": self.quantity, "unit_price": self.unit_price, "cost": significant(self.cost)}


@dataclass(frozen=True)
class Cost:
    """A usage priced: one line per billed item, their total, and the monthly cost of keeping the stored bytes."""

    currency: str
    table: str
    date: str
    lines: tuple[CostLine, ...] = field(default_factory=tuple)
    storage_per_month: float = 0.0

    @property
    def total(self) -> float:
        return sum(line.cost for line in self.lines)

    def to_json(self, lines: bool = True) -> dict[str, Any]:
        """`lines=False`: the totals only, as `list --json` gives them for each of thousands of backups."""
        doc = {
            "currency": self.currency,
            "prices": {"name": self.table, "date": self.date},
            "total": significant(self.total),
            "storage_per_month": significant(self.storage_per_month),
        }
        if lines:
            doc["lines"] = [line.to_json() for line in self.lines]
        return doc


# (item as `show` prints it, price key, billed quantity), in the order `show` prints them.
ITEMS = (
    ("lambda invocations", "lambda_request", "lambda_invocations"),
    ("lambda GB-seconds", "lambda_gb_second", "lambda_gb_seconds"),
    ("s3 PUT/COPY/POST/LIST requests", "s3_put_request", "s3_put_requests"),
    ("s3 GET/HEAD/other requests", "s3_get_request", "s3_get_requests"),
    ("step functions transitions", "sfn_transition", "sfn_transitions"),
    ("step functions express requests", "sfn_express_request", "sfn_express_requests"),
    ("step functions express GB-seconds", "sfn_express_gb_second", "sfn_express_gb_seconds"),
    ("kms requests", "kms_request", "kms_requests"),
)


def cost_totals(billed: Billed, table: PriceTable, storage_key: str = "s3_storage_gb_month") -> dict[str, Any]:
    """`Cost.to_json(lines=False)` of `price(billed, table)`, without the lines: `list --json` prices every backup.

    `storage_key`: the price of the class the backup's chunks are in (braid.format.storage_class.PRICE_KEYS)."""
    prices = table.prices
    total = sum(billed[name] * prices[key] for _, key, name in ITEMS)
    return {
        "currency": table.currency,
        "prices": {"name": table.name, "date": table.date},
        "total": significant(total),
        "storage_per_month": significant(billed["stored_bytes"] / GB * prices[storage_key]),
    }


def price(billed: Billed | Usage, table: PriceTable, storage_key: str = "s3_storage_gb_month") -> Cost:
    """The billed quantities (`Usage.billed`, or a summary's) priced with `table`, line by line; storage at `storage_key`'s price."""
    quantities = billed.billed() if isinstance(billed, Usage) else billed
    prices = table.prices
    lines = tuple(CostLine(item, quantities[name], prices[key], quantities[name] * prices[key]) for item, key, name in ITEMS)
    monthly = quantities["stored_bytes"] / GB * prices[storage_key]
    return Cost(table.currency, table.name, table.date, lines, monthly)
