"""Bounds on what a config may hold: sizes a file can expand to, seeds, and settings that must
agree with each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.config import ConfigError, load_config


def test_a_file_whose_aliases_expand_to_millions_of_values_is_refused(tmp_path: Path) -> None:
    # Eight lines stand for 12 million values (a6 alone is 11,111,111): copying and validating
    # them took tens of seconds and gigabytes; one level more ran out of memory.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join([*lines, "experiment: {name: x}"]) + "\n")
    with pytest.raises(ConfigError, match=r"config expands to 12,345,680 values \(YAML aliases\?\)"):
        load_config(path)


def test_a_seed_past_31_bits_is_refused() -> None:
    # 2**64 validated, then overflowed torch.manual_seed at the warm-up (2**62: at the first update)
    assert load_config(None, ["experiment.seed=2147483647"]).experiment.seed == 2**31 - 1
    too_big = "experiment.seed: Input should be less than or equal to 2147483647"
    with pytest.raises(ConfigError, match=too_big):
        load_config(None, ["experiment.seed=2147483648"])


@pytest.mark.parametrize(
    ("mode", "staleness", "ok"),
    [("sync", 0, True), ("async", 1, True), ("async", 0, False), ("sync", 1, False)],
)
def test_the_libra_planner_prices_the_pipeline_mode_that_runs(mode: str, staleness: int, ok: bool) -> None:
    # an async run left at the default staleness 0 was planned as if its stages took turns
    overrides = ["planner.type=libra", f"pipeline.mode={mode}", f"planner.staleness={staleness}"]
    if ok:
        assert load_config(None, overrides).planner.staleness == staleness
    else:
        with pytest.raises(ConfigError, match=f"planner.staleness {staleness} with pipeline.mode {mode}"):
            load_config(None, overrides)
    assert load_config(None, ["pipeline.mode=async"]).planner.staleness == 0  # static planner: unused


@pytest.mark.parametrize(
    "override",
    [
        # the saved C-MLFQ tree held Infinity, which the next rollout refused to load
        "scheduler.aging_half_life_versions=.inf",
        "scheduler.prompt_size_bins_per_octave=.inf",  # OverflowError at the first admission
        "training.optimizer.lr=.nan",
        "rollout.temperature=.inf",
        "rollout.engine.request_timeout_s=.inf",
    ],
)
def test_inf_and_nan_are_refused_in_any_section(override: str) -> None:
    key = override.split("=")[0].split(".")[-1]
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
        load_config(None, [override])


def test_a_negative_payload_class_edge_is_refused() -> None:
    # accepted here, then refused by the C-MLFQ tree file the first rollout saved
    with pytest.raises(
        ConfigError, match=r"payload_class_edges\[0\]: Input should be greater than or equal to 0; got -5"
    ):
        load_config(None, ["scheduler.payload_class_edges=[-5, 16]"])


@pytest.mark.parametrize("backend", ["ddp", "deepspeed"])
def test_a_multi_rank_backend_is_refused_in_an_experiment(backend: str) -> None:
    # the update stage runs one process; a data-parallel backend would be silently ignored there
    with pytest.raises(
        ConfigError, match=rf"training.backend '{backend}': the GRPO update stage runs a single"
    ):
        load_config(None, [f"training.backend={backend}"])


@pytest.mark.parametrize(
    ("betas", "named"),
    [
        ("[1.0, 0.999]", r"betas\[0\]: Input should be less than 1; got 1.0"),
        ("[0.9, -0.5]", r"betas\[1\]: Input should be greater than or equal to 0; got -0.5"),
    ],
)
def test_adam_betas_outside_0_1_are_refused(betas: str, named: str) -> None:
    # accepted here, then refused by torch.optim.AdamW at the first update (after warm-up and rollout)
    assert load_config(None, ["training.optimizer.betas=[0.0, 0.99]"]).training.optimizer.betas == (0.0, 0.99)
    with pytest.raises(ConfigError, match=rf"training\.optimizer\.{named}"):
        load_config(None, [f"training.optimizer.betas={betas}"])


def test_a_temperature_vllm_reads_as_greedy_is_refused() -> None:
    # vLLM sampled greedily below 1e-5 and reported unscaled log-probs; the trainer divided the
    # logits by the temperature, so the importance ratio compared two different distributions
    assert load_config(None, ["rollout.temperature=1e-5"]).rollout.temperature == 1e-5
    assert load_config(None, ["rollout.temperature=0"]).rollout.temperature == 0
    with pytest.raises(ConfigError, match=r"temperature=1e-06: vLLM treats any temperature below 1e-05"):
        load_config(None, ["rollout.temperature=1e-6"])
