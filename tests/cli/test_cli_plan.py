"""`libra plan` as a user runs it: a feasible plan as JSON, clear errors for unknown names."""

from __future__ import annotations

import json

from tests.cli.test_cli import libra


def test_plan_json_is_feasible_and_consistent() -> None:
    out = libra(
        "plan", "--hardware", "48xA800", "--model", "qwen3-14b", "--workload", "swe-longtail", "--json"
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["feasible"] and report["cluster"] == "48xA800-80G"
    plan = report["plan"]
    assert plan["train_gpus"] + plan["rollout_gpus"] <= 48
    # synchronous (staleness 0): nothing overlaps
    assert plan["t_iter_s"] >= plan["t_train_s"] + plan["t_rollout_s"] - 1e-9
    assert len(report["runners_up"]) >= 1
    assert all(r["t_iter_s"] >= plan["t_iter_s"] - 1e-9 for r in report["runners_up"])


def test_plan_unknown_names_exit_2() -> None:
    for args, needle in [
        (("--hardware", "48xB200", "--model", "qwen3-14b", "--workload", "swe-longtail"), "A800"),
        (("--hardware", "8xH100", "--model", "gpt-9", "--workload", "swe-longtail"), "qwen3-14b"),
        (("--hardware", "8xH100", "--model", "qwen3-8b", "--workload", "nope"), "preset"),
    ]:
        out = libra("plan", *args)
        assert out.returncode == 2, out
        assert "Traceback" not in out.stderr
        assert needle in out.stderr.replace("\n", "")
