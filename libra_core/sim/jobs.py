"""Simulating a run's policies side by side, one worker process each (`simulate(..., jobs=N)`).

Policies share nothing while they run: each worker rebuilds the workload from the run's inputs
(`SimRun`, which is small and picklable) and simulates its policy; the simulator draws nothing at
random once the workload is built, so the results equal those of `jobs=1`. Workers are spawned, not
forked: the caller may hold threads (a Prefect task, the CLI's progress bars) whose locks a fork
would copy mid-use. Progress ticks travel back on a queue and reach the caller's callback on the
caller's thread; a stage's count never goes backwards, and each stage ends at `iterations`.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from libra_core.sim.policies import Deployment, PolicySpec
from libra_core.sim.report import PolicyFailure, PolicyResult
from libra_core.sim.simulate import SimRun, run_policy

Progress = Callable[[str, int, int], None]

_ticks: Any = None  # the worker's end of the progress queue (set by `_start_worker`)


def _start_worker(ticks: Any) -> None:
    global _ticks
    _ticks = ticks


def _simulate_one(
    run: SimRun, spec: PolicySpec, deployment: tuple[Deployment, float] | None
) -> PolicyResult | PolicyFailure:
    ticks = _ticks
    report = None if ticks is None else (lambda stage, done, total: ticks.put((stage, done, total)))
    return run_policy(run, run.load(), spec, report, deployment)


class _Relay:
    """Forwards ticks to the caller's callback, keeping each stage's count monotone."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
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
    run: SimRun,
    specs: list[PolicySpec],
    jobs: int,
    progress: Progress | None,
    deployments: list[tuple[Deployment, float]] | None = None,
) -> list[PolicyResult | PolicyFailure]:
    """Each of `specs` simulated in one of `min(jobs, len(specs))` worker processes, from its
    `deployments` entry (`simulate.first_deployment`'s) if given; results in the order of `specs`.
    A policy that cannot run the workload (PolicyFailure) is a result; the first policy to raise
    raises here, and policies not yet started never start."""
    ctx = mp.get_context("spawn")
    ticks = ctx.Queue() if progress is not None else None
    relay = None if progress is None else _Relay(progress)
    workers = min(jobs, len(specs))
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker, initargs=(ticks,))
    # At most `workers` policies are handed out at a time: the pool would queue one more ahead, which
    # a worker would then run to the end after a Ctrl-C had already stopped its first one.
    queued = list(enumerate(specs))
    futures: dict[Future[PolicyResult | PolicyFailure], int] = {}
    results: list[PolicyResult | PolicyFailure | None] = [None] * len(specs)
    try:
        while queued or futures:
            while queued and len(futures) < workers:
                i, spec = queued.pop(0)
                dep = deployments[i] if deployments is not None else None
                futures[pool.submit(_simulate_one, run, spec, dep)] = i
            finished, _ = wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
            if relay is not None:
                relay.drain(ticks)
            for f in finished:
                results[futures.pop(f)] = f.result()  # the first failure raises here
    except KeyboardInterrupt:
        # Ctrl-C reaches the workers too (one process group), SIGTERM only this process: stop them
        # here, or they run their policies to the end, orphaned (until 2026-12-07).
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        raise
    except BrokenProcessPool as err:
        raise BrokenProcessPool(
            f"{err} A simulation worker died: out of memory (each of the {workers} jobs holds one"
            " policy's run; try fewer), killed, or started from a script without the"
            " `if __name__ == '__main__':` guard that spawned processes need."
        ) from err
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after a failure, the running ones end first
    if relay is not None:
        relay.drain(ticks)
        for spec in specs:  # a tick still in the queue's pipe when its worker returned
            relay(spec.name, run.iterations, run.iterations)
    assert all(r is not None for r in results), "every policy has a result"
    return [r for r in results if r is not None]
