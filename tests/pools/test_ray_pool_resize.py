"""A Ray pool's resize that does not finish leaves none of the actors it added in the pool.

Ray is replaced by a stand-in that records the actors created and killed and fails the wait for the
new actors' first answer as the test asks: what is tested is the pool's own bookkeeping."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from libra_core.config.pools import RayPoolConfig
from libra_core.pools import ray_pool
from libra_core.pools.ray_pool import RayPool


class _Exceptions:
    class GetTimeoutError(Exception):
        pass

    class RayActorError(Exception):
        pass


class _Remote:
    def __init__(self, value: int) -> None:
        self.value = value

    def remote(self) -> int:
        return self.value


class _Actor:
    pids = itertools.count(1000)

    def __init__(self) -> None:
        self.pid = _Remote(next(self.pids))


class _ActorClass:
    def options(self, **resources: Any) -> _ActorClass:
        return self

    def remote(self) -> _Actor:
        return _Actor()


class _FakeRay:
    exceptions = _Exceptions

    def __init__(self) -> None:
        self.killed: list[_Actor] = []
        self.fail: BaseException | None = None  # what the next `get` raises

    def is_initialized(self) -> bool:
        return True

    def get(self, refs: list[int], timeout: float | None = None) -> list[int]:
        if self.fail is not None:
            raise self.fail
        return list(refs)

    def kill(self, actor: _Actor, no_restart: bool = False) -> None:
        self.killed.append(actor)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> _FakeRay:
    fake = _FakeRay()
    monkeypatch.setattr(ray_pool, "_import_ray", lambda: fake)
    return fake


@pytest.mark.parametrize(
    "failure",
    [KeyboardInterrupt(), _Exceptions.RayActorError("the actor died starting"), SystemExit(1)],
    ids=["interrupt", "actor-died", "exit"],
)
def test_an_interrupted_or_failed_resize_removes_the_actors_it_added(
    fake_ray: _FakeRay, failure: BaseException
) -> None:
    """Only a timeout removed them: a Ctrl-C or a termination signal while the pool waited, or an
    actor dying on start, left actors the pool counted in its size but that never answered."""
    pool = RayPool(RayPoolConfig(start_timeout_s=5))
    pool._actor_cls = _ActorClass()
    pool.start(1)
    kept = pool._actors["w0"]
    fake_ray.fail = failure
    with pytest.raises(type(failure)):
        pool.resize(3)
    assert pool.worker_ids == ("w0",) and pool.size == 1
    assert len(fake_ray.killed) == 2 and kept not in fake_ray.killed
    fake_ray.fail = None
    pool.resize(2)  # the pool works on, with fresh ids
    assert pool.worker_ids == ("w0", "w3")


def test_a_resize_past_its_start_timeout_still_names_the_setting(fake_ray: _FakeRay) -> None:
    pool = RayPool(RayPoolConfig(start_timeout_s=5))
    pool._actor_cls = _ActorClass()
    fake_ray.fail = _Exceptions.GetTimeoutError()
    with pytest.raises(
        RuntimeError, match=r"2 new worker\(s\) did not start within 5 s \(pools.ray.start_timeout_s\)"
    ):
        pool.start(2)
    assert pool.size == 0 and len(fake_ray.killed) == 2
