"""How iterations are pipelined: synchronous, or rollout of the next iteration overlapping the update
of this one (bounded staleness, decoupled PPO, interruptible rollout), plus dynamic sampling.

Versions count optimizer steps: an update of `training.grpo.minibatches` steps advances the policy
by that many versions, so `max_staleness` is in optimizer steps (see docs/architecture.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from libra_core.config.base import Frozen


class DynamicSamplingConfig(Frozen):
    enabled: bool = Field(
        False,
        description="Drop prompt groups whose rewards are all equal (no GRPO signal) before the update, "
        "and over-sample prompts so the kept groups fill the batch.",
    )
    max_oversample: float = Field(
        2.0,
        ge=1.0,
        description="Cap on prompts sampled per wanted prompt (the factor follows the last iteration's "
        "share of groups with signal).",
    )


class PipelineConfig(Frozen):
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: rollout -> reward -> update -> sync each iteration. async: the rollout of "
        "iteration i+1 runs while iteration i updates; the weight sync pauses it and it continues on "
        "the new weights.",
    )
    max_staleness: int = Field(
        4,
        ge=0,
        description="Most optimizer steps between the policy that generated a token and the policy at "
        "the start of the update that trains on it; async needs at least training.grpo.minibatches.",
    )
    stale: Literal["drop", "recompute"] = Field(
        "drop",
        description="Trajectories older than max_staleness: drop them, or recompute their behaviour "
        "log-probs with the current policy (treating them as on-policy).",
    )
    decoupled_ppo: bool = Field(
        True,
        description="Decoupled PPO (AReaL): clip against proximal log-probs recomputed at the start of "
        "the update and weight by proximal/behaviour; false clips against the behaviour log-probs. "
        "Applies in async mode only: in sync mode the proximal policy is the behaviour policy.",
    )
    behavior_weight_cap: float = Field(
        5.0, gt=0, description="Cap on the proximal/behaviour importance weight of a token."
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig,
        description="Drop prompt groups without GRPO signal and over-sample prompts to refill the batch.",
    )
