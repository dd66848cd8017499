"""FIELD=VALUE what-ifs: typed values, clear errors, and a trace replay refusing generator fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.sim.overrides import editable_fields, parse_overrides
from libra_core.sim.settings import SimSettings
from libra_core.sim.workloads import ScenarioSpec, load_scenario


def test_values_take_their_fields_types() -> None:
    pairs = ["spill_factor=1", "max_num_seqs=128", "sticky_turns=false"]
    got = parse_overrides(pairs, SimSettings, "--setting")
    assert got == {"spill_factor": 1.0, "max_num_seqs": 128, "sticky_turns": False}
    assert type(got["max_num_seqs"]) is int and type(got["spill_factor"]) is float
    assert SimSettings(**got).sticky_turns is False


def test_only_numbers_and_flags_are_editable() -> None:
    spec_fields = editable_fields(ScenarioSpec)
    assert "name" not in spec_fields and "tool" not in spec_fields
    assert spec_fields["group_size"] is int and spec_fields["prompt_latency_sigma"] is float


@pytest.mark.parametrize("pair", ["spill_factor=inf", "spill_factor=nan", "spill_factor", "=1"])
def test_bad_pairs_are_rejected(pair: str) -> None:
    with pytest.raises(ValueError, match="--setting"):
        parse_overrides([pair], SimSettings, "--setting")


def test_generator_fields_do_not_apply_to_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace replay"):
        load_scenario(tmp_path / "run.parquet", 2, 0, spec_overrides={"group_size": 4})


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_mixed_margin_out_of_range_names_the_field(value: float) -> None:
    with pytest.raises(ValueError, match=r"mixed_margin must be in \[0, 1\)"):
        SimSettings(mixed_margin=value)
