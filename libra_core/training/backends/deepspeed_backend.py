"""DeepSpeed ZeRO-1/2 data-parallel training behind the backend interface (optional extra).

DeepSpeed averages gradients over the data-parallel world like the ddp backend, and partitions the
optimizer state (ZeRO-1) and the gradients (ZeRO-2) across ranks. On CPU it runs over gloo; its
first start on a machine compiles a small communication op into TORCH_EXTENSIONS_DIR (about a
minute here; cached afterwards). Clipping is part of DeepSpeed's config, so it is fixed at
construction. This backend cannot fold in elastic hybrid gradients (DeepSpeed owns the reduction);
the Elastic Hybrid Pool uses the ddp backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.training.backends.base import DistSpec, StepStats, TrainingBackend

if TYPE_CHECKING:
    import torch

DEFAULT_EXTENSIONS_DIR = Path.home() / ".cache" / "libra" / "torch_extensions"


class DeepSpeedBackend(TrainingBackend):
    name = "deepspeed"
    _owns_group = False  # close() destroys the process group only if setup() created it

    def __init__(
        self, dist: DistSpec | None = None, *, zero_stage: int = 2, grad_clip: float | None = None
    ) -> None:
        super().__init__(dist)
        if zero_stage not in (1, 2):
            raise ValueError(f"zero_stage must be 1 or 2 (ZeRO-3 is not supported here), got {zero_stage}")
        self.zero_stage, self.grad_clip = zero_stage, grad_clip
        self.engine: Any = None

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(DEFAULT_EXTENSIONS_DIR))
        try:
            import deepspeed
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "training.backend is 'deepspeed' but deepspeed is not installed; install the `deepspeed` "
                "extra (pip install 'libra[deepspeed]') or use the ddp backend"
            ) from exc
        import torch.distributed as dist

        backend = "nccl" if self.dist.device.startswith("cuda") else "gloo"
        if not dist.is_initialized():
            # Create the group ourselves from DistSpec (DeepSpeed would otherwise probe MPI/env vars).
            dist.init_process_group(
                backend,
                init_method=self.dist.init_method or "tcp://127.0.0.1:29500",
                rank=self.dist.rank,
                world_size=self.dist.world_size,
            )
            self._owns_group = True
        # DeepSpeed reads its rank from the launcher's variables; this process is one rank on one host.
        os.environ.setdefault("LOCAL_RANK", str(self.dist.rank))
        os.environ.setdefault("RANK", str(self.dist.rank))
        os.environ.setdefault("WORLD_SIZE", str(self.dist.world_size))
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": self.grad_clip or 0.0,
            "zero_optimization": {"stage": self.zero_stage},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def backward(self, loss: torch.Tensor) -> None:
        self._begin_backward()
        self.engine.backward(loss)

    def step(self, *, grad_clip: float | None = None) -> StepStats:
        assert grad_clip in (None, self.grad_clip), (
            f"deepspeed clips at {self.grad_clip} (fixed in its config), step() was asked for {grad_clip}"
        )
        self.engine.step()
        self._backward_pending = False
        norm = self.engine.get_global_grad_norm()
        return StepStats(float(norm) if norm is not None else float("nan"), self.dist.world_size)

    @property
    def model(self) -> torch.nn.Module:
        module: torch.nn.Module = self.engine.module
        return module

    def close(self) -> None:
        import torch.distributed as dist

        # A launcher's group (or one the caller made) is the caller's to destroy, as in ddp.py.
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
