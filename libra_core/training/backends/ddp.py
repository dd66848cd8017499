"""Data-parallel training over torch.distributed: one all-reduce of [flat gradient, count] per step.

Gradients are flattened and summed together with a replica count in the same all-reduce, and the
sum is divided by the reduced count. Ordinarily the count is the world size; the elastic core passes
`extra_sum`/`extra_count` on rank 0 to fold hybrid gradients in (libra_core/elastic/replica.py),
and the divisor then counts exactly the replicas whose gradients are in the sum. gloo on CPU, NCCL on
CUDA. The process group is created once in `setup` and never rebuilt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libra_core.training.backends.base import StepStats, TrainingBackend

if TYPE_CHECKING:
    import torch


class DDPBackend(TrainingBackend):
    name = "ddp"
    _owns_group = False

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        import torch.distributed as dist

        self._model, self.optimizer = model, optimizer
        if self.dist.world_size > 1 and not dist.is_initialized():
            assert self.dist.init_method, "a multi-replica ddp job needs DistSpec.init_method"
            dist.init_process_group(
                "nccl" if self.dist.device.startswith("cuda") else "gloo",
                init_method=self.dist.init_method,
                rank=self.dist.rank,
                world_size=self.dist.world_size,
            )
            self._owns_group = True
        if dist.is_initialized():
            # `reduce` all-reduces only for world_size > 1: a spec that disagrees with the group a
            # launcher made would skip the all-reduce (or wait for ranks that never come) silently.
            group = (dist.get_rank(), dist.get_world_size())
            if group != (self.dist.rank, self.dist.world_size):
                raise ValueError(
                    f"the process group is rank {group[0]} of {group[1]}, but the ddp backend was "
                    f"built for rank {self.dist.rank} of {self.dist.world_size}: build it with the "
                    "launcher's rank and world size (DistSpec)"
                )

    def backward(self, loss: torch.Tensor) -> None:
        self._begin_backward()
        loss.backward()

    def reduce(
        self, flat: torch.Tensor, *, extra_sum: torch.Tensor | None = None, extra_count: int = 0
    ) -> tuple[torch.Tensor, int]:
        """Return (sum over replicas of flat [+ extra_sum] / total count, total count)."""
        import torch
        import torch.distributed as dist

        if flat.dtype in (torch.float16, torch.bfloat16):
            # The count rides with the gradient in fp32/fp64 (one collective), but bfloat16 holds
            # whole numbers only up to 256 (fp16: 2048): 257 replicas were divided by 256 until
            # 2026-12-06. In half precision it is reduced on its own, exactly.
            count = torch.tensor([1 + extra_count], dtype=torch.int64, device=flat.device)
            # fp16 is summed in fp32 on every rank (one dtype per collective): a sum overflows 65504
            # where the average does not, and two hybrids' accepted payloads of 4e4 made every core
            # rank stop (until 2026-12-07). bfloat16 has fp32's range; its sum stays in bfloat16.
            wide = torch.float32 if flat.dtype == torch.float16 else flat.dtype
            local = flat.to(wide, copy=True)  # reduced in place: not the caller's
            if extra_sum is not None:
                local += extra_sum.to(wide)
            if self.dist.world_size > 1:
                dist.all_reduce(local, op=dist.ReduceOp.SUM)
                dist.all_reduce(count, op=dist.ReduceOp.SUM)
            divisor = int(count.item())
            return (local / divisor).to(flat.dtype), divisor
        local = flat if extra_sum is None else flat + extra_sum.to(flat.dtype)
        count = torch.tensor([1.0 + extra_count], dtype=flat.dtype, device=flat.device)
        buf = torch.cat([local, count])
        if self.dist.world_size > 1:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        divisor = int(round(float(buf[-1])))
        return buf[:-1] / divisor, divisor

    def apply(self, update: torch.Tensor) -> None:
        """Set the (already averaged and clipped) flat update as the gradient and step."""
        from libra_core.training.backends.flat import set_flat_grad, trainable

        set_flat_grad(trainable(self._model), update)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._backward_pending = False

    def step(self, *, grad_clip: float | None = None) -> StepStats:
        from libra_core.training.backends.flat import clip_flat_, flat_grad, trainable

        try:
            avg, divisor = self.reduce(flat_grad(trainable(self._model)))
            # every replica reduced the same sum, so every one raises here, before applying anything
            norm = clip_flat_(avg, grad_clip)
            self.apply(avg)
        finally:  # stepped or failed, the next backward starts clean (a failure left it refused)
            self.optimizer.zero_grad(set_to_none=True)
            self._backward_pending = False
        return StepStats(norm, divisor)

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def close(self) -> None:
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
