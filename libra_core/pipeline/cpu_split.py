"""How a CPU-only machine's cores are shared between the rollout engines and the trainer.

In the synchronous pipeline the two never run at once, so each may use every core (0 = let vLLM
and torch decide). In the async pipeline they overlap, and two libraries each spinning up one
thread per core on the same cores thrash: measured here, the update went from 1.7 s to 9.2 s
median and the whole iteration doubled. So, unless the config fixes the numbers, async gives the
engines and the trainer half of the cores each. Called by the pool task (engine threads) and the
update stage (torch threads); on GPU machines the engine setting is unused and training runs on
the device. "The cores" are those this process may run on (`sched_getaffinity`: a cpuset or
`taskset` job gets fewer than `os.cpu_count()`); each engine binds its threads to a slice of them of
its own (rollout/vllm_server.omp_binding).
"""

from __future__ import annotations

import os

from libra_core.config import LibraConfig


def cpu_threads(cfg: LibraConfig) -> tuple[int, int]:
    """(engine OMP threads, trainer torch threads); 0 leaves the choice to the library."""
    engine, trainer = cfg.rollout.engine.cpu_threads, cfg.training.threads
    if cfg.pipeline.mode == "async":
        half = max(1, len(os.sched_getaffinity(0)) // 2)
        engine = engine or half
        trainer = trainer or half
    return engine, trainer
