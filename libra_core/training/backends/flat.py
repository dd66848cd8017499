"""Flat gradient vectors: one contiguous tensor per replica, the unit every reduction works on.

Used by the ddp backend and the elastic replicas (libra_core/elastic/replica.py): a flat vector is
what crosses the all-reduce and the hybrid side channel, in the order of `model.parameters()`.
"""

from __future__ import annotations

import torch


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Concatenate the gradients (zeros where a parameter has none) into one vector."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_flat_grad(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    assert offset == flat.numel(), f"flat gradient has {flat.numel()} values, parameters {offset}"


def clip_flat_(flat: torch.Tensor, max_norm: float | None) -> float:
    """Clip in place exactly as torch.nn.utils.clip_grad_norm_ does; return the norm before clipping."""
    norm = float(torch.linalg.vector_norm(flat))
    if max_norm is not None:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            flat.mul_(coef)
    return norm
