"""What a local worker sends back must load in the driver: a value that pickles but cannot be
rebuilt there used to kill the reader thread and leave the call waiting forever."""

from __future__ import annotations

import pytest

from libra_core.pools.local import LocalPool


class TwoArgError(Exception):
    """Pickles as `TwoArgError(message)`, which its two-argument __init__ cannot rebuild."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


def raise_two_arg_error() -> None:
    raise TwoArgError("runs/x", "bad")


def test_an_exception_the_driver_cannot_rebuild_is_reported_not_hung() -> None:
    pool = LocalPool()
    try:
        pool.start(1)
        with pytest.raises(
            RuntimeError, match=r"the exception of .* cannot be sent to the driver .*runs/x: bad"
        ):
            pool.run("w0", raise_two_arg_error, timeout_s=30)
        assert pool.run("w0", divmod, 7, 2, timeout_s=30) == (3, 1)  # the worker and its reader live on
    finally:
        pool.stop()
