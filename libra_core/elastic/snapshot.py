"""The join snapshot: what a joining hybrid loads, and how it crosses the side channel in parts.

At a step boundary core rank 0 copies its model parameters, optimizer state and optimizer
hyperparameters (`state_tensors`). The hyperparameters (lr, betas, weight decay, ... of every param
group, which a schedule may have changed since the optimizer was built) travel as the UTF-8 JSON of
`optimizer_hyperparams` in one uint8 tensor, HYPERPARAMS_KEY, as safetensors holds only tensors.
The gateway (libra_core/elastic/gateway.py) encodes that copy once as safetensors bytes and serves it
in parts of at most `part_bytes` each, so a snapshot of any size fits under the frame limit of both
ends (12 bytes per parameter for float32 AdamW: one 1 GiB frame held only ~89M parameters). The
hybrid joins the parts, decodes them, and loads tensors and hyperparameters (`load_state_tensors`;
before 2026-12-06 the hyperparameters were not sent, and a hybrid replayed every update with its own
constructor's lr).

Every published update also carries the hyperparameters the core applied it with, and the hybrid
sets them before replaying it (`apply_hyperparams`), so an lr schedule on the core is followed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from libra_core.training.backends.flat import trainable

if TYPE_CHECKING:
    import torch

Hyperparams = list[dict[str, Any]]  # one dict per optimizer param group, without its "params"
HYPERPARAMS_KEY = "hyper.param_groups"  # uint8 tensor: UTF-8 JSON of `optimizer_hyperparams`


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Model parameters, optimizer state and optimizer hyperparameters as named tensors (the snapshot
    a joining hybrid loads)."""
    import torch

    out = {f"param.{i}": p.detach() for i, p in enumerate(trainable(model))}
    for index, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            out[f"opt.{index}.{name}"] = value if torch.is_tensor(value) else torch.tensor(value)
    raw = json.dumps(optimizer_hyperparams(optimizer), separators=(",", ":")).encode()
    out[HYPERPARAMS_KEY] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return out


def _plain(name: str, value: Any) -> Any:
    """`value` as JSON can carry it (tensors as numbers, tuples as lists)."""
    import torch

    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, tuple | list):
        return [_plain(name, v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"optimizer hyperparameter {name!r} = {value!r} cannot be sent to hybrids (JSON numbers, "
        "strings, booleans and lists only); use an optimizer whose param groups hold plain values"
    )


def optimizer_hyperparams(optimizer: torch.optim.Optimizer) -> Hyperparams:
    """Every param group's hyperparameters (everything but its parameters), as JSON values."""
    return [{k: _plain(k, v) for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def apply_hyperparams(optimizer: torch.optim.Optimizer, groups: Hyperparams) -> None:
    """Set the hyperparameters of `optimizer`'s param groups to `groups` (from `optimizer_hyperparams`
    of an optimizer built the same way), keeping each value's local type (tuple, tensor)."""
    import torch

    assert len(groups) == len(optimizer.param_groups), (
        f"the snapshot has {len(groups)} optimizer param groups, this optimizer "
        f"{len(optimizer.param_groups)}: build the hybrid's optimizer as the core's"
    )
    for group, values in zip(optimizer.param_groups, groups, strict=True):
        for key, value in values.items():
            current = group.get(key)
            if torch.is_tensor(current):
                current.fill_(value)
            elif isinstance(current, tuple):
                group[key] = tuple(value)
            else:
                group[key] = value


def load_state_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]
) -> None:
    """Load a snapshot from `state_tensors` into `model` and `optimizer`, hyperparameters included."""
    import torch

    params = trainable(model)
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(tensors[f"param.{i}"])
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value.clone()
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    if HYPERPARAMS_KEY in tensors:
        apply_hyperparams(optimizer, json.loads(tensors[HYPERPARAMS_KEY].numpy().tobytes()))


@dataclass
class Snapshot:
    """A stored snapshot on core rank 0 (clones, so the core keeps training while it is served)."""

    step: int  # the first step the snapshot's weights are used for (taken after update step-1)
    version: int
    tensors: dict[str, torch.Tensor]  # from `state_tensors`
    encoded: bytes | None = None  # safetensors bytes, made on first request (off the core's path)

    def encode(self) -> bytes:
        """The snapshot's bytes; encoded once, on a gateway handler thread (two may race: same bytes)."""
        if self.encoded is None:
            from libra_core.elastic.wire import tensors_to_bytes

            self.encoded = tensors_to_bytes(self.tensors)
        return self.encoded


def part_count(total_bytes: int, part_bytes: int) -> int:
    """Parts of at most `part_bytes` that hold `total_bytes` (at least one, possibly empty)."""
    assert part_bytes > 0, "a snapshot part must hold at least one byte"
    return max(1, -(-total_bytes // part_bytes))
