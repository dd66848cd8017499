"""`schedule.catch_up`: which nights missed while `libra serve` was stopped run when it starts again
(flows/serve_schedule_refresh.py; tests/flows/test_serve_catch_up.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config import ConfigError, load_config

STAGES_YAML = Path(__file__).resolve().parents[2] / "stages.yaml"


def test_catch_up_defaults_to_latest_and_takes_each_value() -> None:
    assert load_config(None).schedule.catch_up == "latest"
    assert load_config(STAGES_YAML).schedule.catch_up == "latest"
    for value in ("latest", "all", "none"):
        assert load_config(None, [f"schedule.catch_up={value}"]).schedule.catch_up == value


def test_an_unknown_catch_up_is_refused_naming_the_key_and_the_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["schedule.catch_up=never"])
    assert err.value.problems == ["schedule.catch_up: Input should be 'latest', 'all' or 'none'; got 'never'"]
    path = tmp_path / "stages.yaml"
    path.write_text("schedule:\n  catch_up: false\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.problems == ["schedule.catch_up: Input should be 'latest', 'all' or 'none'; got False"]
