"""Load and save the policy weights and AdamW state that the update stage carries between iterations.

The policy folder is a Hugging Face model folder that vLLM serves and reloads after each update, so
weights are written back in place under HF's key names, atomically: a hidden temp file in the same
folder, then `os.replace`, so a reader sees either the old file or the new one, never half of one.
The optimizer state lives in a separate state folder (it is the trainer's, not the server's).
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from libra_core.data.atomic import atomic_path
from libra_core.model.policy import WEIGHTS_FILE, refuse_sharded_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"


def load_policy(policy_dir: Path, device: torch.device | str) -> PreTrainedModel:
    """Load the HF causal LM in `policy_dir` as float32 master weights on `device`, in eval mode.

    Eval mode because the importance ratio compares against log-probs the engine computed without
    dropout; gradients still flow.
    """
    from transformers import AutoModelForCausalLM  # heavy import, only when a model is actually loaded

    if not (Path(policy_dir) / "config.json").is_file():
        # transformers would read the path as a hub repo id ("Repo id must be in the form ...")
        raise FileNotFoundError(
            f"policy folder {policy_dir} holds no config.json (deleted or moved?); resume the run "
            "from a checkpoint, or start it again"
        )
    refuse_sharded_checkpoint(Path(policy_dir), str(policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32)
    # Through nn.Module.to: transformers' wrapped `to` confuses type checkers about its arguments.
    torch.nn.Module.to(model, device)
    model.eval()
    return model


def _state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors; tensors sharing storage (tied weights) are cloned, as safetensors requires."""
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        state[name] = t
    return state


def save_policy_weights(model: torch.nn.Module, policy_dir: Path) -> Path:
    """Atomically replace `policy_dir/model.safetensors` with the model's weights; return its path.

    The weights are written as they are (float32 master weights): the next update loads them from
    this file, so casting to the serving dtype would round away every step smaller than its
    precision. config.json keeps the serving dtype, in which vLLM (`--dtype`) loads and reloads them.
    """
    from safetensors.torch import save_file

    policy_dir = Path(policy_dir)
    state = _state_for_saving(model)
    assert "lm_head.weight" in state, (
        "lm_head.weight missing from the state dict; the policy must have an (untied) output head that "
        "vLLM can reload"
    )
    target = policy_dir / WEIGHTS_FILE
    # The temp name (`.model.safetensors.tmp-PID-HEX`) does not end in .safetensors, so a loader
    # globbing *.safetensors never sees it, and a resume deletes one a killed update left.
    with atomic_path(target) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    return target


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, state_dir: Path, device: torch.device | str
) -> bool:
    """Load `state_dir/optimizer.pt` into `optimizer` if it exists; return whether it did.

    Moment tensors must match the parameters' shapes (a different model would otherwise load
    silently). Hyperparameters (lr, betas, weight decay) stay as the optimizer was constructed, so a
    changed config wins over the saved one.
    """
    path = Path(state_dir) / OPTIMIZER_FILE
    if not path.exists():
        return False
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:
        # torch.load fails on damaged bytes with a dozen exception types (RuntimeError, EOFError,
        # UnpicklingError, KeyError, ...), none naming the file. Only a file the archive check
        # finds damaged is reported as such; any other failure is re-raised as it came.
        problem = optimizer_file_problem(path)
        if problem is None:
            raise
        raise ValueError(
            f"{path} is damaged ({problem}); resume the run from a checkpoint (libra run --resume "
            "RUN_DIR restores its optimizer state), or delete the file to restart the optimizer"
        ) from err
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, param in enumerate(params):
        exp_avg = saved.get("state", {}).get(index, {}).get("exp_avg")
        if exp_avg is not None and tuple(exp_avg.shape) != tuple(param.shape):
            raise ValueError(
                f"{path} does not match the policy (parameter {index}: saved {tuple(exp_avg.shape)}, "
                f"model {tuple(param.shape)}); delete it to restart the optimizer"
            )
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, keep in zip(optimizer.param_groups, hyper, strict=True):
        group.update(keep)
    return True


def optimizer_file_problem(path: Path) -> str | None:
    """Why `path` is not a whole `torch.save` archive (None: it is). torch.save writes a zip
    archive, so zipfile checks it without torch: the central directory (a truncated copy has none),
    a `data.pkl` member, and every member's CRC-32, which torch.load does not check (a flipped byte
    in a tensor loads silently). Reads the whole file: `plan_resume` calls it on a checkpoint's
    copy, `load_optimizer_state` only once a load has failed."""
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.rsplit("/", 1)[-1] == "data.pkl" for name in archive.namelist()):
                return "a zip archive without data.pkl, not a torch.save file"
            bad = archive.testzip()
    # What zipfile raises on damaged bytes (fuzzed): BadZipFile, EOFError, NotImplementedError (a
    # flipped flag or version), ValueError (a negative seek, an undecodable name), OverflowError,
    # RuntimeError ("encrypted"); OSError: the file cannot be read at all.
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        NotImplementedError,
        ValueError,
        OverflowError,
        RuntimeError,
    ) as err:
        return f"not a readable torch.save archive: {type(err).__name__}: {err}"
    if bad is not None:
        return f"its member {bad} fails its CRC-32 check"
    return None


def save_optimizer_state(optimizer: torch.optim.Optimizer, state_dir: Path) -> Path:
    """Atomically write the optimizer state to `state_dir/optimizer.pt` (creating the folder); return it."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    target = state_dir / OPTIMIZER_FILE
    with atomic_path(target) as tmp:  # a resume deletes the temp file of a killed update
        torch.save(optimizer.state_dict(), tmp)
    return target
