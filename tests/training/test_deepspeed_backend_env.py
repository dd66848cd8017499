"""The deepspeed backend's process-level set-up, in this process (one rank on gloo, about a second
per engine): ranks come from DistSpec, not inherited launcher variables; a single replica needs no
port; a second backend works after close(); step() refuses a clip DeepSpeed would not apply, and
raises on a non-finite gradient as torch and ddp do."""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed (optional extra)"
)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from libra_core.training.backends.base import DistSpec  # noqa: E402
from libra_core.training.backends.deepspeed_backend import DeepSpeedBackend  # noqa: E402

X = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _restore_rank_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # setup() writes these into os.environ; monkeypatch puts the originals back afterwards.
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():  # a failed test must not hand its group to the next one
        dist.destroy_process_group()


@pytest.fixture
def port_29500_taken() -> Iterator[None]:
    """Another job on the host holds the port the backend used to fall back to."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 29500))
            s.listen()
        except OSError:
            pass  # already held by someone else: just as taken
        yield


def _file_init(tmp_path: Path, name: str = "rendezvous") -> str:
    return f"file://{tmp_path / name}"


def _train(backend: DeepSpeedBackend, clip: float | None = 1.0) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    backend.setup(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    try:
        for _ in range(2):
            backend.backward(((backend.model(X) - 5) ** 2).mean())
            backend.step(grad_clip=clip)
        return model.weight.detach().clone()
    finally:
        backend.close()


def test_setup_takes_ranks_from_the_distspec_not_from_inherited_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver started by torchrun/SLURM inherits the launcher's variables; setdefault kept them and
    # the engine picked its device from the launcher's LOCAL_RANK.
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    backend = DeepSpeedBackend(DistSpec(0, 1, _file_init(tmp_path)), zero_stage=1, grad_clip=1.0)
    model = torch.nn.Linear(4, 1)
    backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        assert backend.engine.local_rank == 0
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("0", "0", "1")
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("spec", "local_rank"),
    [(DistSpec(1, 2, device="cuda:3"), 3), (DistSpec(1, 2, device="cuda"), 1), (DistSpec(2, 4), 2)],
)
def test_local_rank_is_the_cuda_device_index_else_the_rank(spec: DistSpec, local_rank: int) -> None:
    from libra_core.training.backends.deepspeed_backend import _local_rank

    assert _local_rank(spec) == local_rank


@pytest.mark.usefixtures("port_29500_taken")
def test_a_single_replica_without_init_method_needs_no_fixed_port() -> None:
    # It fell back to tcp://127.0.0.1:29500: a second job on the host failed with EADDRINUSE.
    _train(DeepSpeedBackend(DistSpec(), zero_stage=1, grad_clip=1.0))
    assert not dist.is_initialized()


@pytest.mark.usefixtures("port_29500_taken")
def test_several_replicas_without_init_method_are_refused_before_any_group() -> None:
    backend = DeepSpeedBackend(DistSpec(0, 2), zero_stage=1)
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"2-replica deepspeed job needs DistSpec\.init_method"):
        backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert not dist.is_initialized()


def test_a_second_backend_in_the_same_process_works_after_close(tmp_path: Path) -> None:
    # close() destroyed the group but DeepSpeed kept its clone of it: "Group ... is not registered".
    first = _train(DeepSpeedBackend(DistSpec(0, 1, _file_init(tmp_path, "a")), zero_stage=2, grad_clip=1.0))
    assert not dist.is_initialized()
    second = _train(DeepSpeedBackend(DistSpec(0, 1, _file_init(tmp_path, "b")), zero_stage=2, grad_clip=1.0))
    torch.testing.assert_close(second, first, rtol=0, atol=0)


@pytest.mark.parametrize(("configured", "asked"), [(0.01, None), (0.01, 1.0), (None, 1.0), (0.0, 1.0)])
def test_step_refuses_a_clip_other_than_the_configured_one(
    tmp_path: Path, configured: float | None, asked: float | None
) -> None:
    # step(grad_clip=None) means "no clipping" to torch and ddp, but DeepSpeed still clipped at 0.01.
    backend = DeepSpeedBackend(DistSpec(0, 1, _file_init(tmp_path)), zero_stage=1, grad_clip=configured)
    model = torch.nn.Linear(4, 1)
    backend.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        before = model.weight.detach().clone()
        backend.backward(((backend.model(X) - 5) ** 2).mean())
        with pytest.raises(ValueError, match=f"deepspeed clips at {configured} .* grad_clip={asked}"):
            backend.step(grad_clip=asked)
        assert torch.equal(model.weight, before)  # nothing applied
        backend.step(grad_clip=configured)  # the configured value still steps
        assert not torch.equal(model.weight, before)
    finally:
        backend.close()


@pytest.mark.parametrize(("configured", "asked"), [(None, None), (0.0, None), (1.0, 1.0)])
def test_step_accepts_the_configured_clip(
    tmp_path: Path, configured: float | None, asked: float | None
) -> None:
    backend = DeepSpeedBackend(DistSpec(0, 1, _file_init(tmp_path)), zero_stage=1, grad_clip=configured)
    _train(backend, clip=asked)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_non_finite_gradient_raises_like_torch_and_ddp_and_the_next_step_trains(
    tmp_path: Path, bad: float
) -> None:
    # DeepSpeed skips such a step quietly and reports the norm as inf (for NaN too): step() returned
    # StepStats(grad_norm=inf) as if it had trained, where torch and ddp raise.
    backend = DeepSpeedBackend(DistSpec(0, 1, _file_init(tmp_path)), zero_stage=2, grad_clip=1.0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    backend.setup(model, optimizer)
    try:
        before = [p.detach().clone() for p in backend.model.parameters()]
        backend.backward((backend.model(X) * bad).sum())
        with pytest.raises(FloatingPointError, match=r"the averaged gradient norm is inf; nothing applied"):
            backend.step(grad_clip=1.0)
        assert all(torch.equal(p, b) for p, b in zip(backend.model.parameters(), before, strict=True))
        backend.backward(((backend.model(X) - 5) ** 2).mean())  # not refused as a second backward
        assert torch.isfinite(torch.tensor(backend.step(grad_clip=1.0).grad_norm))
        assert not torch.equal(backend.model.weight, before[0])
    finally:
        backend.close()
