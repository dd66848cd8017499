"""`simulate`'s progress callback and its `jobs`: each policy, then the lower bound, reports
0..iterations in order; watching a run or splitting it over worker processes does not change it;
failures in a worker reach the caller with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from libra_core.sim import simulate
from libra_core.sim.simulate import LOWER_BOUND


def test_progress_reports_every_iteration_of_every_stage_in_order() -> None:
    calls: list[tuple[str, int, int]] = []
    policies = ["colocated", "greedy", "+elastic"]
    watched = simulate("tiny", "8xA800", 3, policies, seed=2, progress=lambda *c: calls.append(c))
    expected = [(stage, done, 3) for stage in [*policies, LOWER_BOUND] for done in range(4)]
    assert calls == expected
    plain = simulate("tiny", "8xA800", 3, policies, seed=2)
    assert [r.makespan_s for r in watched.results] == [r.makespan_s for r in plain.results]
    assert watched.lower_bound_s == plain.lower_bound_s


def test_jobs_give_the_same_results_and_every_stage_reaches_its_end() -> None:
    policies = ["colocated", "greedy", "+cmlfq", "+elastic"]
    calls: list[tuple[str, int, int]] = []
    side_by_side = simulate(
        "tiny", "8xA800", 3, policies, seed=1, jobs=2, progress=lambda *c: calls.append(c)
    )
    one_by_one = simulate("tiny", "8xA800", 3, policies, seed=1)
    for a, b in zip(side_by_side.results, one_by_one.results, strict=True):
        assert (a.policy, a.makespan_s, a.moves, a.iteration_s) == (
            b.policy,
            b.makespan_s,
            b.moves,
            b.iteration_s,
        )
    for stage in [*policies, LOWER_BOUND]:  # interleaved across stages, in order within each
        assert [done for s, done, _ in calls if s == stage] == [0, 1, 2, 3], calls


def test_bad_jobs_and_a_cluster_too_small_for_a_split_are_named() -> None:
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        simulate("tiny", "8xA800", 1, ["greedy"], jobs=0)
    with pytest.raises(ValueError, match="greedy, \\+cmlfq: each splits the cluster .* the cluster has 1"):
        simulate("tiny", "1xA800", 1, ["colocated", "greedy", "+cmlfq"])
    assert simulate("tiny", "1xA800", 1, ["colocated"]).results[0].tokens_per_s > 0


def test_a_failing_policy_in_a_worker_raises_in_the_caller() -> None:
    # qwen3-32b trains on no 4 of the 8 GPUs: static-uniform fails in its worker, not silently.
    with pytest.raises(ValueError, match="qwen3-32b does not train on 4"):
        simulate("tiny", "8xA800", 1, ["static-uniform", "colocated"], model="qwen3-32b", jobs=2)


def test_a_script_without_the_main_guard_is_told_why_its_workers_died(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from libra_core.sim import simulate\n"
        "simulate('tiny', '8xA800', 1, ['greedy', 'colocated'], jobs=2)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode != 0
    assert "BrokenProcessPool" in out.stderr and "if __name__ == '__main__':" in out.stderr


def test_sigterm_stops_the_workers_and_writes_nothing(tmp_path: Path) -> None:
    # SIGTERM reached only the parent: it died at once and the --jobs workers ran on, orphaned
    # (until 2026-12-07). Now the command ends as after Ctrl-C, with its whole process group.
    import contextlib
    import os
    import signal
    import time

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flows.cli", "simulate", "--scenario", "r2e-gym", "--hardware", "48xA800"]
    cmd += ["--iterations", "60", "--policies", "greedy,static-uniform", "--jobs", "2", "--out", str(out)]
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    group = proc.pid
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_members(group)) < 3:  # the parent and 2 workers
            time.sleep(0.2)
        assert len(_members(group)) >= 3, "the workers did not start"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "simulation interrupted; nothing was written" in err and "Traceback" not in err
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _members(group):
            time.sleep(0.2)
        assert not _members(group), f"worker processes still running: {_members(group)}"
        assert not out.exists()
    finally:  # never leave them running, whatever failed above
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        proc.kill()


def _members(group: int) -> list[int]:
    """Live processes of process group `group` (from /proc; zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry.name))
    return found
