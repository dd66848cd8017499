"""What the two GPU timing scripts share (`gpu_decode_step.py`, `gpu_train_step.py`): the command
line (measure with `--out` on a CUDA machine, or `--compare` a result here), its checks before any
work, a model's shape from models.yaml, and the timing loop.

Standard library and pyyaml only, as `_args.py`: the device machine runs these scripts with torch
and pyyaml and no libra_core (torch is imported inside the functions that time).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _args.py beside it, for a test too
from _args import output_file_problem, positive_int  # noqa: E402

MODELS_YAML = Path(__file__).resolve().parents[1] / "libra_core" / "planner" / "models.yaml"


def model_shape(name: str) -> dict:
    """The shape fields of `name` in models.yaml (read directly: no libra_core import needed)."""
    import yaml

    spec = yaml.safe_load(MODELS_YAML.read_text())[name]
    return {
        k: spec[k]
        for k in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "tie_embeddings",
        )
    }


def median_ms(fn, reps: int, sync) -> float:
    """Median wall ms of `fn` over `reps` runs (each synchronised), after two warm-ups."""
    for _ in range(2):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t) * 1e3)
    out.sort()
    return out[len(out) // 2]


def device_run(device: str) -> tuple[bool, Callable[[], None], dict]:
    """Whether `device` is a CUDA GPU, how to wait for its work, and a result header naming it."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return cuda, sync, {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}


SMOKE_MODELS = "tiny"  # --smoke without --models: the models.yaml shape a CPU builds in a moment


def gpu_cli(doc: str, models: str, reps: int) -> argparse.ArgumentParser:
    """The options both GPU timing scripts take: measure (`--out`) or compare (`--compare`)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", type=Path, help="measure here (needs a CUDA GPU) and write JSON to this path")
    ap.add_argument(
        "--models",
        default=None,
        help=f"comma-separated models.yaml names (default: {models}; with --smoke: {SMOKE_MODELS})",
    )
    ap.add_argument("--reps", type=positive_int, default=reps, help=f"timings per point (default {reps})")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny shapes and sizes, and the {SMOKE_MODELS} model unless --models names others "
        "(checks the script on a CPU: --smoke --device cpu)",
    )
    ap.add_argument(
        "--compare", type=Path, help="a JSON written by --out: print it next to the planner's price"
    )
    ap.add_argument("--hardware", default="H200", help="the cost model's hardware for --compare")
    ap.set_defaults(default_models=models)
    return ap


def check_cli(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The checks both GPU scripts make before any work (exit 2 naming the problem); returns the
    models to measure: `--models`, else the tiny model under `--smoke`, else the script's default."""
    if a.compare:
        if not a.compare.is_file():
            ap.error(f"--compare {a.compare}: no such file")
        return []
    if not a.out:
        ap.error("give --out PATH (measure) or --compare PATH")
    problem = output_file_problem(a.out)
    if problem:
        ap.error(f"--out {problem}")
    text = a.models if a.models is not None else SMOKE_MODELS if a.smoke else a.default_models
    models = [m.strip() for m in text.split(",")]
    if not all(models):
        ap.error(f"--models {text!r}: expected comma-separated model names")
    import yaml

    known = yaml.safe_load(MODELS_YAML.read_text())
    unknown = [m for m in models if m not in known]
    if unknown:
        ap.error(f"--models: unknown {unknown}; valid: {sorted(known)}")
    problem = _device_problem(a.device)
    if problem:  # was torch's AssertionError or RuntimeError once the script had started
        ap.error(f"--device {a.device}: {problem}")
    return models


def _device_problem(device: str) -> str | None:
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as err:
        return str(err).splitlines()[0]
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU here (this machine or torch build); --smoke --device cpu checks the script"
    if dev.type not in ("cuda", "cpu"):
        return "expected cuda, cuda:N or cpu"
    return None


def run_compare(ap: argparse.ArgumentParser, fn: Callable[[Path, str], None], a: argparse.Namespace) -> None:
    """`fn(--compare, --hardware)`; a file that is not a JSON written by `--out` or an unknown
    hardware name is exit 2 naming it, not a traceback."""
    try:
        fn(a.compare, a.hardware)
    except (ValueError, KeyError, TypeError) as err:
        ap.error(f"--compare {a.compare} --hardware {a.hardware}: {type(err).__name__}: {err}")
