"""`benchmarks/sim_setting_compare.py`, `benchmarks/sim_future_window.py` and
`benchmarks/sim_mixed_sweep.py`: the numbers they print are the simulator's, the future window holds
the iterations the plan will serve, and the mixed sweep covers every two-degree layout."""

from __future__ import annotations

import subprocess
import sys

import pytest

from libra_core.planner.specs import get_model, parse_cluster
from libra_core.sim import simulate, workloads
from libra_core.sim.engine import Simulator
from libra_core.sim.policies import resolve_policies
from libra_core.sim.settings import SimSettings
from tests.benchmarks.support import BENCH, load_script


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_setting_compare_prints_what_simulate_gives_per_variant() -> None:
    out = _run(
        "sim_setting_compare.py",
        *("--scenarios", "tiny", "--loads", "4", "--iterations", "2", "--hardware", "8xA800"),
        *("--policy", "+planning", "--variant", "one-range=one_degree_dp=false"),
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("| tiny | 4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    rollout_layout = load_script("sim_setting_compare").rollout_layout
    for i, settings in ((2, SimSettings()), (4, SimSettings(one_degree_dp=False))):
        r = simulate(
            "tiny", "8xA800", 2, ["+planning"], settings=settings, spec_overrides={"prompts_per_iteration": 4}
        ).result("+planning")
        assert cells[i] == f"{r.tokens_per_s:,.0f}"
        assert cells[i + 1] == rollout_layout(r.first_deployment)


@pytest.mark.parametrize("variant", ["bad", "x=nope=1"])
def test_setting_compare_rejects_a_malformed_variant(variant: str) -> None:
    out = _run("sim_setting_compare.py", "--scenarios", "tiny", "--variant", variant)
    assert out.returncode != 0
    assert "error:" in out.stderr and "variant" in out.stderr


def test_future_window_prices_the_iterations_the_plan_will_serve() -> None:
    fw = load_script("sim_future_window")
    seen: list[tuple[int, list[str]]] = []

    def replan(sim: Simulator, j: int) -> bool:
        seen.append((j, [w.name for w in sim.windows]))
        return False

    cluster = parse_cluster("8xA800")
    wl = workloads.load_scenario("tiny", 12, 0)
    settings = SimSettings(replan_every=5, window_iterations=2)
    sim = Simulator(
        resolve_policies(["+planning"])[0],
        wl,
        get_model(wl.model),
        cluster.hardware,
        8,
        12,
        settings,
    )
    sim.run()  # fills the past window
    past = [w.name for w in sim.windows]
    wrapped = fw.future_window(replan)
    assert wrapped(sim, 5) is False and wrapped(sim, 10) is False
    assert seen == [
        (5, [f"iter{k}" for k in range(5, 10)]),
        (10, ["iter10", "iter11"]),
    ]  # cut at the run's end
    assert [w.name for w in sim.windows] == past  # restored


def test_mixed_sweep_enumerates_every_two_degree_layout_on_every_gpu() -> None:
    layouts = load_script("sim_mixed_sweep").two_degree_layouts((1, 2, 4, 8), 12)
    brute = {
        (a, n_a, b, n_b)
        for a in (1, 2, 4, 8)
        for b in (1, 2, 4, 8)
        for n_a in range(1, 13)
        for n_b in range(1, 13)
        if a < b and n_a * a + n_b * b == 12
    }
    assert sorted(layouts) == sorted(brute) and len(layouts) == len(brute) == 12


@pytest.mark.parametrize("share", [0.25, 0.5, 0.9])
def test_mixed_sweep_bound_puts_the_share_in_the_short_bucket(share: float) -> None:
    lengths = list(range(100, 1100, 10))  # 100 lengths
    bound = load_script("sim_mixed_sweep").share_bound(lengths, share)
    assert sum(n <= bound for n in lengths) == pytest.approx(share * len(lengths), abs=1)


def test_mixed_sweep_prints_what_static_optimal_runs_on_its_own_layout() -> None:
    out = _run(
        "sim_mixed_sweep.py",
        *("--scenario", "tiny", "--hardware", "8xA800", "--iterations", "2"),
        *("--rollout-gpus", "3", "4", "--shares", "0.5", "--top", "20"),
    )
    assert out.returncode == 0, out.stderr
    r = simulate("tiny", "8xA800", 2, ["static-optimal"]).result("static-optimal")
    label = r.first_deployment.replace(" | ", "; ")
    row = next(line for line in out.stdout.splitlines() if line.startswith(f"| {label} | one bucket |"))
    assert row.rstrip(" |").split("| ")[-1] == f"{r.tokens_per_s:,.0f}"
    mixed = [line for line in out.stdout.splitlines() if "rollout 3 (1xTP1 1xTP2)" in line]
    assert sorted(line.split("| ")[3].strip() for line in mixed) == ["cmlfq", "oracle"]
    best = next(line for line in out.stdout.splitlines() if line.startswith("best oracle mixed layout:"))
    assert "(50%) at " in best and "against the best one-degree layout" in best


def test_mixed_sweep_rejects_a_share_outside_zero_one() -> None:
    out = _run("sim_mixed_sweep.py", "--scenario", "tiny", "--hardware", "8xA800", "--shares", "1.5")
    assert out.returncode != 0
    assert "error:" in out.stderr and "--shares" in out.stderr


def test_mixed_sweep_without_a_two_degree_layout_says_there_is_nothing_to_compare() -> None:
    out = _run(
        "sim_mixed_sweep.py",
        "--scenario",
        "tiny",
        "--hardware",
        "8xA800",
        "--iterations",
        "1",
        "--rollout-gpus",
        "1",
    )
    assert out.returncode == 0, out.stderr
    assert "1 simulations" in out.stdout and "rollout 1 (1xTP1) | one bucket" in out.stdout
    assert "no comparison" in out.stdout and "best " not in out.stdout


def test_mixed_price_compares_the_plans_libra_simulate_explains_its_tie_by() -> None:
    out = _run("sim_mixed_price.py", "--top", "2", "--iterations", "1")
    assert out.returncode == 0, out.stderr
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in out.stdout.splitlines()
        if line.startswith("| one degree") or line.startswith("| mixed")
    ]
    assert [r[0] for r in rows] == ["one degree", "mixed 1", "mixed 2"]
    num = lambda cell: float(cell.replace(",", ""))  # noqa: E731
    for r in rows:
        assert num(r[5]) == pytest.approx(num(r[3]) / num(r[4]), abs=0.01)  # priced / simulated
    assert ("xTP" in rows[0][1]) and all(r[1].count("xTP") == 2 for r in rows[1:])
    # The best mixed plan against the best one-degree plan is the gap `libra simulate` prints, and
    # the one-degree plan is the one +hetero-tp runs (one iteration, the same tok/s).
    hetero = simulate("r2e-gym", "48xA800", 1, ["+hetero-tp"]).results[0]
    assert num(rows[0][6]) == pytest.approx(hetero.tokens_per_s, abs=0.5)
    gap = hetero.mixed_gap
    assert gap is not None and num(rows[1][2]) / num(rows[0][2]) - 1 == pytest.approx(gap, abs=0.003)
