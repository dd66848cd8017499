"""Edge cases of bucket parsing and quantile bucket bounds in `libra_core.traces.evaluate`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from libra_core.traces.evaluate import parse_buckets, quantile_buckets


def _trace(*sizes: int) -> list[SimpleNamespace]:
    # quantile_buckets reads only `.size` of each trajectory of a non-table trace.
    return [SimpleNamespace(size=s) for s in sizes]


def test_parse_buckets_rejects_repeated_bound() -> None:
    # Regression: strict ascent (`b <= a`) weakened so "2000,2000" was accepted.
    with pytest.raises(ValueError, match="strictly ascending"):
        parse_buckets("2000,2000")


def test_parse_buckets_accepts_ascending() -> None:
    # Guard for the rejection above: distinct ascending bounds parse.
    assert parse_buckets("2000,8000") == (2000, 8000)


def test_quantile_buckets_median_is_lower_middle() -> None:
    # Regression: the quantile index (ceil(q * n) - 1) shifted, picking 40 instead of 30.
    assert quantile_buckets(_trace(50, 20, 40, 30), [0.5]) == (30,)


def test_quantile_buckets_quartiles() -> None:
    # Regression: quartile picks off by one position (expected 20 and 40 of 20/30/40/50).
    assert quantile_buckets(_trace(20, 30, 40, 50), [0.25, 0.75]) == (20, 40)
