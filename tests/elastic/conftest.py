"""Fixtures for the elastic tests: a local pool of 3 single-thread workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from libra_core.pools.local import LocalPool


@pytest.fixture
def pool3() -> Iterator[LocalPool]:
    pool = LocalPool()
    pool.start(3)
    try:
        yield pool
    finally:
        pool.stop()
