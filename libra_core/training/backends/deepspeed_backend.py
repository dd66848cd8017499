"""DeepSpeed ZeRO-1/2 data-parallel training behind the backend interface (optional extra).

DeepSpeed averages gradients over the data-parallel world like the ddp backend, and partitions the
optimizer state (ZeRO-1) and the gradients (ZeRO-2) across ranks. On CPU it runs over gloo; its
first start on a machine compiles a small communication op into TORCH_EXTENSIONS_DIR (about a
minute here; cached afterwards). Clipping is part of DeepSpeed's config, so it is fixed at
construction: `step(grad_clip=...)` must ask for the same value (None only when the backend does
not clip). A gradient whose norm is not finite raises FloatingPointError from `step` with nothing
applied, as in the torch and ddp backends (DeepSpeed itself skips such a step). This backend cannot
fold in elastic hybrid gradients (DeepSpeed owns the reduction); the Elastic Hybrid Pool uses the ddp
backend.

The DistSpec is the truth about this process: `setup` overwrites RANK, WORLD_SIZE and LOCAL_RANK
(DeepSpeed picks its device from LOCAL_RANK) whatever a launcher exported. A group it creates needs
DistSpec.init_method for world_size > 1; a single replica rendezvouses in memory (no port). `close`
destroys only a group `setup` created, and then resets DeepSpeed's process-global communication
state too, so another DeepSpeedBackend can be set up later in the same process.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.training.backends.base import DistSpec, StepStats, TrainingBackend

if TYPE_CHECKING:
    import torch

DEFAULT_EXTENSIONS_DIR = Path.home() / ".cache" / "libra" / "torch_extensions"


def _local_rank(spec: DistSpec) -> int:
    """The device index DeepSpeed should use: N for `cuda:N`, else the rank (one host, one device
    per rank)."""
    kind, _, index = spec.device.partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else spec.rank


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

        spec = self.dist
        backend = "nccl" if spec.device.startswith("cuda") else "gloo"
        if not dist.is_initialized():
            # Create the group ourselves from DistSpec (DeepSpeed would otherwise probe MPI/env vars).
            if spec.init_method:
                dist.init_process_group(
                    backend, init_method=spec.init_method, rank=spec.rank, world_size=spec.world_size
                )
            elif spec.world_size == 1:
                # No peers to meet: an in-memory store, where a fixed port (29500) made a second
                # single-replica job on the host fail with EADDRINUSE.
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            else:
                raise ValueError(
                    f"a {spec.world_size}-replica deepspeed job needs DistSpec.init_method "
                    "(e.g. tcp://HOST:PORT, the same on every rank)"
                )
            self._owns_group = True
        # Set unconditionally: a driver started by a launcher (torchrun, a SLURM wrapper) inherits
        # that launcher's variables, and with setdefault every worker's engine took LOCAL_RANK 0.
        os.environ["LOCAL_RANK"] = str(_local_rank(spec))
        os.environ["RANK"] = str(spec.rank)
        os.environ["WORLD_SIZE"] = str(spec.world_size)
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
        # DeepSpeed clips inside engine.step() at its configured value, so a different request would
        # be ignored silently: step(grad_clip=None) ("no clipping" for torch and ddp) still clipped.
        # None and 0 both mean "no clipping" to DeepSpeed's config.
        same = grad_clip == self.grad_clip or (grad_clip is None and not self.grad_clip)
        if not same:
            raise ValueError(
                f"deepspeed clips at {self.grad_clip} (fixed in its config at construction), but "
                f"step() was asked for grad_clip={grad_clip}; build the backend with that grad_clip"
            )
        self.engine.step()
        self._backward_pending = False
        norm = self.engine.get_global_grad_norm()
        if norm is not None and not math.isfinite(float(norm)):
            # DeepSpeed finds the overflow itself, skips the update and drops the gradient, then
            # reports the norm as inf (NaN gradients included); it returned that as a normal step
            # until 2026-12-07, where torch and ddp raise (clip_flat_'s wording, so callers match one).
            raise FloatingPointError(
                f"the averaged gradient norm is {float(norm)}; nothing applied (check the loss, its "
                "inputs and the learning rate)"
            )
        return StepStats(float(norm) if norm is not None else float("nan"), self.dist.world_size)

    @property
    def model(self) -> torch.nn.Module:
        module: torch.nn.Module = self.engine.module
        return module

    def close(self) -> None:
        import torch.distributed as dist

        # A launcher's group (or one the caller made) is the caller's to destroy, as in ddp.py.
        if self._owns_group and dist.is_initialized():
            import deepspeed.comm
            from deepspeed.comm import comm as ds_comm

            if ds_comm.cdb is not None:
                # Also drops DeepSpeed's cached groups (deepspeed.utils.groups: the world clone and
                # the data-parallel groups); left alone, the next engine used the destroyed clone
                # ("Group ... is not registered").
                deepspeed.comm.destroy_process_group()
            else:  # setup failed before DeepSpeed took the group over
                dist.destroy_process_group()
            # DeepSpeed's communication backend was built for the destroyed group (its rank and
            # size); init_distributed builds a fresh one for the next group.
            ds_comm.cdb = None
            self._owns_group = False
