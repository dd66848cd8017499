"""`pools.ray` and the plan, reward and sync stage sizes validate, but no run reads them: a run that
changes one is refused with the key named, not run as if the setting took effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config.loader import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("pools.ray.address=auto", "pools.ray.address='auto'"),
        ("pools.ray.num_gpus_per_worker=1", "pools.ray.num_gpus_per_worker=1.0"),
        ("pools.ray.local_num_cpus=8", "pools.ray.local_num_cpus=8"),
        ("pools.ray.start_timeout_s=30", "pools.ray.start_timeout_s=30.0"),
    ],
)
def test_a_ray_setting_the_flow_does_not_read_is_refused_naming_the_key(override: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    problems = info.value.problems
    [line] = [p for p in problems if "pools.ray." in p]
    assert named in line
    assert "Ray pools are not wired into the experiment flow yet" in line
    assert "a run refuses pools.type=ray" in line and "keep the pools.ray defaults" in line
    assert not any("pools.type" in p and "pools.ray." not in p for p in problems)  # pools.type kept local


def test_every_changed_ray_key_is_named_on_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["pools.ray.namespace=other", "pools.ray.num_cpus_per_worker=2"])
    [line] = info.value.problems
    assert "pools.ray.num_cpus_per_worker=2.0" in line and "pools.ray.namespace='other'" in line


@pytest.mark.parametrize("stage", ["plan", "reward", "sync"])
def test_a_stage_size_no_run_reads_is_refused(stage: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"stages.{stage}.size=3"])
    [line] = info.value.problems
    assert line.startswith(f"stages.{stage}.size=3: only stages.rollout.size and stages.update.size are read")
    assert line.endswith("use 1")


def test_the_read_sizes_and_the_shipped_file_still_load() -> None:
    assert load_config(None, ["stages.rollout.size=2"]).stages.rollout.size == 2
    cfg = load_config(REPO / "stages.yaml", [])
    assert [getattr(cfg.stages, s).size for s in ("plan", "reward", "update", "sync")] == [1, 1, 1, 1]
    assert cfg.pools.ray.model_dump() == type(cfg.pools.ray)().model_dump()
