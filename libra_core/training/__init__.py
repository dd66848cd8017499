"""Training: GRPO advantages, the PPO-clip loss, batching, checkpoints and the one-call update.

The update task calls `run_grpo_update` once per iteration; the other names are its parts, exported
for tests, the SFT warm-up and the simulator. Exports resolve lazily (PEP 562) so that importing this
package, e.g. for `group_advantages` or `UpdateResult`, does not import torch or transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libra_core.training.advantages import group_advantages, mixed_group_share
    from libra_core.training.batch import TrainBatch, build_batch, split_minibatches
    from libra_core.training.checkpoint import (
        load_optimizer_state,
        load_policy,
        save_optimizer_state,
        save_policy_weights,
    )
    from libra_core.training.logprobs import token_logprobs
    from libra_core.training.losses import ppo_clip_loss
    from libra_core.training.update import UpdateResult, run_grpo_update

_EXPORTS = {
    "group_advantages": "advantages",
    "mixed_group_share": "advantages",
    "TrainBatch": "batch",
    "build_batch": "batch",
    "split_minibatches": "batch",
    "load_policy": "checkpoint",
    "save_policy_weights": "checkpoint",
    "load_optimizer_state": "checkpoint",
    "save_optimizer_state": "checkpoint",
    "token_logprobs": "logprobs",
    "ppo_clip_loss": "losses",
    "UpdateResult": "update",
    "run_grpo_update": "update",
}

__all__ = [
    "TrainBatch",
    "UpdateResult",
    "build_batch",
    "group_advantages",
    "load_optimizer_state",
    "load_policy",
    "mixed_group_share",
    "ppo_clip_loss",
    "run_grpo_update",
    "save_optimizer_state",
    "save_policy_weights",
    "split_minibatches",
    "token_logprobs",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
