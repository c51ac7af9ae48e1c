"""format_size at every unit's boundaries: never scientific notation (issue 25, F4: `1.02e+03 MiB`)."""

from __future__ import annotations

import re

import pytest

from braid.cli.sizes import format_size

UNITS = ["KiB", "MiB", "GiB", "TiB"]


@pytest.mark.parametrize("power", [1, 2, 3, 4])
@pytest.mark.parametrize("count", [99.94, 99.96, 100, 999, 999.4, 999.6, 1000, 1000.5, 1010, 1023, 1023.4, 1023.99])
def test_no_scientific_notation_near_a_unit_boundary(power: int, count: float) -> None:
    text = format_size(count * 1024**power)
    assert "e+" not in text and "e-" not in text, text
    assert re.fullmatch(r"\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)", text), text


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1000 * 1024**2, "1000 MiB"),
        (1023 * 1024**2, "1023 MiB"),
        (int(1023.6 * 1024**2), "1 GiB"),
        (1024**3, "1 GiB"),
        (int(1.5 * 1024**3), "1.5 GiB"),
        (int(99.5 * 1024**2), "99.5 MiB"),
        (int(512.4 * 1024**2), "512 MiB"),
        (5000 * 1024**4, "5000 TiB"),
        (1059061760, "1010 MiB"),
    ],
)
def test_boundaries(n: int, expected: str) -> None:
    assert format_size(n) == expected
