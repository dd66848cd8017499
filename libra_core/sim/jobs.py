"""Simulating a run's policies side by side, one worker process each (`simulate(..., jobs=N)`).

Policies share nothing while they run: each worker rebuilds the workload from the run's inputs
(`SimRun`, which is small and picklable) and simulates its policy with the RNG stream of the
policy's place in the run, so the results equal those of `jobs=1`. Workers are spawned, not
forked: the caller may hold threads (a Prefect task, the CLI's progress bars) whose locks a fork
would copy mid-use. Progress ticks travel back on a queue and reach the caller's callback on the
caller's thread; a stage's count never goes backwards, and each stage ends at `iterations`.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from libra_core.sim.policies import PolicySpec
from libra_core.sim.report import PolicyResult
from libra_core.sim.simulate import SimRun, run_policy

Progress = Callable[[str, int, int], None]

_ticks: Any = None  # the worker's end of the progress queue (set by `_start_worker`)


def _start_worker(ticks: Any) -> None:
    global _ticks
    _ticks = ticks


def _simulate_one(run: SimRun, spec: PolicySpec, index: int) -> PolicyResult:
    ticks = _ticks
    report = None if ticks is None else (lambda stage, done, total: ticks.put((stage, done, total)))
    return run_policy(run, run.load(), spec, index, report)


class _Relay:
    """Forwards ticks to the caller's callback, keeping each stage's count monotone."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress, self.total = progress, total
        self.done: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if done > self.done.get(stage, -1):
            self.done[stage] = done
            self.progress(stage, done, total)

    def drain(self, ticks: Any) -> None:
        while True:
            try:
                self(*ticks.get_nowait())
            except queue_mod.Empty:
                return


def run_in_processes(
    run: SimRun, specs: list[PolicySpec], jobs: int, progress: Progress | None
) -> list[PolicyResult]:
    """Each of `specs` simulated in one of `min(jobs, len(specs))` worker processes; results in the
    order of `specs`. The first policy to fail raises here (policies not yet started are cancelled)."""
    ctx = mp.get_context("spawn")
    ticks = ctx.Queue() if progress is not None else None
    relay = None if progress is None else _Relay(progress, run.iterations)
    workers = min(jobs, len(specs))
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker, initargs=(ticks,)) as pool:
        futures: list[Future[PolicyResult]] = [
            pool.submit(_simulate_one, run, spec, i) for i, spec in enumerate(specs)
        ]
        pending: set[Future[PolicyResult]] = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            if relay is not None:
                relay.drain(ticks)
            failed = next((f for f in finished if f.exception() is not None), None)
            if failed is not None:
                for f in pending:
                    f.cancel()  # running ones finish before the pool closes
                err = failed.exception()
                if isinstance(err, BrokenProcessPool):
                    raise BrokenProcessPool(
                        f"{err} A simulation worker died: out of memory (each of the {workers} jobs holds"
                        " one policy's run; try fewer), killed, or started from a script without the"
                        " `if __name__ == '__main__':` guard that spawned processes need."
                    ) from err
                raise err  # type: ignore[misc]
        results = [f.result() for f in futures]
    if relay is not None:
        relay.drain(ticks)
        for spec in specs:  # a tick still in the queue's pipe when its worker returned
            relay(spec.name, run.iterations, run.iterations)
    return results
