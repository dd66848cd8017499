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


def test_plan_top_shows_that_many_plans() -> None:
    # The margin's extra search of one-degree layouts used to let `--top 2` print four plans.
    args = ("--hardware", "48xA800", "--model", "qwen3-14b", "--workload", "swe-longtail", "--json")
    for top in (1, 2):
        report = json.loads(libra("plan", *args, "--top", str(top)).stdout)
        assert 1 + len(report["runners_up"]) == top


def test_plan_unknown_names_and_bad_numbers_exit_2() -> None:
    for args, needle in [
        (("--hardware", "48xB200", "--model", "qwen3-14b", "--workload", "swe-longtail"), "A800"),
        (("--hardware", "8xH100", "--model", "gpt-9", "--workload", "swe-longtail"), "qwen3-14b"),
        (("--hardware", "8xH100", "--model", "qwen3-8b", "--workload", "nope"), "preset"),
        (
            ("--hardware", "8xH100", "--model", "qwen3-8b", "--workload", "math-short", "--top", "0"),
            "--top must be >= 1, got 0",
        ),
        (
            ("--hardware", "8xH100", "--model", "qwen3-8b", "--workload", "math-short", "--staleness", "-1"),
            "--staleness must be >= 0, got -1",
        ),
        (
            ("--hardware", "8xH100", "--model", "qwen3-8b", "--workload", "math-short", "--gpu-budget", "0"),
            "--gpu-budget must be >= 1, got 0",
        ),
    ]:
        out = libra("plan", *args)
        assert out.returncode == 2, out
        assert "Traceback" not in out.stderr
        assert needle in out.stderr.replace("\n", "")


ARITH_TINY = ("--hardware", "48xA800", "--model", "qwen3-14b", "--workload", "arith-tiny")


def test_plan_mixed_margin_picks_one_degree_within_the_margin_and_prices_stay() -> None:
    def plan(*extra: str) -> dict:
        out = libra("plan", *ARITH_TINY, "--staleness", "1", "--top", "8", "--json", *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    by_price, default = plan("--mixed-margin", "0"), plan()
    assert len(by_price["plan"]["instance_tps"]) > 1  # the cheapest plan mixes TP degrees
    assert len(default["plan"]["instance_tps"]) == 1  # within 5% of it, one degree ranks first
    assert by_price["plan"]["t_iter_s"] < default["plan"]["t_iter_s"] < by_price["plan"]["t_iter_s"] / 0.95
    assert any(r["t_iter_s"] == by_price["plan"]["t_iter_s"] for r in default["runners_up"])
    assert (by_price["mixed_margin"], default["mixed_margin"]) == (0.0, 0.05)
    bad = libra("plan", *ARITH_TINY, "--mixed-margin", "1")
    assert bad.returncode == 2 and "--mixed-margin" in bad.stderr


def test_default_mixed_margin_is_one_value_everywhere() -> None:
    import argparse

    from flows.cli_plan import add_parser
    from libra_core.config.models import PlannerConfig
    from libra_core.planner.search import DEFAULT_MIXED_MARGIN
    from libra_core.sim.settings import SimSettings

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    cli_default = sub.choices["plan"].get_default("mixed_margin")
    assert PlannerConfig().mixed_margin == SimSettings().mixed_margin == cli_default == DEFAULT_MIXED_MARGIN


def test_plan_prices_the_path_in_two_phases_by_default_and_capped_on_request() -> None:
    # swe-longtail on 48 A800 (512 trajectories): the capped path decodes the slowest trajectory at
    # the KV-capped batch whatever the instance count, so more rollout GPUs do not shorten it and
    # the split gives training more; the two-phase path falls with the instance count.
    args = ("--hardware", "48xA800", "--model", "qwen3-14b", "--workload", "swe-longtail", "--json")
    default, capped = (json.loads(libra("plan", *args, *extra).stdout) for extra in ((), ("--capped-path",)))
    assert (default["two_phase_path"], capped["two_phase_path"]) == (True, False)
    assert default["plan"]["rollout_gpus"] > capped["plan"]["rollout_gpus"]
    assert default["plan"]["t_rollout_s"] != capped["plan"]["t_rollout_s"]


def test_two_phase_path_default_is_one_value_everywhere_and_reaches_the_service() -> None:
    from libra_core.config.models import LibraConfig, PlannerConfig
    from libra_core.planner.search import SearchSettings
    from libra_core.planner.service import LibraPlanner
    from libra_core.sim.settings import SimSettings

    assert (
        PlannerConfig().two_phase_path
        is SearchSettings().two_phase_path
        is SimSettings().two_phase_path
        is True
    )
    for value in (True, False):
        cfg = LibraConfig.model_validate({"planner": {"type": "libra", "two_phase_path": value}})
        assert LibraPlanner.from_config(cfg).settings().two_phase_path is value


def test_plan_piped_prints_one_plain_line_per_plan_with_the_json_figures() -> None:
    args = ("--hardware", "48xA800", "--model", "qwen3-14b", "--workload", "swe-longtail", "--top", "2")
    report = json.loads(libra("plan", *args, "--json").stdout)
    out = libra("plan", *args)  # stdout is a pipe here, not a terminal
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[1:3]] == ["plan", "runner-up 1"]
    for line, plan in zip(lines[1:3], [report["plan"], *report["runners_up"]], strict=True):
        assert f"T_iter {plan['t_iter_s']:.1f}s" in line
        assert f"train {plan['train_gpus']} GPUs" in line
    assert "┃" not in out.stdout  # no table cut to a terminal's width


def test_plan_and_simulate_take_your_own_model_and_gpu(tmp_path) -> None:
    # The shipped examples: a model's Hugging Face config.json, a GPU as a YAML over a built-in one.
    model = "examples/specs/llama-3.1-70b/config.json"
    hardware = "32xexamples/specs/h800.yaml"
    args = ("--model", model, "--workload", "search-medium", "--json")
    report = json.loads(libra("plan", "--hardware", hardware, *args).stdout)
    assert (
        report["feasible"] and report["cluster"] == "32xh800" and report["model"] == "llama-3.1-70b-instruct"
    )
    # The capped NVLink costs throughput against the H100 it is based on.
    h100 = json.loads(libra("plan", "--hardware", "32xH100", *args).stdout)
    assert report["plan"]["t_iter_s"] > h100["plan"]["t_iter_s"]
    out = libra(
        "simulate", "--scenario", "tiny", "--hardware", hardware, "--model", model,
        "--iterations", "2", "--policies", "static-optimal", "--out", str(tmp_path / "sim"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["hardware"] == "32xh800" and summary["model"] == "llama-3.1-70b-instruct"
    # summary.json keeps the resolved specs, so the run reproduces after the files change.
    assert (
        summary["hardware_spec"]["nvlink_gbps_per_dir"] == 200 and summary["model_spec"]["num_layers"] == 80
    )
    # A broken file is a clear error, exit 2, naming the file and the field.
    (tmp_path / "bad.yaml").write_text("base: H100\nhbm_gbps: 0\n")
    bad = libra(
        "plan", "--hardware", f"8x{tmp_path / 'bad.yaml'}", "--model", model, "--workload", "math-short"
    )
    assert (
        bad.returncode == 2
        and "bad.yaml: hbm_gbps: Input should be greater than or equal to 0.001"
        in bad.stderr.replace("\n", "")
    )
    # The run's config takes files too.
    from libra_core.config.models import PlannerConfig

    assert PlannerConfig(hardware=hardware, model_spec=model).hardware == hardware
