"""A tiny deterministic data-parallel problem and pool-worker entry points for the elastic pool.

The reference implementation next to the real one: a small MLP regression whose data shard for
(replica, step) is generated from a seed, so a K-core + H-hybrid run and a static run can be compared
bit for bit (float64). Tests and benchmarks/elastic_join.py send the `core_*` and `hybrid_*`
functions to pool workers (libra_core/pools); each worker keeps its replica in `_STATE` between calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future

    import numpy as np
    import torch

    from libra_core.pools.base import WorkerPool

_STATE: dict[str, Any] = {}


@dataclass(frozen=True)
class ToyProblem:
    in_dim: int = 8
    hidden: int = 16
    depth: int = 2  # hidden layers
    batch: int = 16  # samples per shard per step
    lr: float = 0.05
    grad_clip: float | None = 1.0
    seed: int = 0
    data_seed: int = 1234
    dtype: str = "float64"  # float64 makes K+H vs static comparisons exact to ~1e-12
    compute_repeat: int = 0  # extra forward/backward passes, to make a step cost real time (benchmarks)

    def model(self) -> torch.nn.Module:
        import torch

        torch.manual_seed(self.seed)
        layers: list[torch.nn.Module] = []
        width = self.in_dim
        for _ in range(self.depth):
            layers += [torch.nn.Linear(width, self.hidden), torch.nn.Tanh()]
            width = self.hidden
        layers.append(torch.nn.Linear(width, 1))
        return torch.nn.Sequential(*layers).to(getattr(torch, self.dtype))

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        import torch

        return torch.optim.AdamW(model.parameters(), lr=self.lr)

    def shard(self, shard: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        gen = torch.Generator().manual_seed(self.data_seed * 1_000_003 + shard * 10_007 + step)
        x = torch.randn(self.batch, self.in_dim, generator=gen, dtype=torch.float64)
        y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(
            self.batch, 1, generator=gen, dtype=torch.float64
        )
        return x, y

    def loss(self, model: torch.nn.Module, shard: int, step: int) -> torch.Tensor:
        x, y = self.shard(shard, step)
        dtype = next(model.parameters()).dtype
        x, y = x.to(dtype), y.to(dtype)
        loss = ((model(x) - y) ** 2).mean()
        for _ in range(self.compute_repeat):
            # Burn compute with a graph that adds zero gradient, so results stay exact.
            loss = loss + 0.0 * ((model(x) - y) ** 2).mean()
        return loss


def flat_params(model: torch.nn.Module) -> np.ndarray:
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def reference_params(problem: ToyProblem, shards_by_step: list[tuple[int, ...]]) -> np.ndarray:
    """A static data-parallel run in one process: step s averages the gradients of `shards_by_step[s]`."""
    from libra_core.training.backends.flat import clip_flat_, flat_grad, set_flat_grad, trainable

    model = problem.model()
    optimizer = problem.optimizer(model)
    params = trainable(model)
    for step, shards in enumerate(shards_by_step):
        total = None
        for shard in shards:
            optimizer.zero_grad(set_to_none=True)
            problem.loss(model, shard, step).backward()
            g = flat_grad(params)
            total = g if total is None else total + g
        assert total is not None, f"step {step} has no shard"
        update = total / len(shards)
        clip_flat_(update, problem.grad_clip)
        set_flat_grad(params, update)
        optimizer.step()
    return flat_params(model)


# ---------------------------------------------------------------------------- pool-worker entry points


def core_start(
    problem: ToyProblem,
    rank: int,
    world_size: int,
    init_method: str | None,
    *,
    key: bytes | None = None,
    deadline_s: float = 5.0,
    update_log_steps: int = 64,
) -> tuple[str, int] | None:
    """Build this core rank's replica (rank 0 also starts the gateway); return the gateway address."""
    import torch

    from libra_core.elastic.gateway import Gateway
    from libra_core.elastic.membership import Coordinator
    from libra_core.elastic.replica import CoreReplica
    from libra_core.training.backends.base import DistSpec
    from libra_core.training.backends.ddp import DDPBackend

    torch.set_num_threads(1)
    model = problem.model()
    backend = DDPBackend(DistSpec(rank, world_size, init_method))
    backend.setup(model, problem.optimizer(model))
    gateway = None
    if rank == 0 and key is not None:
        numel = sum(p.numel() for p in model.parameters())
        gateway = Gateway(
            key,
            Coordinator(world_size),
            numel=numel,
            dtype=torch.float64,
            deadline_s=deadline_s,
            update_log_steps=update_log_steps,
        )
    _STATE.update(
        problem=problem,
        rank=rank,
        gateway=gateway,
        core=CoreReplica(backend, gateway=gateway, grad_clip=problem.grad_clip),
    )
    return gateway.address if gateway is not None else None


def backend_train(
    problem: ToyProblem,
    name: str,
    rank: int,
    world_size: int,
    init_method: str | None,
    steps: int,
    **options: Any,
) -> np.ndarray:
    """Train `steps` steps with training backend `name` as replica `rank` (shard `rank`; a single
    replica trains on the mean loss of shards 0..1); return the final flat parameters."""
    import torch

    from libra_core.training.backends.base import DistSpec
    from libra_core.training.backends.registry import build_backend

    torch.set_num_threads(1)
    model = problem.model()
    backend = build_backend(name, DistSpec(rank, world_size, init_method), **options)
    backend.setup(model, problem.optimizer(model))
    shards = [rank] if world_size > 1 else [0, 1]
    for step in range(steps):
        loss = sum(problem.loss(backend.model, s, step) for s in shards) / len(shards)
        backend.backward(loss)  # type: ignore[arg-type]
        backend.step(grad_clip=problem.grad_clip)
    params = flat_params(backend.model)
    backend.close()
    return params


def warm_up() -> None:
    """Import what a replica needs (a live rollout worker has these loaded already)."""
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    import libra_core.elastic.replica  # noqa: F401


def core_step() -> dict[str, Any]:
    problem: ToyProblem = _STATE["problem"]
    rank: int = _STATE["rank"]
    report = _STATE["core"].step(lambda model, step: problem.loss(model, rank, step))
    return dict(report.to_dict())


def core_control(action: str, worker_id: str) -> dict[str, str]:
    """Rank 0 only: `join`, `leave` or `cancel` a hybrid; return every hybrid's state."""
    gateway = _STATE["gateway"]
    {"join": gateway.request_join, "leave": gateway.request_leave, "cancel": gateway.cancel}[action](
        worker_id
    )
    return dict(gateway.states())


def core_states() -> dict[str, str]:
    return dict(_STATE["gateway"].states())


def core_params() -> np.ndarray:
    return flat_params(_STATE["core"].backend.model)


def core_stop() -> None:
    if _STATE.get("gateway") is not None:
        _STATE["gateway"].close()
    if "core" in _STATE:
        _STATE["core"].backend.close()
    _STATE.clear()


def hybrid_join(
    problem: ToyProblem,
    worker_id: str,
    address: tuple[str, int],
    key: bytes,
    shard: int,
    *,
    slow_steps: dict[int, float] | None = None,
) -> dict[str, Any]:
    """Run a hybrid replica until it leaves or fails; return its report and final parameters."""
    import torch

    from libra_core.elastic.client import GatewayClient
    from libra_core.elastic.replica import run_hybrid

    torch.set_num_threads(1)
    model = problem.model()
    optimizer = problem.optimizer(model)
    client = GatewayClient(address, key, worker_id)
    delays = slow_steps or {}
    try:
        report = run_hybrid(
            client,
            model,
            optimizer,
            lambda m, step: problem.loss(m, shard, step),
            step_delay_s=lambda step: delays.get(step, 0.0),
        )
    finally:
        client.close()
    return {**report.to_dict(), "params": flat_params(model)}


class ToyPoolController:
    """HybridController for a toy job on a pool: core rank 0 on `core_worker`, hybrid i on worker i.

    Hybrid ids are the pool worker ids they run on; a hybrid's data shard is given by `shards`.
    """

    def __init__(
        self,
        pool: WorkerPool,
        problem: ToyProblem,
        address: tuple[str, int],
        key: bytes,
        shards: dict[str, int],
        core_worker: str = "w0",
    ) -> None:
        self.pool, self.problem, self.address, self.key = pool, problem, address, key
        self.shards, self.core_worker = shards, core_worker
        self.loops: dict[str, Future[Any]] = {}

    def request_join(self, worker_id: str) -> None:
        self.pool.run(self.core_worker, core_control, "join", worker_id, timeout_s=30)

    def request_leave(self, worker_id: str) -> None:
        self.pool.run(self.core_worker, core_control, "leave", worker_id, timeout_s=30)

    def cancel(self, worker_id: str) -> None:
        self.pool.run(self.core_worker, core_control, "cancel", worker_id, timeout_s=30)

    def start_hybrid(self, worker_id: str) -> None:
        self.loops[worker_id] = self.pool.submit(
            worker_id, hybrid_join, self.problem, worker_id, self.address, self.key, self.shards[worker_id]
        )
