"""The tiny Qwen2 policy: how it is built from config and written as a Hugging Face folder.

The folder written by `save_policy` is the hand-off between training and rollout: transformers
reloads it for the update stage and vLLM serves it (`--model DIR`), both offline. Two vLLM
constraints shape the model config:
- vLLM's Qwen2 derives the head size as `hidden_size // num_heads` and ignores `head_dim`, so the
  two must agree (checked here); its CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ...
- Embeddings are untied so `lm_head.weight` is stored and reloaded explicitly.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.config.models import TinyModelConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM


def build_tiny_policy(
    cfg: TinyModelConfig, vocab_size: int, seed: int, *, pad_token_id: int = 0, eos_token_id: int = 1
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM, deterministic given `seed`.

    Weights are float32 whatever `cfg.dtype` says (training runs in float32); `cfg.dtype` is
    recorded in the config and applied by `save_policy(..., dtype=cfg.dtype)`. Special token ids
    are the tokenizer's (bos = eos); the defaults, pad 0 and eos 1, are what `train_tokenizer` gives
    an environment that lists `<|pad|>` and `<|eos|>` first.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if cfg.head_dim * cfg.num_heads != cfg.hidden_size:
        raise ValueError(
            f"head_dim ({cfg.head_dim}) * num_heads ({cfg.num_heads}) must equal hidden_size "
            f"({cfg.hidden_size}): vLLM's Qwen2 uses hidden_size // num_heads as the head size"
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
) -> Path:
    """Write a complete HF model folder (config, safetensors, tokenizer, generation config).

    Atomic: everything is written into a sibling temp folder which then replaces `out_dir`, so a
    reader (a vLLM server restarting on the new policy) never sees a half-written folder. `dtype`
    ("float32"/"bfloat16") casts a copy of the weights; the caller's model is not modified.
    Returns `out_dir`.
    """
    import torch

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    current = next(model.parameters()).dtype
    target = current if dtype is None else getattr(torch, dtype)
    if target != current:
        model = copy.deepcopy(model).to(target)  # type: ignore[arg-type]
    # config.json must state the dtype the weights are stored in (vLLM's dtype="auto" reads it).
    model.config.dtype = str(target).removeprefix("torch.")
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)
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
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(dst, old)
    os.rename(src, dst)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


def _portable_tokenizer_config(path: Path) -> None:
    # transformers 5 writes its internal class name; the v4 name loads in both major versions.
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2) + "\n")
