"""The `scheduler:` section of stages.yaml: how the rollout stage routes trajectories across
instance buckets (libra_core/scheduling; metrics and formulas in docs/scheduling.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from libra_core.config.base import Frozen

SchedulerType = Literal["static", "round_robin", "least_load", "mlfq", "input_length", "oracle", "cmlfq"]


def _check_ascending(name: str, values: tuple[int, ...]) -> None:
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must be strictly ascending, got {list(values)}")


class SchedulerConfig(Frozen):
    """Rollout routing across buckets (libra_core/scheduling; metrics and formulas in docs/scheduling.md).

    `buckets` lists N upper bounds in tokens and defines N + 1 buckets: bucket i holds trajectories of
    at most `buckets[i]` tokens (prompt + generated + tool payload) and the last bucket is open.
    """

    type: SchedulerType = Field(
        "static",
        description="Routing policy: static | round_robin | least_load | mlfq | input_length | cmlfq "
        "(oracle reads realised lengths and is for trace evaluation only).",
    )
    buckets: tuple[int, ...] = Field(
        (48, 64),
        min_length=1,
        description="Ascending upper bounds in tokens; N bounds give N + 1 buckets (the last is open). "
        "The default splits the arithmetic task near its median and 90th-percentile sizes.",
    )
    min_support: float = Field(
        4.0,
        ge=0,
        description="C-MLFQ: aged samples that saw the request's depth and last tool return (the "
        "most of its prompt's node, the global node at its exact path, and the Markov node of its "
        "depth and last return) before the estimate may place or move a request.",
    )
    backoff_pseudocount: float = Field(
        8.0,
        gt=0,
        description="C-MLFQ: a node with n aged samples gets weight n / (n + this) against its back-off "
        "(prompt node -> size-class node -> global node -> Markov node -> ancestors).",
    )
    max_samples_per_node: int = Field(
        64,
        ge=1,
        le=4096,
        description="C-MLFQ: bounded sample of remaining tokens per tree node (oldest evicted).",
    )
    aging_half_life_versions: float = Field(
        4.0,
        gt=0,
        description="C-MLFQ: a sample's weight halves every this many policy versions.",
    )
    prune_below_support: float = Field(
        0.05,
        ge=0,
        description="C-MLFQ: tree subtrees whose aged support falls below this are dropped by the "
        "incremental pruning pass (0: never prune).",
    )
    prune_nodes_per_insert: int = Field(
        64,
        ge=0,
        description="C-MLFQ: node checks of the incremental pruning pass done per finished trajectory "
        "(bounds the time an insert holds the tree lock; 0: never prune).",
    )
    prompt_size_bins_per_octave: float = Field(
        4.0,
        ge=0,
        description="C-MLFQ: resolution of the prompt-size back-off level between a prompt's own tree "
        "and the global one (log-scale bins, as input_length's; 0: no such level).",
    )
    tail_quantile: float = Field(
        0.9,
        gt=0.5,
        lt=1,
        description="C-MLFQ: the tail quantile that must agree with the mean on a bucket (P90 in the paper).",
    )
    payload_class_edges: tuple[Annotated[int, Field(ge=0)], ...] = Field(
        (16, 256, 2048),
        description="C-MLFQ: tool payload sizes in tokens separating payload-size classes (ascending).",
    )
    prefill_decode_cost_ratio: float = Field(
        1.0,
        ge=0,
        description="C-MLFQ: cost of re-prefilling one context token, in generated tokens decoded in the "
        "wrong bucket. 1.0 charges them 1:1 like the trace score; lower it to weigh GPU time, where a "
        "prefilled token is far cheaper than a decoded one.",
    )
    misplaced_decode_slowdown: float = Field(
        1.0,
        gt=0,
        description="C-MLFQ: share of a token's decode cost saved by decoding it in its right bucket; a "
        "move needs expected right-bucket generated tokens gained x this > the tokens to re-prefill "
        "(context minus the tool return's payload, which is prefilled wherever it goes) x "
        "prefill_decode_cost_ratio.",
    )

    @model_validator(mode="after")
    def _ascending(self) -> SchedulerConfig:
        _check_ascending("scheduler.buckets", self.buckets)
        _check_ascending("scheduler.payload_class_edges", self.payload_class_edges)
        if self.buckets[0] < 1:
            raise ValueError(f"scheduler.buckets must be positive token counts, got {list(self.buckets)}")
        return self

    @property
    def num_buckets(self) -> int:
        return len(self.buckets) + 1
