"""The tiny Qwen2 policy: how it is built from config and written as a Hugging Face folder.

The folder written by `save_policy` is the hand-off between training and rollout: transformers
reloads it for the update stage and vLLM serves it (`--model DIR`), both offline. Two vLLM
constraints shape the model config:
- vLLM's Qwen2 derives the head size as `hidden_size // num_heads` and ignores `head_dim`, so the
  two must agree (TinyModelConfig checks it); vLLM's CPU attention takes only the head sizes in
  `VLLM_CPU_HEAD_SIZES` (`check_servable_head_dim`, called when the policy is prepared).
- Embeddings are untied, as Qwen2 configs default: the update writes `lm_head.weight` as a tensor
  of its own. (A tied model's in-place reload on vLLM 0.32 CPU was measured correct too: engine and
  transformers log-probs agreed exactly after an update; untied is a choice, not a workaround.)

The folder holds one unsharded `model.safetensors`: the update stage rewrites that file in place.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.config.models import TinyModelConfig
from libra_core.data.atomic import sync_folder, sync_tree

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

WEIGHTS_FILE = "model.safetensors"
SHARD_INDEX_FILE = "model.safetensors.index.json"

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""`CPUAttentionBackend.get_supported_head_sizes()` of vllm-cpu 0.32 (a test compares it with the
installed vLLM's source); another size starts the engine and crashes at the first generation."""


def check_servable_head_dim(cfg: TinyModelConfig) -> None:
    """Raise a ValueError if the installed vLLM is the CPU build and its attention cannot take
    `cfg.head_dim`. Called by `prepare_initial_policy` before the tiny model is built, so the run
    stops before minutes of warm-up rather than at the first rollout. GPU builds are not checked:
    their attention backends take other sizes (and vLLM is not imported here: it takes seconds)."""
    if cfg.head_dim in VLLM_CPU_HEAD_SIZES or not vllm_is_cpu_build():
        return
    raise ValueError(
        f"model.head_dim {cfg.head_dim}: vLLM's CPU attention supports head sizes "
        f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}; pick one of them (and hidden_size = head_dim "
        "* num_heads)"
    )


def resolve_training_device(requested: str) -> torch.device:
    """The torch device of `training.device` for the warm-up and the update stage: `auto` is cuda
    when torch sees one, else cpu; `cuda` without one is refused naming the setting (the warm-up
    failed with torch's "not compiled with CUDA enabled", after the tokenizer was trained)."""
    import torch

    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device is 'cuda' but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(requested)


def hf_folder_problem(path_text: str) -> str | None:
    """Why `model.path` (an `hf_local` model) is no Hugging Face model folder, or None. Checked by
    `libra config validate`/`libra run` up front and by the prepare step (a served run's first check)."""
    src = Path(path_text).expanduser().resolve()
    if (src / "config.json").is_file():
        return None
    return (
        f"model.path {path_text!r} is not a Hugging Face model folder (no config.json in {src}); "
        "point it at a local folder with config.json, weights and tokenizer files"
    )


def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is the `vllm-cpu` distribution (which provides the `vllm` module)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def refuse_sharded_checkpoint(folder: Path, name: str) -> None:
    """Raise a ValueError if `folder` (named `name` in the message) holds a sharded checkpoint: the
    update stage loads and rewrites one `model.safetensors`. Called by `prepare_initial_policy` for
    `hf_local` (before the copy) and by `load_policy` (each update)."""
    if (Path(folder) / SHARD_INDEX_FILE).exists():
        raise ValueError(
            f"{name} holds a sharded checkpoint ({SHARD_INDEX_FILE}); the update writes a "
            f"single {WEIGHTS_FILE}, so re-save the model unsharded first"
        )


def build_tiny_policy(
    cfg: TinyModelConfig, vocab_size: int, seed: int, *, pad_token_id: int = 0, eos_token_id: int = 1
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM, deterministic given `seed`.

    Weights are float32 whatever `cfg.dtype` says (training runs in float32); `cfg.dtype`, the
    serving dtype, is recorded in the config and written by `save_policy(..., serving_dtype=...)`,
    which keeps the float32 weights. Special token ids are the tokenizer's (bos = eos); the
    defaults, pad 0 and eos 1, are what `train_tokenizer` gives an environment that lists `<|pad|>`
    and `<|eos|>` first.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    assert cfg.head_dim * cfg.num_heads == cfg.hidden_size, (
        f"head_dim ({cfg.head_dim}) * num_heads ({cfg.num_heads}) != hidden_size ({cfg.hidden_size}): "
        "TinyModelConfig refuses this shape"
    )
    # Passed as a dict: transformers' type stubs do not list `head_dim` although Qwen2 reads it.
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=cfg.num_layers,
        pad_token_id=pad_token_id,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        dtype=cfg.dtype,
    )
    config = Qwen2Config(**fields)
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.bos_token_id = eos_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters (each tensor counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_policy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path | str,
    *,
    dtype: str | None = None,
    serving_dtype: str | None = None,
) -> Path:
    """Write a complete HF model folder (config, safetensors, tokenizer, generation config).

    Atomic: everything is written into a sibling temp folder which then replaces `out_dir`, so a
    reader (a vLLM server restarting on the new policy) never sees a half-written folder. `dtype`
    ("float32"/"bfloat16") casts a copy of the weights that are stored; the caller's weights are not
    modified. `serving_dtype` is the dtype config.json states (default: the stored one), which vLLM
    serves (`--dtype`) and a resume compares with `model.dtype`. Returns `out_dir`.
    """
    import torch

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    current = next(model.parameters()).dtype
    target = current if dtype is None else getattr(torch, dtype)
    if target != current:
        model = copy.deepcopy(model).to(target)  # type: ignore[arg-type]
    stored = str(target).removeprefix("torch.")
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)  # writes config.json's dtype as the stored one
        if serving_dtype is not None and serving_dtype != stored:
            # The trainer's float32 master weights under the serving dtype, as every update writes
            # them (training/checkpoint.py): the first update starts from the exact weights.
            _set_config_dtype(tmp / "config.json", serving_dtype)
        tokenizer.save_pretrained(tmp)
        _portable_tokenizer_config(tmp / "tokenizer_config.json")
        for path in tmp.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; servers may run as another user
        replace_dir(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def replace_dir(src: Path, dst: Path) -> None:
    """Move folder `src` to `dst`, replacing any existing `dst` (same filesystem).

    A directory cannot be renamed over a non-empty one, so an existing `dst` (folder or symlink)
    is first renamed aside; the window in which `dst` is missing is two renames long.
    """
    sync_tree(src)  # on disk before its name is: a power loss leaves the old folder or the new
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(dst, old)
    os.rename(src, dst)
    sync_folder(dst.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


def _set_config_dtype(path: Path, dtype: str) -> None:
    config = json.loads(path.read_text())
    config["dtype"] = dtype
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _portable_tokenizer_config(path: Path) -> None:
    # transformers 5 writes its internal class name; `PreTrainedTokenizerFast.from_pretrained` loads
    # the folder in both major versions, and every Libra loader uses it. `AutoTokenizer` does not
    # honour it under transformers 5: for `model_type: qwen2` it builds `Qwen2Tokenizer`, whose
    # byte-level pre-tokenizer and NFC normaliser drop this tokenizer's spaces (the comment said it
    # loaded in both, until 2026-12-07). vLLM gets and returns token ids, never this text.
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2) + "\n")
