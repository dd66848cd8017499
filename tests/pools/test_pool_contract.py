"""Contract of every pool backend (parametrised over the registry): start, run, state, resize,
errors, kill and health. Calls use stdlib functions so every backend can import them in a worker."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from collections.abc import Iterator

import pytest

from libra_core.config.pools import PoolsConfig
from libra_core.pools.base import WorkerDiedError, WorkerPool
from libra_core.pools.registry import build_pool, pool_names, register_pool

HAVE_RAY = importlib.util.find_spec("ray") is not None

BACKENDS = [
    "local",
    pytest.param(
        "ray",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (optional extra `ray`)"),
        ],
    ),
]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the module (start-up costs seconds); pools attach to it."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(params=BACKENDS)
def pool(request: pytest.FixtureRequest) -> Iterator[WorkerPool]:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        cfg = PoolsConfig.model_validate({"type": "ray", "ray": {"num_cpus_per_worker": 0.5}})
    else:
        cfg = PoolsConfig()
    p = build_pool(cfg)
    try:
        yield p
    finally:
        p.stop()


def test_registry_lists_backends_and_rejects_unknown() -> None:
    assert pool_names() == ("local", "ray")
    with pytest.raises(ValueError, match=r"unknown pool backend 'k8s'; valid names: local, ray"):
        build_pool(PoolsConfig(), "k8s")
    with pytest.raises(ValueError, match="already registered"):
        register_pool("local", lambda cfg: build_pool(cfg, "local"))


def test_start_run_and_distinct_processes(pool: WorkerPool) -> None:
    record = pool.start(2)
    assert (record.from_size, record.to_size, record.added, record.removed) == (0, 2, ("w0", "w1"), ())
    assert record.duration_s > 0
    pids = {w: pool.run(w, os.getpid, timeout_s=30) for w in pool.worker_ids}
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    assert pool.run("w1", math.hypot, 3.0, 4.0, timeout_s=30) == 5.0


def test_worker_keeps_state_between_calls(pool: WorkerPool) -> None:
    pool.start(2)
    pool.run("w0", sys.setrecursionlimit, 4321, timeout_s=30)
    assert pool.run("w0", sys.getrecursionlimit, timeout_s=30) == 4321
    assert pool.run("w1", sys.getrecursionlimit, timeout_s=30) != 4321


def test_calls_on_one_worker_run_in_order_and_workers_run_in_parallel(pool: WorkerPool) -> None:
    pool.start(2)
    t0 = time.perf_counter()
    futures = [pool.submit(w, time.sleep, 1.0) for w in ("w0", "w1")]
    for f in futures:
        f.result(timeout=30)
    assert time.perf_counter() - t0 < 1.9, "two workers must sleep in parallel"
    first = pool.submit("w0", time.sleep, 0.5)
    second = pool.submit("w0", time.monotonic)
    done_at = second.result(timeout=30)
    assert first.done() and done_at > 0


def test_errors_propagate_and_unknown_worker_is_keyerror(pool: WorkerPool) -> None:
    pool.start(1)
    with pytest.raises(ValueError, match="math domain error"):
        pool.run("w0", math.sqrt, -1.0, timeout_s=30)
    assert pool.run("w0", math.sqrt, 4.0, timeout_s=30) == 2.0  # the worker survives its error
    with pytest.raises(KeyError, match="no worker 'w9'"):
        pool.submit("w9", os.getpid)


def test_resize_grows_with_fresh_ids_and_shrinks_lifo(pool: WorkerPool) -> None:
    pool.start(1)
    grow = pool.resize(3)
    assert grow.added == ("w1", "w2") and grow.to_size == 3 and pool.worker_ids == ("w0", "w1", "w2")
    shrink = pool.resize(1)
    assert shrink.removed == ("w2", "w1") and shrink.added == () and pool.worker_ids == ("w0",)
    regrow = pool.resize(2)
    assert regrow.added == ("w3",), "ids are never reused"
    with pytest.raises(ValueError, match="must be >= 0"):
        pool.resize(-1)


def test_kill_fails_pending_call_and_leaves_others_healthy(pool: WorkerPool) -> None:
    pool.start(2)
    pool.run("w1", os.getpid, timeout_s=30)
    pending = pool.submit("w1", time.sleep, 30.0)
    time.sleep(0.5)
    health = pool.health(timeout_s=10)
    assert health["w1"].state == "ok", "a busy worker is alive, not dead"
    pool.kill("w1")
    with pytest.raises(WorkerDiedError):
        pending.result(timeout=30)
    assert pool.worker_ids == ("w0",)
    assert {w: h.state for w, h in pool.health(timeout_s=10).items()} == {"w0": "ok"}
    assert pool.run("w0", math.hypot, 6.0, 8.0, timeout_s=30) == 10.0


def test_sys_exit_in_a_call_ends_that_worker_not_the_driver(pool: WorkerPool) -> None:
    """`sys.exit` in a call is the worker's exit (a Ray actor's too): the driver gets
    WorkerDiedError, never the SystemExit that would end its own process."""
    pool.start(2)
    exiting = pool.submit("w0", sys.exit, 3)
    with pytest.raises(WorkerDiedError):
        exiting.result(timeout=60)
    assert {w: h.state for w, h in pool.health(timeout_s=10).items()} == {"w0": "dead", "w1": "ok"}
    assert pool.run("w1", math.hypot, 3.0, 4.0, timeout_s=30) == 5.0


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (optional extra `ray`)")
def test_a_ray_worker_the_cluster_cannot_place_fails_the_resize(ray_cluster: None) -> None:
    cfg = PoolsConfig.model_validate({"type": "ray", "ray": {"num_gpus_per_worker": 1, "start_timeout_s": 3}})
    p = build_pool(cfg)
    try:
        with pytest.raises(RuntimeError, match=r"did not start within 3 s .* 1 GPU each"):
            p.start(1)  # a CPU cluster has no GPU to give: it waited forever
        assert p.size == 0
    finally:
        p.stop()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (optional extra `ray`)")
def test_a_base_exception_in_a_ray_call_comes_back_as_a_runtime_error(ray_cluster: None) -> None:
    """As on the local pool (tests/pools/test_local_pool_faults.py): a BaseException other than
    SystemExit reached the driver as itself, past its `except Exception` handlers."""

    class Interrupt(BaseException):  # local: Ray's pickler sends it by value
        pass

    def interrupt() -> None:
        raise Interrupt("stop here")

    def keyboard() -> None:
        raise KeyboardInterrupt

    p = build_pool(PoolsConfig.model_validate({"type": "ray", "ray": {"num_cpus_per_worker": 0.5}}))
    try:
        p.start(1)
        pid = p.run("w0", os.getpid, timeout_s=60)
        for fn, shown in ((interrupt, r"Interrupt\('stop here'\)"), (keyboard, r"KeyboardInterrupt\(\)")):
            with pytest.raises(RuntimeError, match=rf"^worker w0: the call raised {shown}$"):
                p.run("w0", fn, timeout_s=60)
        assert p.run("w0", os.getpid, timeout_s=60) == pid  # the same worker, alive
    finally:
        p.stop()


def test_a_call_gets_a_copy_of_its_arguments(pool: WorkerPool) -> None:
    # The local pool pickled calls with multiprocessing's ForkingPickler, which moves a torch tensor
    # into shared memory: a worker's in-place change reached the driver's tensor (Ray copies).
    import torch

    pool.start(1)
    sent = torch.ones(4)
    returned = pool.run(pool.worker_ids[0], torch.Tensor.mul_, sent, 100.0)
    assert returned.tolist() == [100.0] * 4
    assert sent.tolist() == [1.0] * 4 and not sent.is_shared()
