"""The training-backend interface: one data-parallel replica's backward, reduction and step.

Call context: a training process (the update stage, or an elastic core replica) builds one backend
per process, calls `setup` once with its model and optimizer, then per optimizer step calls
`backward(loss)` exactly once and `step()`. Micro-batch accumulation is not part of the contract:
DeepSpeed's engine (gradient_accumulation_steps 1) would keep only the last micro-batch while torch
and ddp would sum the means, so a second `backward` before `step` fails an assertion instead. The
backend owns the reduction: after `step` returns, every replica of the job holds the same
parameters. The loss passed to `backward` is the replica's mean loss over its own shard; the
backends average gradients over replicas, so a W-replica job on W equal shards equals one process on
their union with a mean loss. Equal means equal in whatever the loss averages over: a token-mean
loss needs the same number of trained tokens on every replica, or the average weights a token on a
short shard more (the GRPO update stage runs single-process: `training.update.run_grpo_update`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistSpec:
    """Where this replica sits in its data-parallel job."""

    rank: int = 0
    world_size: int = 1
    init_method: str | None = None  # e.g. tcp://127.0.0.1:29500; None with world_size 1
    device: str = "cpu"


@dataclass(frozen=True)
class StepStats:
    grad_norm: float  # global norm of the averaged gradient, before clipping
    divisor: int  # replicas whose gradients were averaged


class TrainingBackend(ABC):
    name: ClassVar[str]

    def __init__(self, dist: DistSpec | None = None) -> None:
        self.dist = dist or DistSpec()

    @abstractmethod
    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Take ownership of the model and optimizer (join the process group if there is one)."""

    _backward_pending = False  # set by `backward`, cleared when the step applies the gradient

    def _begin_backward(self) -> None:
        assert not self._backward_pending, (
            f"{self.name}: backward() called twice before step(); accumulate micro-batches into one loss"
        )
        self._backward_pending = True

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Compute this replica's gradient of `loss` (a mean over its shard); once per step."""

    @abstractmethod
    def step(self, *, grad_clip: float | None = None) -> StepStats:
        """Average gradients over replicas, clip the average, step the optimizer, zero gradients.

        `torch` and `ddp` raise FloatingPointError, having applied nothing and dropped the gradients,
        when the averaged gradient's norm is NaN or infinite (on every replica alike: they all reduced
        the same sum); `deepspeed` leaves this to its engine."""

    @property
    @abstractmethod
    def model(self) -> torch.nn.Module:
        """The model whose parameters the steps update (unwrapped)."""

    def close(self) -> None:  # noqa: B027 - optional hook; single-process backends hold nothing
        """Leave the process group, if this backend created one."""
