"""Flat gradients (training/backends/flat.py): the elastic pool's updates travel flat and arrive on
the CPU; they are set on the parameters' device."""

from __future__ import annotations

import pytest
import torch

from libra_core.training.backends.flat import flat_grad, set_flat_grad


def test_set_flat_grad_copies_onto_each_parameter_device() -> None:
    # `meta` stands in for a GPU here: a CPU update set on a GPU parameter raised ("attempting to
    # assign a gradient with device type 'cpu' to a tensor with device type 'cuda'").
    on_device = [
        torch.nn.Parameter(torch.empty(2, 3, device="meta")),
        torch.nn.Parameter(torch.empty(4, device="meta")),
    ]
    set_flat_grad(on_device, torch.arange(10, dtype=torch.float32))
    assert [p.grad.device.type for p in on_device] == ["meta", "meta"]  # type: ignore[union-attr]
    assert [p.grad.shape for p in on_device] == [(2, 3), (4,)]  # type: ignore[union-attr]


def test_set_flat_grad_round_trips_and_copies() -> None:
    params = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(3))]
    flat = torch.arange(7, dtype=torch.float32)
    set_flat_grad(params, flat)
    assert torch.equal(flat_grad(params), flat)
    flat[0] = 100.0  # the gradients are copies, not views of the update
    assert params[0].grad is not None and params[0].grad[0, 0] == 0.0


def test_an_fp16_vector_past_fp16s_range_has_a_finite_norm_and_is_clipped() -> None:
    # Five elements of 4e4 (each finite in fp16): the norm in fp16 was inf, and the step of the
    # ddp reduce that had just summed them in fp32 failed with "gradient norm is inf".
    from libra_core.training.backends.flat import clip_flat_

    flat = torch.full((5,), 4e4, dtype=torch.float16)
    norm = clip_flat_(flat, 1.0)
    assert norm == pytest.approx(4e4 * 5**0.5, rel=1e-3)
    assert torch.linalg.vector_norm(flat.float()).item() == pytest.approx(1.0, rel=1e-2)


@pytest.mark.parametrize("name", ["torch", "ddp"])
def test_a_bf16_model_with_fp32_norms_steps_as_plain_torch_does(name: str) -> None:
    # flat_grad promotes to fp32 (torch.cat); setting it back on a bf16 parameter raised ("a
    # gradient with dtype 'float' to a tensor with grad_dtype 'BFloat16'") and left the backend
    # refusing every later backward ("backward() called twice before step()").
    from libra_core.training.backends.registry import build_backend

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.bfloat16), torch.nn.LayerNorm(4))

    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = model()
    ref[1](ref[0](x).float()).sum().backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    torch.optim.SGD(ref.parameters(), lr=0.1).step()

    ours = model()
    backend = build_backend(name)
    backend.setup(ours, torch.optim.SGD(ours.parameters(), lr=0.1))
    for step in range(2):  # the second step checks nothing was left pending
        start = [p.detach().clone() for p in ours.parameters()]
        backend.backward(ours[1](ours[0](x).float()).sum())
        backend.step(grad_clip=0.5)
        if step == 0:
            for p, r in zip(ours.parameters(), ref.parameters(), strict=True):
                assert p.dtype == r.dtype and torch.allclose(p.float(), r.float(), atol=1e-2)
    assert any(not torch.equal(p, s) for p, s in zip(ours.parameters(), start, strict=True))
    backend.close()
