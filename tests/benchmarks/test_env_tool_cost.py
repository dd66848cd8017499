"""benchmarks/env_tool_cost.py measures what docs/environments.md's first "Measured here" table
claims, with tiny counts: every MBPP reference passes, every MATH-500 answer verifies against
itself, the endless loop ends as a timeout, searches return passages, sandboxed runs print 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.support import run_script

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
NEEDS = ("code/mbpp.jsonl", "math/math500_test.jsonl", "search/wiki_passages_flashrag.jsonl")


@pytest.mark.skipif(
    not all((DATA / n).is_file() for n in NEEDS), reason=f"shared data folder {DATA} is absent or incomplete"
)
def test_tiny_run_reports_the_values_the_doc_table_claims(tmp_path: Path) -> None:
    out_json = tmp_path / "cost.json"
    args = ["--runs", "2", "--calls", "20", "--search-calls", "4", "--mbpp", "4", "--math", "6"]
    out = run_script(
        "env_tool_cost.py",
        *args,
        "--cpu-time-s",
        "1",
        "--wall-time-s",
        "4",
        "--json",
        str(out_json),
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out_json.read_text())

    for key in ("sandbox_namespaces", "sandbox_rlimits"):
        r = res[key]
        if "unavailable" not in r:  # namespaces need root and unshare
            assert r["ok"] == r["runs"] == 2 and 0 < r["median_ms"] <= r["p90_ms"], r
    assert "unavailable" not in res["sandbox_rlimits"]
    spin = res["spin"]
    assert spin["status"] == "timeout" and spin["reason"] in ("cpu_limit", "wall_limit"), spin
    assert 0.9 <= spin["wall_s"] < 8, (
        spin
    )  # at least most of the CPU second; killed by the wall limit at latest
    assert res["calculator"]["ok"] == res["calculator"]["calls"] == 20
    search = res["search"]
    assert search["passages"] == 1000 and search["ok"] == search["calls"] == 4 and search["k"] == 3
    assert 0 < search["payload_min"] <= search["payload_median"] <= search["payload_max"], search
    # each call sleeps at least the service's lowest injected latency
    assert search["median_ms"] >= search["latency_ms"][0] and search["start_s"] > 0
    assert res["code_reward"] == {**res["code_reward"], "problems": 4, "passed": 4}
    assert res["math_reward"] == {**res["math_reward"], "answers": 6, "correct": 6}

    lines = out.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| ")][1:]  # without the header
    assert len(rows) == 8 and all(line.count(" | ") == 1 for line in rows), out.stdout
    assert "| code reward: 4 MBPP reference solutions through the sandbox | 4/4 pass" in out.stdout
    assert f".venv/bin/python benchmarks/env_tool_cost.py {' '.join(args)}" in out.stdout


@pytest.mark.skipif(not (DATA / NEEDS[0]).is_file(), reason=f"shared data folder {DATA} is absent")
def test_more_mbpp_problems_than_the_file_holds_is_one_error_line() -> None:
    out = run_script("env_tool_cost.py", "--mbpp", "5000")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("env_tool_cost.py: error: --mbpp 5000: ")
    assert "holds only 974" in out.stderr and "|" not in out.stdout
