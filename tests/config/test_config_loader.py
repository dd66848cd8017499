"""Loading `stages.yaml` + overrides into `LibraConfig`, and the error lines users see."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from libra_core.config import (
    ConfigError,
    LibraConfig,
    config_to_yaml,
    format_problems,
    load_config,
    parse_overrides,
    write_resolved_config,
)
from libra_core.config.loader import apply_overrides

STAGES_YAML = Path(__file__).resolve().parents[2] / "stages.yaml"

# Keys whose value in stages.yaml deliberately differs from the model default, as dotted path ->
# value in stages.yaml. Add an entry here when tuning stages.yaml; everything else must match.
TUNED_IN_STAGES_YAML: dict[str, Any] = {}


def write(tmp_path: Path, text: str, name: str = "stages.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def leaf_paths(data: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        paths |= leaf_paths(value, dotted + ".") if isinstance(value, dict) else {dotted}
    return paths


# ---------------------------------------------------------------------------- stages.yaml


def test_stages_yaml_equals_defaults_except_tuned_keys() -> None:
    expected = LibraConfig.model_validate(
        apply_overrides(LibraConfig().model_dump(mode="json"), TUNED_IN_STAGES_YAML)
    )
    assert load_config(STAGES_YAML) == expected


def test_stages_yaml_spells_out_every_key() -> None:
    raw = yaml.safe_load(STAGES_YAML.read_text(encoding="utf-8"))
    assert leaf_paths(raw) == leaf_paths(LibraConfig().model_dump(mode="json"))


def test_no_path_and_no_overrides_gives_defaults() -> None:
    assert load_config(None) == LibraConfig()


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "# nothing set\n")) == LibraConfig()


# ---------------------------------------------------------------------------- overrides


def test_parse_overrides_types_values_with_yaml() -> None:
    parsed = parse_overrides(
        [
            "experiment.iterations=3",
            "training.optimizer.lr=1e-4",
            "training.grpo.scale_by_std=false",
            "training.optimizer.betas=[0.8, 0.99]",
            "experiment.name=my-run",
            "model={type: hf_local, path: /models/q}",
            "rollout.engine.host= 0.0.0.0 ",
            "experiment.output_dir=a=b",
        ]
    )
    assert parsed == {
        "experiment.iterations": 3,
        "training.optimizer.lr": 1e-4,
        "training.grpo.scale_by_std": False,
        "training.optimizer.betas": [0.8, 0.99],
        "experiment.name": "my-run",
        "model": {"type": "hf_local", "path": "/models/q"},
        "rollout.engine.host": "0.0.0.0",
        "experiment.output_dir": "a=b",
    }
    assert type(parsed["experiment.iterations"]) is int
    assert type(parsed["training.optimizer.lr"]) is float


def test_parse_overrides_later_item_wins() -> None:
    assert parse_overrides(["eval.every=1", "eval.every=7"]) == {"eval.every": 7}


def test_parse_overrides_reports_every_malformed_item() -> None:
    with pytest.raises(ConfigError) as info:
        parse_overrides(["experiment.seed", "=3", "a..b=1", "eval.every=2", "x=[1,"])
    err = info.value
    assert err.source == "<overrides>"
    assert len(err.problems) == 4
    assert "'experiment.seed'" in err.problems[0] and "no '='" in err.problems[0]
    assert "'=3'" in err.problems[1] and "empty key" in err.problems[1]
    assert "'a..b=1'" in err.problems[2] and "empty key" in err.problems[2]
    assert "'x=[1,'" in err.problems[3] and "not valid YAML" in err.problems[3]


def test_parse_overrides_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError, match="list of 'key.path=value' strings"):
        parse_overrides("eval.every=1")  # type: ignore[arg-type]


def test_load_config_applies_typed_overrides_on_top_of_file() -> None:
    cfg = load_config(
        STAGES_YAML,
        [
            "training.optimizer.lr=1e-4",
            "environment.operators=[+, '-']",
            "stages.rollout.size=3",
            "experiment.name=tuned",
        ],
    )
    assert cfg.training.optimizer.lr == pytest.approx(1e-4)
    assert cfg.environment.operators == ("+", "-")
    assert cfg.stages.rollout.size == 3
    assert cfg.stages.rollout.pool == "rollout"
    assert cfg.experiment.name == "tuned"
    assert cfg.experiment.iterations == LibraConfig().experiment.iterations


def test_override_can_switch_model_variant() -> None:
    cfg = load_config(STAGES_YAML, ["model={type: hf_local, path: /models/qwen3}"])
    assert cfg.model.type == "hf_local"
    assert cfg.model.path == "/models/qwen3"
    assert cfg.model.dtype == "bfloat16"


def test_setting_a_different_type_switches_the_variant() -> None:
    # the file configures the arithmetic task; `environment.type=code` drops its keys, and later
    # overrides set the new variant's keys
    cfg = load_config(STAGES_YAML, ["environment.type=code", "environment.max_turns=3"])
    assert cfg.environment.type == "code"
    assert cfg.environment.max_turns == 3
    # the same type keeps the section's other keys
    same = load_config(STAGES_YAML, ["environment.type=arithmetic", "environment.max_ops=3"])
    assert (same.environment.type, same.environment.max_ops, same.environment.min_ops) == ("arithmetic", 3, 1)


def test_apply_overrides_creates_sections_and_leaves_input_alone() -> None:
    raw = {"experiment": {"name": "a"}}
    merged = apply_overrides(raw, {"experiment.seed": 4, "training.grpo.kl_coef": 0.1})
    assert merged == {"experiment": {"name": "a", "seed": 4}, "training": {"grpo": {"kl_coef": 0.1}}}
    assert raw == {"experiment": {"name": "a"}}


def test_override_into_non_mapping_names_the_path(tmp_path: Path) -> None:
    path = write(tmp_path, "experiment:\n  name: run\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["experiment.name.first=x"])
    assert info.value.source == "<overrides>"
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.startswith("experiment.name.first: cannot set, experiment.name holds 'run' (str)")


# ---------------------------------------------------------------------------- validation errors


def test_three_problems_in_one_file_each_name_their_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        experiment:
          iterations: abc
          foo: 1
        stages:
          rollout: {pool: rollout, size: -1}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert err.source == str(path)
    assert sorted(err.problems) == sorted(
        [
            "experiment.iterations: Input should be a valid integer, unable to parse string as an integer;"
            " got 'abc'",
            "experiment.foo: unknown key; allowed keys: name, iterations, seed, output_dir,"
            " checkpoint_every, keep_checkpoints, artifacts_every",
            "stages.rollout.size: Input should be greater than or equal to 1; got -1",
        ]
    )


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, "environment:\n  reward:\n    corect: 2.0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "environment.reward.corect: unknown key; allowed keys: correct, well_formed, malformed;"
        " did you mean 'correct'?"
    ]


def test_unknown_top_level_section_lists_sections() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["trainer.lr=1"])
    assert info.value.problems == [
        "trainer: unknown key; allowed keys: experiment, model, tokenizer, environment, stages, rollout,"
        " training, pipeline, scheduler, planner, eval, pools, schedule; did you mean 'training'?"
    ]


def test_unknown_key_in_model_variant_lists_that_variants_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  type: hf_local\n  path: /m\n  hidden_size: 64\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == ["model.hidden_size: unknown key; allowed keys: type, path, dtype"]


def test_model_variant_errors_name_the_type_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "model:\n  type: gpt5\n"))
    assert info.value.problems == [
        "model.type: unknown variant 'gpt5'; allowed: 'tiny_qwen2', 'hf_local', 'smollm2'"
    ]

    # without `type`, a model section means the default tiny model
    partial = "model:\n  hidden_size: 64\n  num_heads: 2\n  num_kv_heads: 2\n"
    assert load_config(write(tmp_path, partial)).model.hidden_size == 64

    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "model:\n  type: hf_local\n"))
    assert info.value.problems == ["model.path: required key is missing"]


def test_literal_error_lists_allowed_values_and_the_bad_one() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(STAGES_YAML, ["training.device=tpu", "environment.operators=[+, /]"])
    assert sorted(info.value.problems) == [
        "environment.operators[1]: Input should be '+', '-' or '*'; got '/' (from an override)",
        "training.device: Input should be 'cpu', 'cuda' or 'auto'; got 'tpu' (from an override)",
    ]


def test_every_cross_section_problem_is_reported_and_blamed_on_the_override_that_made_it(
    tmp_path: Path,
) -> None:
    # pydantic stops at the first after-validator that raises: two problems showed one, under
    # "(top level)", and none was ever blamed on an override (until 2026-12-07).
    path = write(tmp_path, "stages:\n  update:\n    size: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["scheduler.type=oracle", "pipeline={mode: async, max_staleness: 1}"])
    assert info.value.problems == [
        "scheduler.type 'oracle' reads realised lengths and is for `libra trace-eval` only; choose "
        "another scheduler for a run (from an override)",
        "stages.update.size 2: the update stage runs one trainer process (data-parallel ranks are "
        "not launched yet); use 1",
        "pipeline.max_staleness 1 with pipeline.mode async: one update (4 optimizer steps = "
        "training.grpo.minibatches) overlaps the next rollout, so pipeline.max_staleness must be "
        ">= 4 (from an override)",
    ]


def test_cross_field_check_reports_the_section(tmp_path: Path) -> None:
    path = write(tmp_path, "environment:\n  min_ops: 5\n  max_ops: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == ["environment: min_ops (5) must not exceed max_ops (2)"]


def test_problems_without_a_file_come_from_overrides() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["eval.every=-2"])
    assert info.value.source == "<overrides>"
    assert info.value.problems == ["eval.every: Input should be greater than or equal to 0; got -2"]


# ---------------------------------------------------------------------------- file errors


def test_yaml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "experiment:\n  name: x\n  iterations: [1\nmodel: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("invalid YAML at line 4, column 6:")


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "eval:\n  every: 1\neval:\n  every: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "invalid YAML at line 3, column 1: duplicate key 'eval' (first defined on line 1)"
    ]


def test_unhashable_key_is_a_yaml_error_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "? [a]\n: 1\n"))
    assert info.value.problems == [
        "invalid YAML at line 1, column 3: while constructing a mapping; found unhashable key"
    ]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert info.value.problems == [f"config file not found: {path}; pass an existing YAML file"]


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "- experiment\n- model\n"))
    assert info.value.problems == [
        "top level must be a mapping of sections (experiment:, model:, ...), got list"
    ]


# ---------------------------------------------------------------------------- output


def non_default_config() -> LibraConfig:
    return load_config(
        STAGES_YAML,
        [
            "model={type: hf_local, path: /models/qwen3, dtype: float32}",
            "training.optimizer.lr=2.5e-6",
            "training.optimizer.betas=[0.8, 0.95]",
            "environment.operators=['*']",
            "rollout.engine.extra_args=['--enforce-eager', '--max-num-batched-tokens', '7']",
            "experiment.output_dir='::runs'",  # a string YAML would read as something else unquoted
            "experiment.name=round.trip-1",
        ],
    )


def test_config_to_yaml_round_trips(tmp_path: Path) -> None:
    for cfg in (LibraConfig(), non_default_config()):
        path = tmp_path / "resolved.yaml"
        path.write_text(config_to_yaml(cfg), encoding="utf-8")
        assert load_config(path) == cfg


def test_a_next_line_character_survives_the_resolved_config(tmp_path: Path) -> None:
    # U+0085 is a line break to YAML: written raw, `qwen\x85v2` read back as `qwen v2`
    cfg = load_config(None, ['model={type: hf_local, path: "/models/qwen\\x85v2"}'])
    assert cfg.model.path == "/models/qwen\x85v2"
    assert load_config(write_resolved_config(cfg, tmp_path / "run")) == cfg


def test_write_resolved_config_is_complete_and_leaves_no_temp_files(tmp_path: Path) -> None:
    cfg = non_default_config()
    run_dir = tmp_path / "runs" / "x-1"
    written = write_resolved_config(cfg, run_dir)
    assert written == run_dir / "config.resolved.yaml"
    assert load_config(written) == cfg
    assert leaf_paths(yaml.safe_load(written.read_text(encoding="utf-8"))) == leaf_paths(
        cfg.model_dump(mode="json")
    )
    written = write_resolved_config(LibraConfig(), run_dir)  # replaces the previous file
    assert load_config(written) == LibraConfig()
    assert [p.name for p in run_dir.iterdir()] == ["config.resolved.yaml"]
    assert written.stat().st_mode & 0o777 == 0o644


def test_config_is_frozen() -> None:
    cfg = load_config(STAGES_YAML)
    with pytest.raises(ValidationError):
        cfg.experiment.iterations = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cfg.experiment = cfg.experiment  # type: ignore[misc]
    assert cfg.experiment.iterations == LibraConfig().experiment.iterations


# ---------------------------------------------------------------------------- ConfigError


def test_format_problems_prefixes_each_line_with_the_source() -> None:
    err = ConfigError(["a.b: bad", "c: worse"], "stages.yaml")
    assert format_problems(err) == "stages.yaml: a.b: bad\nstages.yaml: c: worse"
    assert str(err) == format_problems(err)


def test_config_error_survives_pickling() -> None:
    err = pickle.loads(pickle.dumps(ConfigError(["x: y"], "<overrides>")))
    assert (err.problems, err.source) == (["x: y"], "<overrides>")


def test_schedule_cron_and_timezone_are_checked() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["schedule.cron=61 2 * * *", "schedule.timezone=Mars/Base"])
    problems = " ".join(info.value.problems)
    assert "'61 2 * * *' is not a valid cron expression" in problems
    with pytest.raises(ConfigError) as info:
        load_config(None, ["schedule.cron=0 2 * *"])
    assert "must have 5 fields" in info.value.problems[0]
    with pytest.raises(ConfigError) as info:
        load_config(None, ["schedule.timezone=Mars/Base"])
    assert "'Mars/Base' is not a known IANA time zone" in info.value.problems[0]


def test_schedule_errors_name_their_key_once_and_each_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["schedule.cron=61 2 * * *", "schedule.timezone=Mars/Base"])
    problems = info.value.problems
    assert len(problems) == 2, problems  # a model validator stopped at the cron
    cron, timezone = sorted(problems)
    assert cron.startswith("schedule.cron: '61 2 * * *'") and cron.count("schedule") == 1
    assert timezone.startswith("schedule.timezone: 'Mars/Base'")


@pytest.mark.parametrize(
    ("cron", "never"),
    [
        ("0 2 31 2 *", True),
        ("0 2 30,31 FEB *", True),
        ("0 2 31 4,6 *", True),
        ("0 2 32 * *", False),
        ("0 2 1 13 *", False),  # a bad month is not a date that never comes ("Bad month")
        ("0 2 31 0 *", False),
    ],
)
def test_a_date_no_month_has_is_said_to_never_fire(cron: str, never: bool) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"schedule.cron={cron}"])
    (problem,) = info.value.problems
    assert ("never fires: no month in the month field" in problem) is never, problem
    assert ("is not a valid cron expression" in problem) is not never, problem
    cfg = load_config(None, ["schedule.cron=30 4 * * 1", "schedule.timezone=Europe/Berlin"])
    assert (cfg.schedule.cron, cfg.schedule.timezone) == ("30 4 * * 1", "Europe/Berlin")
    assert load_config(None, ["schedule.cron=null"]).schedule.cron is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("schedule.cron=0 2 LW * *", "'LW' (the last weekday of the month) in the day field"),
        ("schedule.cron=0 2 * * 5L", "e.g. 'L5' for the last Friday), got '5L'"),
        ("schedule.timezone=right/UTC", "'right/UTC' is not a known IANA time zone"),
    ],
)
def test_a_schedule_prefect_would_refuse_fails_validation(override: str, message: str) -> None:
    # These passed `libra config validate` before 2026-12-06 and failed only at `libra serve`.
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in info.value.problems[0]


def test_prefects_spelling_of_the_last_weekday_of_the_month_is_accepted() -> None:
    # cronsim alone refused `L5` (Prefect's "last Friday"), and `?`.
    assert load_config(None, ["schedule.cron=0 2 ? * L5"]).schedule.cron == "0 2 ? * L5"


def test_data_parallel_update_backends_are_refused_not_ignored() -> None:
    # the update stage is single-process: a ddp/deepspeed setting must not silently train on one rank
    for backend in ("ddp", "deepspeed"):
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"training.backend={backend}"])
        assert f"training.backend '{backend}': the GRPO update stage runs a single process" in " ".join(
            info.value.problems
        )
    assert load_config(None, ["training.backend=torch"]).training.backend == "torch"


def test_a_boolean_is_not_a_number() -> None:
    # Pydantic's lax mode read YAML's `yes` as 1 iteration.
    with pytest.raises(ConfigError) as err:
        load_config(None, ["experiment.iterations=true", "rollout.temperature=false"])
    text = "\n".join(err.value.problems)
    assert "iterations: expected a number, got true" in text
    assert "temperature: expected a number, got false" in text
    assert load_config(None, ["experiment.iterations=3"]).experiment.iterations == 3
    # items that are Annotated numbers were read as 1/0
    with pytest.raises(ConfigError, match=r"payload_class_edges: expected numbers, got false, true"):
        load_config(None, ["scheduler.payload_class_edges=[false, true, 2048]"])
    with pytest.raises(ConfigError, match=r"latency_ms: expected numbers, got true"):
        load_config(None, ["environment.type=search", "environment.latency_ms=[true, 3]"])


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        # vLLM kept the last of a repeated flag: these silently changed what Libra set
        (["rollout.engine.extra_args=[--logprobs-mode, raw_logprobs]"], r"--logprobs-mode is set by Libra"),
        (
            ["rollout.engine.extra_args=[--max_model_len=64]"],
            r"--max_model_len is set by rollout.max_total_tokens",
        ),
        # raw socket errors at pool start
        (["rollout.engine.host=::1"], r"IPv6 addresses are not supported"),
        (["rollout.engine.host=''"], r"host '': give an IPv4 address or a host name"),
        (
            ["rollout.engine.base_port=65535", "stages.rollout.size=2"],
            r"base_port 65535 leaves no port for 2",
        ),
        # vLLM refused it after the run folder and the GGUF conversion
        (
            [
                "model={type: smollm2}",
                "environment={type: math_tools, prompt_format: chatml}",
                "rollout.max_total_tokens=9000",
            ],
            r"max_total_tokens \(9000\) exceeds model.max_position_embeddings \(8192\)",
        ),
    ],
)
def test_engine_settings_that_would_fail_at_pool_start_are_refused(
    overrides: list[str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(None, overrides)
    assert load_config(None, ["rollout.engine.extra_args=[--enforce-eager]"]).rollout.engine.extra_args == (
        "--enforce-eager",
    )


def test_an_integer_too_long_to_read_is_a_config_error(tmp_path: Path) -> None:
    # past Python's 4300-digit limit the loader raised a raw ValueError (a traceback)
    path = _file(tmp_path, f"experiment:\n  seed: {'9' * 5000}\n")
    with pytest.raises(ConfigError, match=r"line 2, column \d+: an integer of 5,000 characters is too long"):
        load_config(path, [])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("pools.type=ray", "pools.type 'ray': the experiment flow runs its trainer in a local worker pool"),
        ("stages.update.size=2", "stages.update.size 2: the update stage runs one trainer process"),
        ("stages.reward.pool=trainer", "stages.reward.pool=trainer: stages run on their default pools"),
    ],
)
def test_pool_settings_the_flow_does_not_run_are_refused_not_ignored(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert message in " ".join(info.value.problems)
    assert load_config(None, ["stages.rollout.size=2"]).stages.rollout.size == 2  # rollout sizes are run


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stages.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_setting_the_type_of_a_plain_section_keeps_the_files_keys(tmp_path: Path) -> None:
    # only tagged unions (model, environment) switch variants; scheduler.type is a plain key
    path = _file(tmp_path, "scheduler: {type: least_load, buckets: [30, 90]}\n")
    assert load_config(path, ["scheduler.type=cmlfq"]).scheduler.buckets == (30, 90)


def test_a_variant_switch_keeps_what_the_command_line_set(tmp_path: Path) -> None:
    cfg = load_config(None, ["environment.max_turns=3", "environment.type=code"])
    assert (cfg.environment.type, cfg.environment.max_turns) == ("code", 3)
    # a file that relies on the default variant (no `type:`) switches as well
    path = _file(tmp_path, "environment:\n  max_ops: 3\n")
    assert load_config(path, ["environment.type=code"]).environment.type == "code"


def test_a_variant_switch_keeps_nested_keys_the_command_line_set(tmp_path: Path) -> None:
    # `environment.reward.correct=2` before `environment.type=code` was dropped silently: only
    # whole keys set by an override were kept
    sets = ["environment.reward.correct=2", "environment.sandbox.cpu_time_s=10", "environment.type=code"]
    cfg = load_config(None, sets)
    assert (cfg.environment.type, cfg.environment.reward.correct, cfg.environment.sandbox.cpu_time_s) == (
        "code",
        2.0,
        10,
    )
    # the file's other reward keys belonged to the old variant: the new variant's defaults
    path = _file(tmp_path, "environment:\n  reward: {correct: 5, malformed: -1}\n")
    cfg = load_config(path, ["environment.reward.correct=2", "environment.type=math_tools"])
    assert (cfg.environment.reward.correct, cfg.environment.reward.malformed) == (2.0, 0.0)


def test_a_repeated_override_wins_in_order() -> None:
    cfg = load_config(None, ["experiment.seed=1", "experiment={seed: 2, iterations: 3}", "experiment.seed=5"])
    assert (cfg.experiment.seed, cfg.experiment.iterations) == (5, 3)


def test_yaml_aliases_and_merges(tmp_path: Path) -> None:
    path = _file(tmp_path, "stages:\n  plan: &d {pool: driver, size: 1}\n  reward: *d\n")
    aliased = apply_overrides(yaml.load(path.read_text(), Loader=yaml.SafeLoader), {"stages.plan.size": 3})
    # one mapping under two names in the file; the override sets the one it names
    assert (aliased["stages"]["plan"]["size"], aliased["stages"]["reward"]["size"]) == (3, 1)
    merged = _file(
        tmp_path, "stages:\n  plan: &d {pool: driver, size: 1}\n  reward:\n    <<: *d\n    pool: driver\n"
    )
    assert load_config(merged).stages.reward.pool == "driver"  # a key over a merge is no duplicate


def test_integers_and_booleans_read_as_yaml_1_2() -> None:
    assert parse_overrides(["a=010", "b=1:30", "c=yes", "d=on", "e=true", "f=0x10", "g=0o17", "h=-3"]) == {
        "a": 10, "b": "1:30", "c": "yes", "d": "on", "e": True, "f": 16, "g": 15, "h": -3,
    }  # fmt: skip
    assert load_config(None, ["experiment.seed=010"]).experiment.seed == 10


def test_the_resolved_config_reads_back_whatever_its_strings(tmp_path: Path) -> None:
    cfg = load_config(None, ["rollout.engine.extra_args=['--max-num-batched-tokens', '2e4', 'yes', '010']"])
    assert load_config(write_resolved_config(cfg, tmp_path)) == cfg


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        # accuracy counts reward >= correct: these counted wrong or missing answers as correct
        (["environment.reward.well_formed=1.0"], r"correct \(1.0\) must be above well_formed \(1.0\)"),
        (["environment.reward.correct=0.0"], r"correct \(0.0\) must be above well_formed \(0.1\)"),
        (["environment.type=code", "environment.reward.malformed=2"], r"and malformed \(2.0\)"),
        # the search service capped it silently
        (
            ["environment.type=search", "environment.top_k=10"],
            r"top_k \(10\) must be at most max_top_k \(5\)",
        ),
    ],
)
def test_environment_settings_that_disagree_are_refused(overrides: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(None, overrides)


def test_an_oracle_scheduler_is_refused_in_a_run() -> None:
    # It reads realised lengths: only trace-eval can run it. A run passed every check, made its
    # folder, warmed up, started vLLM and failed at its first rollout (until 2026-12-07).
    with pytest.raises(ConfigError) as info:
        load_config(None, ["scheduler.type=oracle"])
    assert "scheduler.type 'oracle'" in info.value.problems[0] and "trace-eval" in info.value.problems[0]
    from libra_core.config.models import SchedulerConfig

    assert SchedulerConfig(type="oracle").type == "oracle"  # trace-eval builds it on its own


def test_a_section_with_every_key_commented_out_takes_its_defaults(tmp_path: Path) -> None:
    # `eval:` with its keys commented out is YAML's null: an error, blamed on the override when one
    # set a key under it (until 2026-12-07); an empty file was already all defaults.
    path = tmp_path / "stages.yaml"
    path.write_text("eval:\n  # every: 5\ntraining:\n  grpo:\n    # kl_coef: 0.0\nschedule:\n  cron: null\n")
    cfg = load_config(path)
    assert cfg.eval.every == 5 and cfg.training.grpo.kl_coef == 0.0
    assert cfg.schedule.cron is None  # a field that takes null keeps it
    assert load_config(path, ["eval.every=2"]).eval.every == 2


def test_a_value_yaml_reads_as_another_type_says_how_to_keep_it_text() -> None:
    # A mapping was not shown at all, and nothing said to quote it (until 2026-12-07).
    with pytest.raises(ConfigError) as info:
        load_config(None, ["experiment.output_dir=/data/run: 2"])
    assert "got {'/data/run': 2} (YAML read it as dict: quote it to keep it text)" in info.value.problems[0]
    with pytest.raises(ConfigError) as info:
        load_config(None, ["experiment.name=007"])
    assert "got 7 (YAML read it as int: quote it to keep it text)" in info.value.problems[0]
