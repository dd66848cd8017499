"""Initial policy of a run: the HF folder that the first rollout serves and the first update loads.

Called once per run, before iteration 0, by the prepare task. For `tiny_qwen2` it trains the
tokenizer on the environment's corpus, builds the model, runs the SFT warm-up, measures greedy
accuracy on the held-out problems (`envs/splits.py`) and saves the folder. Warm-ups are cached under
`cache_root/<key>/`, keyed by everything that determines the weights (config, data files and the
source of the code that builds and scores them), so reruns and tests skip minutes of SFT. For
`hf_local` the given folder is copied as is (no SFT).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import logging
import re
import shutil
import struct
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from libra_core.config.models import (
    ArithmeticEnvConfig,
    HFLocalModelConfig,
    LibraConfig,
    TinyModelConfig,
)
from libra_core.config.pretrained import SmolLM2ModelConfig
from libra_core.envs.registry import build_environment, environment_factory
from libra_core.envs.splits import eval_problems
from libra_core.model.policy import (
    build_tiny_policy,
    check_servable_head_dim,
    count_parameters,
    hf_folder_problem,
    refuse_sharded_checkpoint,
    replace_dir,
    resolve_training_device,
    save_policy,
)
from libra_core.model.sft import ProgressFn, greedy_accuracy, sft_warmup
from libra_core.model.tokenizer import train_tokenizer

logger = logging.getLogger(__name__)

RECIPE_VERSION = 4  # 4: the folder stores float32 weights under a bfloat16 serving dtype
"""Bump when what a given config produces changes outside the hashed sources (`warmup_sources`):
a library upgrade, or code elsewhere that the warm-up or its accuracy depends on."""
WARMUP_MODULES = (
    "libra_core.model.tokenizer",
    "libra_core.model.policy",
    "libra_core.model.sft",
    "libra_core.model.prepare",
    "libra_core.envs.splits",
    "libra_core.envs.protocol",
)
"""Modules whose source is part of every warm-up's cache key; `warmup_sources` adds the
environment's module and the libra_core.envs modules they import (tools, reward checks)."""
CORPUS_SIZE = 2000  # demonstrations the tokenizer is trained on
LOSS_TAIL = 50  # how many of the last SFT losses PreparedPolicy carries
META_FILE = "libra_warmup.json"  # written next to the HF files; HF and vLLM ignore it


@dataclass(frozen=True)
class PreparedPolicy:
    """Where the initial policy lives and how good it is.

    `sft_losses_tail`: the last (up to 50) SFT losses, empty when there was no warm-up.
    `greedy_accuracy`: share of held-out problems solved greedily, None when not measured.
    """

    path: Path
    num_params: int
    sft_losses_tail: tuple[float, ...]
    from_cache: bool
    greedy_accuracy: float | None


def prepare_initial_policy(
    cfg: LibraConfig,
    out_dir: Path,
    cache_root: Path | None,
    progress: ProgressFn | None = None,
    *,
    num_eval_problems: int | None = None,
) -> PreparedPolicy:
    """Create the initial policy folder at `out_dir` (replacing it) and describe it.

    `num_eval_problems` held-out problems are solved greedily after the warm-up (default
    `cfg.eval.num_prompts`; 0 skips the measurement). Torch's thread count is the caller's choice.
    """
    out_dir = Path(out_dir)
    if isinstance(cfg.model, HFLocalModelConfig):
        return _copy_local(cfg.model, out_dir)
    if isinstance(cfg.model, SmolLM2ModelConfig):  # pretrained: converted and copied, no SFT
        from libra_core.model.smollm2 import prepare_smollm2

        path, from_cache = prepare_smollm2(cfg.model, out_dir, cache_root)
        return PreparedPolicy(path, _safetensors_num_params(path), (), from_cache, None)
    assert isinstance(cfg.model, TinyModelConfig), f"unexpected model type {cfg.model.type!r}"
    check_servable_head_dim(cfg.model)
    n_eval = cfg.eval.num_prompts if num_eval_problems is None else num_eval_problems
    use_cache = cfg.training.warmup.cache and cache_root is not None
    cache_dir = Path(cache_root) / cache_key(cfg, n_eval) if use_cache and cache_root is not None else None
    if cache_dir is not None and (cache_dir / META_FILE).is_file():
        _copy_dir(cache_dir, out_dir)
        meta = json.loads((out_dir / META_FILE).read_text())
        logger.info("initial policy from warm-up cache %s", cache_dir)
        return _prepared(out_dir, meta, from_cache=True)

    meta = _build_tiny(cfg, out_dir, n_eval, progress)
    if cache_dir is not None:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        _copy_dir(out_dir, cache_dir)
    return _prepared(out_dir, meta, from_cache=False)


def cache_key(cfg: LibraConfig, num_eval_problems: int) -> str:
    """sha256 over everything that determines the warmed-up weights and their reported accuracy."""
    payload = {
        "recipe": RECIPE_VERSION,
        "model": cfg.model.model_dump(mode="json"),
        "tokenizer": cfg.tokenizer.model_dump(mode="json"),
        "environment": cfg.environment.model_dump(mode="json"),
        "warmup": cfg.training.warmup.model_dump(mode="json", exclude={"cache"}),
        "data": _data_fingerprint(cfg),
        # The reported accuracy runs the agent loop under the rollout's limits.
        "limits": [cfg.rollout.max_tokens_per_turn, cfg.rollout.max_total_tokens],
        "seed": cfg.experiment.seed,
        "num_eval_problems": num_eval_problems,
        # A code change (the demonstrations, the eval split, a reward) must not bring back a warm-up
        # built or scored by the old code; RECIPE_VERSION bumps were forgotten.
        "sources": {name: _source_digest(name) for name in warmup_sources(cfg)},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def warmup_sources(cfg: LibraConfig) -> list[str]:
    """The modules whose source decides `cfg`'s warm-up and its reported accuracy, sorted:
    `WARMUP_MODULES`, the environment's module (from the environment registry) and, transitively,
    every libra_core.envs module that an environment module among them imports, at the top or
    inside a function (so tools, reward checks and their worker processes are included), or runs
    as a script by its file name (the sandbox's launcher, `sandbox_launcher.py`: a path, not an
    import, so until 2026-12-07 a change to it kept the accuracy the old sandbox scored)."""
    factory = environment_factory(cfg.environment.type)
    if inspect.isclass(factory):
        roots = [*WARMUP_MODULES, factory.__module__]
    else:  # a factory function that imports the environment lazily: its imports name the module
        roots = [*WARMUP_MODULES, *_imported_modules(textwrap.dedent(inspect.getsource(factory)))]
    seen: set[str] = set()
    todo = [m for m in roots if m.startswith("libra_core.")]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.startswith("libra_core.envs."):  # the model modules' env imports are roots already
            source = _read_source(name)
            todo += [m for m in _imported_modules(source) if m.startswith("libra_core.envs.")]
            todo += _sibling_scripts(name, source)
    return sorted(seen)


def _sibling_scripts(name: str, source: str) -> list[str]:
    """Modules of `name`'s package that `source` names by file (a string constant `x.py` that is
    a file beside it), i.e. runs as a script rather than imports."""
    package = name.rpartition(".")[0]
    names = {
        node.value.removesuffix(".py")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"\w+\.py", node.value)
    }
    return sorted(f"{package}.{n}" for n in names if _module_path(f"{package}.{n}"))


def _imported_modules(source: str) -> list[str]:
    """Modules named by the import statements anywhere in `source` (`from pkg import mod` names
    `pkg.mod` when that is a module)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            if _is_libra_package(node.module):
                names += [
                    f"{node.module}.{a.name}" for a in node.names if _module_path(f"{node.module}.{a.name}")
                ]
    return names


def _is_libra_package(name: str) -> bool:
    if not name.startswith("libra_core"):
        return False
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


def _module_path(name: str) -> Path | None:
    """The source file of module `name`, found without importing it (only its parent packages are
    imported); None when it is not a module with a source file."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _read_source(name: str) -> str:
    path = _module_path(name)
    assert path is not None, f"{name} is not a Python module with a source file"
    return path.read_text(encoding="utf-8")


def _source_digest(name: str) -> str:
    return hashlib.sha256(_read_source(name).encode()).hexdigest()


def _data_fingerprint(cfg: LibraConfig) -> list[str]:
    """sha256 of each data file the environment reads, in config order.

    The config names files by path only: an edited or replaced file, or a relative path that now
    resolves elsewhere, must not bring back a warm-up trained on other data.
    """
    env_cfg = cfg.environment
    if isinstance(env_cfg, ArithmeticEnvConfig):  # generated problems, no files
        return []
    from libra_core.envs.datasets import resolve_data_path

    digests = []
    for file in env_cfg.data_files():
        digest = hashlib.sha256()
        with resolve_data_path(env_cfg.data_dir, file).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digests.append(digest.hexdigest())
    return digests


def _build_tiny(cfg: LibraConfig, out_dir: Path, n_eval: int, progress: ProgressFn | None) -> dict:
    assert isinstance(cfg.model, TinyModelConfig), f"unexpected model type {cfg.model.type!r}"
    seed = cfg.experiment.seed
    device = resolve_training_device(cfg.training.device)  # before any work: `cuda` without one
    env = build_environment(cfg.environment)
    tokenizer = train_tokenizer(env.corpus(CORPUS_SIZE, seed), env.special_tokens, cfg.tokenizer.vocab_size)
    model = build_tiny_policy(
        cfg.model,
        len(tokenizer),
        seed,
        pad_token_id=tokenizer.pad_token_id,  # whatever order the environment lists its specials in
        eos_token_id=tokenizer.eos_token_id,
    )
    model.to(device)  # type: ignore[arg-type]
    start = time.perf_counter()
    losses = sft_warmup(model, tokenizer, env, cfg.training.warmup, seed=seed, progress=progress)
    sft_s = time.perf_counter() - start
    accuracy = None
    if n_eval > 0:
        problems = eval_problems(env, seed, n_eval)  # the set every later evaluation uses
        accuracy = greedy_accuracy(  # under the rollout's limits, as the iterations' evaluations run
            model,
            tokenizer,
            env,
            problems,
            correct_reward=cfg.environment.reward.correct,
            max_new_tokens=cfg.rollout.max_tokens_per_turn,
            max_turns=env.max_turns,
            max_total_tokens=cfg.rollout.max_total_tokens,
        )
    model.to("cpu")  # type: ignore[arg-type]
    # float32 whatever the serving dtype: the first update loads these weights from the folder, and
    # a bfloat16 copy would start GRPO from a rounded warm-up (vLLM casts them to `--dtype`).
    save_policy(model, tokenizer, out_dir, dtype="float32", serving_dtype=cfg.model.dtype)
    meta = {
        "num_params": count_parameters(model),
        "sft_losses_tail": losses[-LOSS_TAIL:],
        "greedy_accuracy": accuracy,
        "num_eval_problems": n_eval,
        "sft_steps": len(losses),
        "sft_s": round(sft_s, 3),
        "device": str(device),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    logger.info(
        "initial policy: %d params, SFT %d steps in %.1f s, greedy accuracy %s",
        meta["num_params"],
        len(losses),
        sft_s,
        accuracy,
    )
    return meta


def _prepared(path: Path, meta: dict, *, from_cache: bool) -> PreparedPolicy:
    return PreparedPolicy(
        path=path,
        num_params=int(meta["num_params"]),
        sft_losses_tail=tuple(float(x) for x in meta["sft_losses_tail"]),
        from_cache=from_cache,
        greedy_accuracy=meta["greedy_accuracy"],
    )


def _copy_dir(src: Path, dst: Path) -> None:
    """Copy folder `src` to `dst` atomically (sibling temp copy, then swap)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(src, tmp, symlinks=False)  # links are followed: the copy stands alone
        replace_dir(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _copy_local(model_cfg: HFLocalModelConfig, out_dir: Path) -> PreparedPolicy:
    src = Path(model_cfg.path).expanduser().resolve()
    problem = hf_folder_problem(model_cfg.path)
    if problem:
        raise ValueError(problem)
    # Refused before the copy: load_policy would refuse it only at the first update, after the
    # engines started and a rollout ran.
    refuse_sharded_checkpoint(src, f"model.path {model_cfg.path!r}")
    # A copy, not a link: the update stage rewrites the run's policy folder, and must never write
    # into the user's source model.
    try:
        _copy_dir(src, out_dir)
    except shutil.Error as exc:  # one entry per file that could not be copied
        src_file, _, why = exc.args[0][0]
        raise ValueError(
            f"model.path {model_cfg.path!r}: cannot copy {src_file} ({why}); "
            f"{len(exc.args[0])} file(s) failed. Is a link in the model folder dangling?"
        ) from exc
    return PreparedPolicy(
        path=out_dir,
        num_params=_safetensors_num_params(src),
        sft_losses_tail=(),
        from_cache=False,
        greedy_accuracy=None,
    )


def _safetensors_num_params(folder: Path) -> int:
    # Read only the JSON headers: counting must not load (possibly many GB of) weights.
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for name, info in header.items():
            if name != "__metadata__":
                count = 1
                for dim in info["shape"]:
                    count *= dim
                total += count
    return total
