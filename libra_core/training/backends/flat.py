"""Flat gradient vectors: one contiguous tensor per replica, the unit every reduction works on.

Used by the ddp backend and the elastic replicas (libra_core/elastic/replica.py): a flat vector is
what crosses the all-reduce and the hybrid side channel, in the order of `model.parameters()`.
"""

from __future__ import annotations

import math

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
        # a copy, on the parameter's device (a hybrid's update arrives on the CPU: elastic/wire.py)
        # and in its dtype (the vector of a bf16 model with fp32 norms is fp32: torch.cat promotes)
        p.grad = flat[offset : offset + n].view_as(p).to(device=p.device, dtype=p.dtype, copy=True)
        offset += n
    assert offset == flat.numel(), f"flat gradient has {flat.numel()} values, parameters {offset}"


def clip_flat_(flat: torch.Tensor, max_norm: float | None, *, what: str = "the averaged gradient") -> float:
    """Clip in place exactly as torch.nn.utils.clip_grad_norm_ does; return the norm before clipping.

    Raises FloatingPointError, leaving `flat` untouched, when the norm is NaN or infinite: clipping
    would not catch it (a NaN clip factor, and `nan < 1.0` is False) and one optimizer step would put
    NaN in the weights and the optimizer state for good. Every caller clips before it applies
    anything, so nothing has been applied when this raises. `what` names the vector in the message.
    """
    # in fp32: an fp16 vector's own-dtype norm is inf past 65504 with every element finite
    norm = float(torch.linalg.vector_norm(flat, dtype=torch.promote_types(flat.dtype, torch.float32)))
    if not math.isfinite(norm):
        raise FloatingPointError(
            f"{what} norm is {norm}; nothing applied (check the loss, its inputs and the learning rate)"
        )
    if max_norm is not None:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            flat.mul_(coef)
    return norm
