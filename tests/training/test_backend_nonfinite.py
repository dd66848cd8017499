"""A non-finite gradient stops a backend's step before anything is applied (torch and ddp): before,
clipping let it through (a NaN clip factor, and `nan < 1.0` is False) and one step put NaN in the
weights and the optimizer state for good, where run_grpo_update and the elastic core raised."""

from __future__ import annotations

import pytest
import torch

from libra_core.training.backends.flat import clip_flat_
from libra_core.training.backends.registry import build_backend


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("grad_clip", [1.0, None], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("name", ["torch", "ddp"])
def test_a_non_finite_gradient_raises_before_any_weight_or_optimizer_state_changes(
    name: str, grad_clip: float | None, bad: float
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    backend = build_backend(name)
    backend.setup(model, optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    backend.backward((model(torch.ones(1, 3)) * bad).sum())
    with pytest.raises(FloatingPointError, match=r"gradient norm is (nan|inf); nothing applied"):
        backend.step(grad_clip=grad_clip)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert optimizer.state_dict()["state"] == {}  # no Adam moments were written
    # The failed step dropped its gradient: the next batch trains normally.
    backend.backward(model(torch.ones(1, 3)).sum())
    stats = backend.step(grad_clip=grad_clip)
    assert torch.isfinite(torch.tensor(stats.grad_norm))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    backend.close()


def test_clip_flat_leaves_a_non_finite_vector_untouched_and_names_it() -> None:
    flat = torch.tensor([3.0, float("nan")])
    with pytest.raises(FloatingPointError, match="core step 7: the reduced gradient norm is nan"):
        clip_flat_(flat, 1.0, what="core step 7: the reduced gradient")
    assert flat[0].item() == 3.0 and torch.isnan(flat[1])
    finite = torch.tensor([3.0, 4.0])
    assert clip_flat_(finite, 1.0) == 5.0 and torch.allclose(finite, torch.tensor([0.6, 0.8]), atol=1e-6)
