"""`pools.elastic` validates, but no flow builds the gateway from it yet: a run that changes it is
refused with the key named, not run as if the setting took effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config.loader import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("pools.elastic.max_frame_mib=2048", "pools.elastic.max_frame_mib=2048"),
        ("pools.elastic.update_log_steps=8", "pools.elastic.update_log_steps=8"),
        ("pools.elastic.payload_deadline_s=1.5", "pools.elastic.payload_deadline_s=1.5"),
    ],
)
def test_an_elastic_setting_the_flow_does_not_read_is_refused_naming_the_key(
    override: str, named: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    problems = " ".join(info.value.problems)
    assert named in problems
    assert "the elastic hybrid pool is not wired into the experiment flow yet" in problems
    assert "docs/elastic.md" in problems


def test_the_shipped_stages_yaml_keeps_the_elastic_defaults() -> None:
    cfg = load_config(REPO / "stages.yaml", [])
    assert cfg.pools.elastic.max_frame_mib == 1024 and cfg.pools.elastic.update_log_steps == 64
