"""Contract of every training backend (parametrised over the registry): two replicas on shards 0 and
1 (one process on their mean loss for `torch`) end with the parameters of the static reference."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from libra_core.elastic import toy
from libra_core.elastic.toy import ToyProblem, reference_params
from libra_core.pools.local import LocalPool
from libra_core.training.backends.registry import backend_names, build_backend

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
STEPS = 4

CASES = [
    pytest.param("torch", 1, {}, id="torch"),
    pytest.param("ddp", 2, {}, id="ddp-gloo", marks=pytest.mark.slow),
    *[
        pytest.param(
            "deepspeed",
            2,
            {"zero_stage": stage, "grad_clip": 1.0},
            id=f"deepspeed-zero{stage}",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(not HAVE_DEEPSPEED, reason="deepspeed is not installed (optional extra)"),
            ],
        )
        for stage in (1, 2)
    ],
]


@pytest.fixture
def pool() -> Iterator[LocalPool]:
    # Fresh workers per case: DeepSpeed keeps process-global group state that outlives a backend.
    p = LocalPool()
    p.start(2)
    try:
        yield p
    finally:
        p.stop()


def _init_method() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_registry_names_and_unknown_backend() -> None:
    assert backend_names() == ("ddp", "deepspeed", "torch")
    with pytest.raises(
        ValueError, match="unknown training backend 'megatron'; valid names: ddp, deepspeed, torch"
    ):
        build_backend("megatron")


@pytest.mark.parametrize(("name", "world", "options"), CASES)
def test_backend_matches_static_reference(pool: LocalPool, name: str, world: int, options: dict) -> None:
    problem = ToyProblem(dtype="float32")
    init = _init_method() if world > 1 else None
    futures = [
        pool.submit(f"w{r}", toy.backend_train, problem, name, r, world, init, STEPS, **options)
        for r in range(world)
    ]
    params = [f.result(timeout=300) for f in futures]
    expected = reference_params(problem, [(0, 1)] * STEPS)
    for p in params:
        np.testing.assert_allclose(p, expected, rtol=0, atol=2e-5)
    assert not np.allclose(expected, reference_params(problem, [(0,)] * STEPS), atol=2e-5)


@pytest.mark.parametrize("name", ["torch", "ddp"])
def test_a_second_backward_before_step_is_refused(name: str) -> None:
    # Accumulation is outside the contract: DeepSpeed (gradient_accumulation_steps 1) would keep only
    # the last micro-batch where torch and ddp sum the means.
    import torch

    problem = ToyProblem()
    model = problem.model()
    backend = build_backend(name)
    backend.setup(model, problem.optimizer(model))
    backend.backward(problem.loss(model, 0, 0))
    with pytest.raises(AssertionError, match=f"{name}: backward\\(\\) called twice before step\\(\\)"):
        backend.backward(problem.loss(model, 0, 0))
    before = [p.detach().clone() for p in model.parameters()]
    backend.step(grad_clip=problem.grad_clip)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    backend.backward(problem.loss(model, 0, 1))  # the next step's backward is fine
    backend.close()


@pytest.mark.parametrize("spec_world", [1, 2])
def test_ddp_refuses_a_spec_that_disagrees_with_the_process_group(tmp_path, spec_world: int) -> None:  # noqa: ANN001
    """A group of 2 with the default spec (world_size 1) skipped the all-reduce: each rank stepped
    on its own gradient. Here a 1-rank group stands in for the launcher's group."""
    import torch
    import torch.distributed as dist

    from libra_core.training.backends.base import DistSpec
    from libra_core.training.backends.ddp import DDPBackend

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 1)
        backend = DDPBackend(DistSpec(rank=0, world_size=spec_world, init_method="tcp://127.0.0.1:1"))
        if spec_world == 1:
            backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))  # agrees: accepted
        else:
            match = "rank 0 of 1, but the ddp backend was built for rank 0 of 2"
            with pytest.raises(ValueError, match=match):
                backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["ddp", "deepspeed"])
def test_close_leaves_a_process_group_the_backend_did_not_create(tmp_path, name: str) -> None:  # noqa: ANN001
    # deepspeed's close destroyed any group, the launcher's included (ddp tracked ownership).
    import torch.distributed as dist

    from libra_core.training.backends.base import DistSpec
    from libra_core.training.backends.ddp import DDPBackend
    from libra_core.training.backends.deepspeed_backend import DeepSpeedBackend

    backend = {"ddp": DDPBackend, "deepspeed": DeepSpeedBackend}[name](DistSpec())
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        backend.close()
        assert dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_ddp_reduce_counts_replicas_exactly_in_any_dtype(dtype: str) -> None:
    # the count travelled in the gradient's dtype: bfloat16 read 257 replicas as 256
    import torch

    from libra_core.training.backends.base import DistSpec
    from libra_core.training.backends.ddp import DDPBackend

    model = torch.nn.Linear(4, 1).to(getattr(torch, dtype))
    backend = DDPBackend(DistSpec(0, 1))
    backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    flat = torch.zeros(5, dtype=model.weight.dtype)
    avg, divisor = backend.reduce(flat, extra_sum=torch.full_like(flat, 64.0), extra_count=2300)
    assert divisor == 2301
    assert float(avg[0]) == pytest.approx(64 / 2301, rel=1e-2)
    same, one = backend.reduce(flat + 3.0)
    assert one == 1 and float(same[0]) == 3.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_ddp_reduce_sums_half_precision_without_overflow(dtype: str) -> None:
    # Two hybrids' fp16 payloads of 4e4 each (every check passed) summed to inf in fp16 before the
    # division, so every core rank stopped though the average, 2.7e4, is an fp16 value.
    import torch

    from libra_core.training.backends.base import DistSpec
    from libra_core.training.backends.ddp import DDPBackend

    model = torch.nn.Linear(4, 1).to(getattr(torch, dtype))
    backend = DDPBackend(DistSpec(0, 1))
    backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    flat = torch.full((5,), 4e4, dtype=model.weight.dtype)
    hybrids = torch.full((5,), 8e4, dtype=torch.float32)  # the gateway's fp32 sum of two payloads
    avg, divisor = backend.reduce(flat, extra_sum=hybrids, extra_count=2)
    assert divisor == 3 and avg.dtype == flat.dtype
    assert float(avg[0]) == pytest.approx(4e4, rel=1e-2)
