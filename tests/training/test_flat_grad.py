"""Flat gradients (training/backends/flat.py): the elastic pool's updates travel flat and arrive on
the CPU; they are set on the parameters' device."""

from __future__ import annotations

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
