"""Initial policy preparation: tiny model end to end, the warm-up cache, and local HF folders."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from libra_core.config.models import LibraConfig
from libra_core.model import policy as policy_module
from libra_core.model import prepare as prepare_module
from libra_core.model.prepare import META_FILE, cache_key, prepare_initial_policy, warmup_sources


def tiny_config(**warmup) -> LibraConfig:
    return LibraConfig.model_validate(
        {
            "model": {
                "type": "tiny_qwen2",
                "hidden_size": 64,
                "num_layers": 1,
                "num_heads": 2,
                "num_kv_heads": 2,
                "head_dim": 32,
                "intermediate_size": 64,
            },
            "training": {"device": "cpu", "warmup": {"steps": 4, "batch_size": 8, **warmup}},
        }
    )


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("prepare")
    progress: list[int] = []
    start = time.perf_counter()
    prepared = prepare_initial_policy(
        tiny_config(),
        root / "run1" / "policy",
        root / "cache",
        progress=lambda step, total, loss: progress.append(step),
        num_eval_problems=4,
    )
    return root, prepared, time.perf_counter() - start, progress


def test_tiny_policy_is_built_and_warmed_up(first) -> None:
    root, prepared, _, progress = first
    assert prepared.from_cache is False and prepared.path == root / "run1" / "policy"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", META_FILE} <= {
        p.name for p in prepared.path.iterdir()
    }
    assert progress == [1, 2, 3, 4] and len(prepared.sft_losses_tail) == 4
    assert prepared.greedy_accuracy is not None and 0.0 <= prepared.greedy_accuracy <= 1.0
    assert 10_000 < prepared.num_params < 100_000


def test_second_call_comes_from_cache_and_is_fast(first) -> None:
    root, prepared, first_s, _ = first
    start = time.perf_counter()
    again = prepare_initial_policy(
        tiny_config(), root / "run2" / "policy", root / "cache", num_eval_problems=4
    )
    cached_s = time.perf_counter() - start
    assert again.from_cache is True
    assert (again.num_params, again.sft_losses_tail, again.greedy_accuracy) == (
        prepared.num_params,
        prepared.sft_losses_tail,
        prepared.greedy_accuracy,
    )
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again.path / name).read_bytes() == (prepared.path / name).read_bytes()
    assert cached_s < 1.0 and cached_s < first_s / 2, (cached_s, first_s)
    assert [p.name for p in (root / "cache").iterdir() if p.name.startswith(".")] == []


def test_cache_disabled_or_no_root_recomputes(first, tmp_path: Path) -> None:
    root, _, _, _ = first
    prepared = prepare_initial_policy(
        tiny_config(cache=False), tmp_path / "p", root / "cache", num_eval_problems=0
    )
    assert prepared.from_cache is False and prepared.greedy_accuracy is None
    prepared = prepare_initial_policy(tiny_config(), tmp_path / "q", None, num_eval_problems=0)
    assert prepared.from_cache is False


def test_cache_key_tracks_what_determines_the_weights() -> None:
    base = cache_key(tiny_config(), 4)
    assert cache_key(tiny_config(cache=False), 4) == base
    assert cache_key(tiny_config(steps=5), 4) != base
    assert cache_key(tiny_config(), 8) != base
    seeded = tiny_config().model_copy(
        update={"experiment": tiny_config().experiment.model_copy(update={"seed": 1})}
    )
    assert cache_key(seeded, 4) != base


def test_hf_local_copies_the_folder(first, tmp_path: Path) -> None:
    _, prepared, _, _ = first
    cfg = LibraConfig.model_validate({"model": {"type": "hf_local", "path": str(prepared.path)}})
    linked = prepare_initial_policy(cfg, tmp_path / "policy", tmp_path / "cache")
    # a real copy: the update stage rewrites the run's policy, never the user's source model
    assert not linked.path.is_symlink()
    assert linked.path.resolve() != prepared.path.resolve()
    src_weights = (prepared.path / "model.safetensors").read_bytes()
    assert (linked.path / "model.safetensors").read_bytes() == src_weights
    (linked.path / "model.safetensors").write_bytes(b"overwritten by an update")
    assert (prepared.path / "model.safetensors").read_bytes() == src_weights
    assert (linked.path / "config.json").is_file()
    assert linked.num_params == prepared.num_params
    assert (linked.from_cache, linked.sft_losses_tail, linked.greedy_accuracy) == (False, (), None)
    assert not (tmp_path / "cache").exists()


def test_hf_local_without_config_is_a_clear_error(tmp_path: Path) -> None:
    cfg = LibraConfig.model_validate({"model": {"type": "hf_local", "path": str(tmp_path)}})
    with pytest.raises(ValueError, match="config.json"):
        prepare_initial_policy(cfg, tmp_path / "policy", None)


def test_cache_key_tracks_the_rollout_limits_the_accuracy_runs_under() -> None:
    base = cache_key(tiny_config(), 4)
    for key, value in (("max_tokens_per_turn", 32), ("max_total_tokens", 300)):
        limited = tiny_config().model_copy(
            update={"rollout": tiny_config().rollout.model_copy(update={key: value})}
        )
        assert cache_key(limited, 4) != base, key


def test_cache_key_tracks_the_data_files_contents(tmp_path: Path) -> None:
    # Same config text, other data: an edited file must not bring back the old warm-up.
    data = tmp_path / "data"
    data.mkdir()
    file = data / "problems.jsonl"
    file.write_text('{"question": "What is 2 plus 3?", "answer": "#### 5"}\n')
    cfg = LibraConfig.model_validate(
        {"environment": {"type": "math_tools", "data_dir": str(data), "files": ["problems.jsonl"]}}
    )
    before = cache_key(cfg, 4)
    assert cache_key(cfg, 4) == before
    file.write_text('{"question": "Tom has 40 apples and eats 7. How many are left?", "answer": "#### 33"}\n')
    assert cache_key(cfg, 4) != before
    file.unlink()
    with pytest.raises(FileNotFoundError, match="problems.jsonl"):
        cache_key(cfg, 4)


def test_hf_local_with_a_dangling_link_is_a_clear_error_and_leaves_nothing(first, tmp_path: Path) -> None:
    _, prepared, _, _ = first
    src = tmp_path / "model"
    shutil.copytree(prepared.path, src)
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to(tmp_path / "pruned-from-the-hub-cache")
    cfg = LibraConfig.model_validate({"model": {"type": "hf_local", "path": str(src)}})
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"cannot copy .*tokenizer\.json .*dangling"):
        prepare_initial_policy(cfg, run / "policy", None)
    assert list(run.iterdir()) == []  # no half copy left beside the run's policy


def test_the_reported_accuracy_runs_under_the_runs_limits(monkeypatch, tmp_path: Path) -> None:
    # It is the curve's first point: measured with other turn or token limits than the rollouts
    # have, it over- or under-states what the policy reaches in the run.
    seen: dict[str, int | None] = {}

    def spy(model, tokenizer, env, problems, **limits) -> float:
        seen.update(limits)
        return 0.5

    monkeypatch.setattr(prepare_module, "greedy_accuracy", spy)
    base = tiny_config()
    cfg = base.model_copy(
        update={
            "environment": base.environment.model_copy(update={"max_turns": 3}),
            "rollout": base.rollout.model_copy(update={"max_tokens_per_turn": 20, "max_total_tokens": 300}),
        }
    )
    prepared = prepare_initial_policy(cfg, tmp_path / "policy", None, num_eval_problems=2)
    assert prepared.greedy_accuracy == 0.5
    assert seen == {"correct_reward": 1.0, "max_new_tokens": 20, "max_turns": 3, "max_total_tokens": 300}


def test_cache_key_tracks_the_source_of_the_code_that_builds_and_scores_the_warm_up(monkeypatch) -> None:
    # 02863ee changed the SFT stream and the eval set, 227316a/d20986a the rewards behind the cached
    # accuracy, and no RECIPE_VERSION bump followed: old warm-ups came back from the cache.
    cfg = tiny_config()
    base = cache_key(cfg, 4)
    assert cache_key(cfg, 4) == base
    real = prepare_module._read_source

    def edited(target: str):
        return lambda name: real(name) + ("\n# edited\n" if name == target else "")

    for module in ("libra_core.model.sft", "libra_core.envs.splits", "libra_core.envs.calculator"):
        monkeypatch.setattr(prepare_module, "_read_source", edited(module), raising=False)
        assert cache_key(cfg, 4) != base, module
    # another environment's code is not part of this one's key
    monkeypatch.setattr(prepare_module, "_read_source", edited("libra_core.envs.math_tools"), raising=False)
    assert cache_key(cfg, 4) == base


def test_warmup_sources_include_the_environment_and_its_reward_code() -> None:
    def sources(env: dict) -> set[str]:
        return set(warmup_sources(LibraConfig.model_validate({"environment": env})))

    core = {f"libra_core.model.{m}" for m in ("tokenizer", "policy", "sft", "prepare")}
    core |= {"libra_core.envs.splits", "libra_core.envs.protocol"}
    arithmetic = sources({})
    assert core | {"libra_core.envs.arithmetic", "libra_core.envs.calculator"} <= arithmetic
    assert not {"libra_core.envs.math_tools", "libra_core.envs.code", "libra_core.envs.search"} & arithmetic
    # the math reward runs in a worker process that the environment imports inside a function
    math = {"libra_core.envs.math_tools", "libra_core.envs.answer_worker", "libra_core.envs.answer_check"}
    assert core | math <= sources({"type": "math_tools"})
    assert core | {"libra_core.envs.code", "libra_core.envs.sandbox"} <= sources({"type": "code"})
    assert core | {"libra_core.envs.search", "libra_core.envs.answer_check"} <= sources({"type": "search"})
    # the sandbox runs its launcher by file name, not by import; the greedy check's tool calls and
    # the code reward both go through it (it was left out of the key until 2026-12-07)
    assert "libra_core.envs.sandbox_launcher" in sources({"type": "code"})
    assert "libra_core.envs.sandbox_launcher" not in arithmetic


def test_a_head_size_the_cpu_engine_cannot_take_stops_before_the_warm_up(monkeypatch, tmp_path: Path) -> None:
    # It used to warm up, start the engines and crash at the first generation.
    monkeypatch.setattr(policy_module, "vllm_is_cpu_build", lambda: True, raising=False)
    base = tiny_config()
    cfg = base.model_copy(
        update={"model": base.model.model_copy(update={"hidden_size": 64, "num_heads": 4, "head_dim": 16})}
    )
    with pytest.raises(ValueError, match="model.head_dim 16: vLLM's CPU attention supports"):
        prepare_initial_policy(cfg, tmp_path / "run" / "policy", tmp_path / "cache", num_eval_problems=0)
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_training_device_cuda_without_one_is_refused_naming_the_setting(tmp_path: Path) -> None:
    # The update stage said so; the warm-up trained the tokenizer, then failed with torch's
    # "Torch not compiled with CUDA enabled".
    base = tiny_config()
    cfg = base.model_copy(update={"training": base.training.model_copy(update={"device": "cuda"})})
    with pytest.raises(ValueError, match="training.device is 'cuda' but no CUDA device is available"):
        prepare_initial_policy(cfg, tmp_path / "run" / "policy", tmp_path / "cache", num_eval_problems=0)
    assert not (tmp_path / "run").exists()


def test_hf_local_with_a_sharded_checkpoint_is_refused_before_the_copy(first, tmp_path: Path) -> None:
    # load_policy refused it only at the first update, after the engines started and a rollout ran.
    _, prepared, _, _ = first
    src = tmp_path / "model"
    shutil.copytree(prepared.path, src)
    (src / "model.safetensors").rename(src / "model-00001-of-00001.safetensors")
    (src / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    cfg = LibraConfig.model_validate({"model": {"type": "hf_local", "path": str(src)}})
    with pytest.raises(
        ValueError, match=r"model.path .* holds a sharded checkpoint .*re-save the model unsharded"
    ):
        prepare_initial_policy(cfg, tmp_path / "run" / "policy", None)
    assert not (tmp_path / "run").exists()


def test_the_first_update_starts_from_the_exact_warm_up_under_bfloat16_serving(
    monkeypatch, tmp_path: Path
) -> None:
    # Version 0 was stored in the serving dtype: with bfloat16 the trainer's first load_policy got
    # the warm-up rounded to bfloat16, not the float32 weights SFT produced (later versions keep them).
    from safetensors import safe_open

    from libra_core.pipeline.resume import policy_disagreements
    from libra_core.training.checkpoint import load_policy

    warmed: dict[str, torch.Tensor] = {}
    real_sft = prepare_module.sft_warmup

    def recording_sft(model, *args, **kwargs):  # noqa: ANN001, ANN202
        losses = real_sft(model, *args, **kwargs)
        warmed.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return losses

    monkeypatch.setattr(prepare_module, "sft_warmup", recording_sft)
    base = tiny_config()
    cfg = base.model_copy(update={"model": base.model.model_copy(update={"dtype": "bfloat16"})})
    prepared = prepare_initial_policy(cfg, tmp_path / "policy", None, num_eval_problems=0)

    start = load_policy(prepared.path, "cpu").state_dict()
    assert warmed and start.keys() == warmed.keys()
    differ = [k for k in warmed if not torch.equal(start[k], warmed[k])]
    assert differ == [], f"the trainer starts from other weights than the warm-up's: {differ[:3]}"
    assert any(not torch.equal(w, w.bfloat16().float()) for w in warmed.values())  # bf16 would round
    # vLLM still serves bfloat16 (--dtype and config.json), and a resume accepts the folder.
    assert json.loads((prepared.path / "config.json").read_text())["dtype"] == "bfloat16"
    assert policy_disagreements(cfg, prepared.path / "config.json") == []
    with safe_open(prepared.path / "model.safetensors", framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
