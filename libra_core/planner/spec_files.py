"""Your own model or GPU, from a file: what `--model` and `--hardware COUNTxGPU` accept besides the
built-in names of models.yaml and hardware.yaml.

Who calls it: `specs.get_model` and `specs.get_hardware`, when the name is not a built-in one (so
`libra plan`, `libra simulate`, the run's planner and the simulate flow all take files). Three forms:
- a model's Hugging Face `config.json` (dense or mixture-of-experts decoder: Llama, Qwen2/3,
  Mistral, Mixtral, Qwen3-MoE): the architecture fields are read, parameters are derived as for the
  built-in models;
- a model spec YAML file with the fields of `ModelSpec` (models.yaml's entries);
- a hardware spec YAML file with the fields of `HardwareSpec` (hardware.yaml's entries).
A YAML file may start from a built-in entry with `base: NAME` and change only some fields, e.g. a
newer GPU with its datasheet figures and the efficiency fits of the one it succeeds. A file that is
missing, unreadable or does not describe a valid spec raises a ValueError naming the file and the
field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from libra_core.config.yaml_io import strict_yaml_load, yaml_error_line

if TYPE_CHECKING:
    from libra_core.planner.specs import HardwareSpec, ModelSpec

SPEC_SUFFIXES = (".json", ".yaml", ".yml")


def looks_like_file(name: str) -> bool:
    """True when `name` is meant as a file: a spec suffix, a path separator, or an existing file."""
    return name.lower().endswith(SPEC_SUFFIXES) or "/" in name or Path(name).is_file()


def load_model_file(path_text: str) -> ModelSpec:
    from libra_core.planner.specs import ModelSpec

    path = _existing(path_text, "model")
    if path.suffix.lower() == ".json":
        fields = _from_hf_config(path, _read(path, "model", json.loads))
    else:
        fields = _with_base(path, _read(path, "model", strict_yaml_load), "model")
        fields.setdefault("hf_id", f"file:{path}")
    fields.setdefault("source", str(path))
    return _build(ModelSpec, fields, path, "model")


def load_hardware_file(path_text: str) -> HardwareSpec:
    from libra_core.planner.specs import HardwareSpec

    path = _existing(path_text, "hardware")
    if path.suffix.lower() == ".json":
        raise ValueError(f"hardware file {path}: write a hardware spec as YAML (the fields of hardware.yaml)")
    fields = _with_base(path, _read(path, "hardware", strict_yaml_load), "hardware")
    fields.setdefault("source", str(path))
    return _build(HardwareSpec, fields, path, "hardware")


def _existing(path_text: str, kind: str) -> Path:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ValueError(
            f"{kind} {path_text!r} is neither a built-in {kind} name nor an existing file "
            f"(a spec YAML file{' or a Hugging Face config.json' if kind == 'model' else ''})"
        )
    return path


def _read(path: Path, kind: str, parse: Any) -> dict[str, Any]:
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{kind} file {path}: {yaml_error_line(e)}") from e
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{kind} file {path}: cannot read it: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{kind} file {path}: expected a mapping of fields, got {type(data).__name__}")
    return data


def _with_base(path: Path, data: dict[str, Any], kind: str) -> dict[str, Any]:
    """The file's fields over its `base:` built-in entry's (name and aliases not inherited)."""
    fields = dict(data)
    base_name = fields.pop("base", None)
    if base_name is not None:
        base = _builtin(str(base_name), kind, path)
        inherited = base.model_dump(exclude={"name", "aliases", "source", "hf_id"})
        fields = {**inherited, **fields}
        fields.setdefault("source", f"{path} (base {base.name})")
    fields.setdefault("name", path.stem)
    return fields


def _builtin(name: str, kind: str, path: Path) -> ModelSpec | HardwareSpec:
    """A built-in entry by name (or a GPU's alias), never a file: a base cannot chain files."""
    from libra_core.planner.specs import get_hardware, get_model, hardware_specs, model_specs

    if not looks_like_file(name):
        try:
            return get_model(name) if kind == "model" else get_hardware(name)
        except ValueError:
            pass
    valid = sorted(model_specs() if kind == "model" else hardware_specs())
    raise ValueError(f"{kind} file {path}: base {name!r} is not a built-in {kind}; valid: {valid}")


def _build(cls: Any, fields: dict[str, Any], path: Path, kind: str) -> Any:
    try:
        return cls(**fields)
    except ValidationError as e:
        where = [".".join(map(str, err["loc"])) or "spec" for err in e.errors()]
        problems = "; ".join(f"{w}: {err['msg']}" for w, err in zip(where, e.errors(), strict=True))
        raise ValueError(f"{kind} file {path}: {problems}") from e


# config.json keys of the mixture-of-experts fields, by model family.
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _from_hf_config(path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec fields from a Hugging Face config.json (dense or MoE decoder-only transformer).

    Values are read as config.json types them (an integer count, a boolean, a dtype name); a value
    of another type is an error naming the key, never reinterpreted (`"false"` is not False)."""

    def fail(msg: str) -> ValueError:
        return ValueError(f"model file {path}: {msg}")

    def count(key: str, default: int | None = None) -> int:
        # null is how transformers writes "unset": a key with a default takes it (Llama, Mistral
        # and Qwen2 configs read num_key_value_heads null as num_attention_heads), one without says
        # null, not missing (it used to say "has no 'num_key_value_heads'" for a key that was there)
        value = cfg.get(key)
        if value is None:
            value = default
        if value is None:
            if key in cfg:
                raise fail(f"config.json sets {key!r} to null; it needs a whole number")
            raise fail(f"config.json has no {key!r} (a decoder-only LM?)")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 1 << 31:
            raise fail(f"{key} must be a whole number from 1 to 2^31-1, got {value!r}")
        return value

    if cfg.get("kv_lora_rank"):
        raise fail(
            "multi-head latent attention (kv_lora_rank) is not modelled; "
            "write a spec YAML (ModelSpec's fields) that approximates it"
        )
    shared = next((k for k in ("shared_expert_intermediate_size", "n_shared_experts") if cfg.get(k)), None)
    if shared is not None:  # Qwen2-MoE, DeepSeek: an always-active MLP beside the routed experts
        raise fail(
            f"shared experts ({shared}) are not modelled: the active parameters would be priced low; "
            "write a spec YAML (ModelSpec's fields) that approximates them"
        )
    if cfg.get("quantization_config"):
        raise fail(
            "quantized weights (quantization_config) are not modelled: the cost model reads and "
            "multiplies 2-byte weights; write a spec YAML for the unquantized model"
        )
    sparse_step = cfg.get("decoder_sparse_step", 1) or 1
    if cfg.get("mlp_only_layers") or sparse_step != 1 or cfg.get("first_k_dense_replace"):
        raise fail(
            "dense layers between mixture-of-experts layers are not modelled "
            "(the cost model takes every layer as MoE); write a spec YAML that approximates it"
        )
    heads = count("num_attention_heads")
    hidden = count("hidden_size")
    tie = cfg.get("tie_word_embeddings", False)  # Llama, Qwen and Mistral configs default to untied
    if not isinstance(tie, bool):
        raise fail(f"tie_word_embeddings must be true or false, got {tie!r}")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if dtype not in ("bfloat16", "float16", "float32"):
        raise fail(f"torch_dtype must be bfloat16, float16 or float32, got {dtype!r}")
    name_or_path = str(cfg.get("_name_or_path") or "")
    name = (name_or_path.rstrip("/").rsplit("/", 1)[-1] or path.parent.name or path.stem).lower()
    expert_key = next((k for k in _EXPERT_KEYS if cfg.get(k)), None)
    fields: dict[str, Any] = {
        "name": name,
        "hf_id": name_or_path or f"file:{path}",
        "num_layers": count("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": count("num_key_value_heads", heads),
        "head_dim": count("head_dim", hidden // heads)
        if cfg.get("head_dim") is not None
        else hidden // heads,
        "intermediate_size": count("intermediate_size"),
        "vocab_size": count("vocab_size"),
        "tie_embeddings": tie,
        # fp16 weights cost what bf16 ones do (2 bytes, the same tensor-core peak on these GPUs).
        "dtype": "float32" if dtype == "float32" else "bfloat16",
        "source": f"{path} (Hugging Face config.json)",
    }
    if fields["head_dim"] < 1:
        raise fail(f"hidden_size {hidden} / num_attention_heads {heads} gives no head_dim; set head_dim")
    if expert_key is not None:
        fields["num_experts"] = count(expert_key)
        fields["experts_per_token"] = count("num_experts_per_tok")
        moe_key = (
            "moe_intermediate_size" if cfg.get("moe_intermediate_size") is not None else "intermediate_size"
        )
        fields["moe_intermediate_size"] = count(moe_key)
    return fields
