"""Single-process training: backward, clip, step. The reference every data-parallel backend must match."""

from __future__ import annotations

from typing import TYPE_CHECKING

from libra_core.training.backends.base import StepStats, TrainingBackend

if TYPE_CHECKING:
    import torch


class TorchBackend(TrainingBackend):
    name = "torch"

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        assert self.dist.world_size == 1, "the torch backend is single-process; use ddp or deepspeed"
        self._model, self.optimizer = model, optimizer

    def backward(self, loss: torch.Tensor) -> None:
        self._begin_backward()
        loss.backward()

    def step(self, *, grad_clip: float | None = None) -> StepStats:
        from libra_core.training.backends.flat import clip_flat_, flat_grad, set_flat_grad, trainable

        params = trainable(self._model)
        flat = flat_grad(params)
        try:
            norm = clip_flat_(flat, grad_clip)  # a non-finite norm raises before anything is applied
            set_flat_grad(params, flat)
            self.optimizer.step()
        finally:  # stepped or failed, the next backward starts clean (a failure left it refused)
            self.optimizer.zero_grad(set_to_none=True)
            self._backward_pending = False
        return StepStats(norm, 1)

    @property
    def model(self) -> torch.nn.Module:
        return self._model
