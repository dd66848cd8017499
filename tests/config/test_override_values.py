"""How a `--set key=value` value is read: YAML where it is YAML, the text as given where YAML would
misread a plain value (`*/5 * * * *` is an alias to YAML, ` #` a comment), YAML 1.2 scalars (no
dates, no base 60) in files and overrides alike, and the file's alias-expansion limit on overrides."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from libra_core.config import load_config, write_resolved_config
from libra_core.config.errors import ConfigError
from libra_core.config.overrides import parse_overrides, yaml_quoted
from libra_core.config.yaml_io import MAX_CONFIG_VALUES


def _value(text: str) -> object:
    return parse_overrides([f"k={text}"])["k"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("*/5 * * * *", "*/5 * * * *"),  # `*` starts a YAML alias: this was "value is not valid YAML"
        ("* * * * *", "* * * * *"),
        ("run #3", "run #3"),  # ` #` started a comment: this was "run"
        ("/data/my runs #2", "/data/my runs #2"),
        ("#3", "#3"),  # all comment: this was None
        ("@home", "@home"),  # `@` is reserved in YAML
        ("  run #3  ", "run #3"),  # a plain value's blanks around it go, as YAML's do
    ],
)
def test_a_plain_value_yaml_would_misread_is_kept_as_typed(text: str, value: str) -> None:
    assert _value(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ("-3", -3),
        ("1e-4", 1e-4),
        ("1.5", 1.5),
        ("true", True),
        ("False", False),
        ("null", None),
        ("~", None),
        ("", None),
        ("[16, 32]", [16, 32]),
        ("[]", []),
        ("{type: hf_local, path: /m}", {"type": "hf_local", "path": "/m"}),
        ("- a", ["a"]),
        ("a: b", {"a": "b"}),
        ("'run #3'", "run #3"),  # quoted: the ` #` inside is text, as before
        ('"x" ', "x"),
        ("{a: 'x #y'}", {"a": "x #y"}),
        ("a#b", "a#b"),  # no blank before `#`: never a comment
        ("!!str 5", "5"),
        ("0 2 * * *", "0 2 * * *"),
    ],
)
def test_yaml_values_still_parse(text: str, value: object) -> None:
    parsed = _value(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("x=[1,", "value is not valid YAML"),  # a broken list stays an error, not the string "[1,"
        ("x={a: 1", "value is not valid YAML"),
        ("x='a", "value is not valid YAML"),
        ("x=[16, 32] #big", "YAML reads '#big' as a comment and would drop it"),
        ("x='run' #3", "YAML reads '#3' as a comment and would drop it"),
    ],
)
def test_a_broken_or_commented_yaml_value_is_refused_with_a_hint(item: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_overrides([item])
    (problem,) = info.value.problems
    assert problem.startswith(f"override {item!r}: {message}")
    assert "quote" in problem or "inside the quotes" in problem


def test_a_cron_and_a_path_with_a_hash_reach_the_config() -> None:
    cfg = load_config(None, ["schedule.cron=*/5 * * * *", "experiment.output_dir=/data/runs #2"])
    assert cfg.schedule.cron == "*/5 * * * *"
    assert cfg.experiment.output_dir == "/data/runs #2"


@pytest.mark.parametrize("text", ["2024-01-01", "2001-12-14t21:59:43.10-05:00", "1:30.5", "1:30", "12:30:00"])
def test_dates_and_base_60_numbers_are_strings(text: str, tmp_path: Path) -> None:
    # YAML 1.1 read them as a date and 90.5; the loader reads YAML 1.2, in files and overrides
    assert _value(text) == text
    path = tmp_path / "c.yaml"
    path.write_text(f"experiment:\n  output_dir: {text}\n")
    assert load_config(path).experiment.output_dir == text
    cfg = load_config(None, [f"experiment.output_dir={text}"])
    assert load_config(write_resolved_config(cfg, tmp_path / "run")) == cfg


def test_experiment_name_can_be_a_date() -> None:
    assert load_config(None, ["experiment.name=2024-01-01"]).experiment.name == "2024-01-01"


def _alias_bomb(levels: int) -> str:
    parts = ["&a0 [x,x,x,x,x,x,x,x,x,x]"]
    parts += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"  # about 10**levels values in a few hundred characters


def test_an_override_is_held_to_the_files_expansion_limit(tmp_path: Path) -> None:
    value = _alias_bomb(7)
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"experiment.name={value}"])
    assert time.perf_counter() - started < 5  # refused before anything is copied out
    (problem,) = info.value.problems
    assert f"more than the {MAX_CONFIG_VALUES:,} values allowed (YAML aliases?)" in problem
    # several overrides under the limit each are counted together
    half = "[" + ", ".join(["&b [" + ",".join(["y"] * 1000) + "]"] + ["*b"] * 60) + "]"
    with pytest.raises(ConfigError, match="values allowed"):
        parse_overrides([f"a={half}", f"b={half}"])
    assert len(parse_overrides([f"a={half}"])["a"]) == 61  # one alone is within it


@pytest.mark.parametrize(
    "text", ["/w/proj #2/runs", "/w/exp: v2", 'a"b\\c', "/w/é/😀", "/w/\udcff", "tab\there", "", "*/5"]
)
def test_yaml_quoted_reads_back_as_the_same_text(text: str) -> None:
    assert parse_overrides([f"k={yaml_quoted(text)}"]) == {"k": text}
