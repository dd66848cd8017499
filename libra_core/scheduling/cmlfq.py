"""C-MLFQ: causality-driven routing of agentic trajectories across heterogeneous rollout buckets.

The tool returns a trajectory has seen (which tool, how large the payload, success/failure/timeout)
are evidence of how much work is left. C-MLFQ keeps, in a prefix tree (prefix_tree.py), the
distribution of remaining tokens after every observed tool-return history, per prompt, per
prompt-size class and pooled over prompts, and routes on it:

- admission: the estimate at the root (the prompt's earlier trajectories, backed off to prompts of
  the same size class, then to the global root) places the request in the bucket of `prompt + mean
  remaining`; with less than `min_support` aged samples it starts in the shortest bucket, as in the
  paper. No agreement test here: admission moves no context, so the point estimate is the best guess.
- tool return: the estimate at the request's exact path gives, for every bucket b, the expected
  generated tokens that would be decoded in their right bucket if the rest ran in b,
  `E[remaining generated x (final size in b)]` (`Estimate.gen_by_bucket`); the target must be a
  bucket that maximises it (any of them on a tie). The request moves only if (1) the estimate's
  support is at least `min_support`: the largest aged support of the prompt's node at the request's
  exact path, the global node there and the Markov node of its depth and last state (past
  MAX_PATH_DEPTH tool returns only the Markov node exists; size-class and ancestor nodes never
  count), (2) the buckets of `context + mean` and `context + P90` of remaining agree with the target (the
  paper's confidence test), and (3) the expected gain pays for the re-prefill:
  `(gen[target] - gen[current]) * misplaced_decode_slowdown > reprefilled * prefill_decode_cost_ratio`,
  where `reprefilled` is the context before the tool payload (`reprefill_tokens`: the payload is
  prefilled wherever the next turn runs, so only the earlier context is extra work).
  Otherwise it stays and keeps its prefix cache.
- finish: the trajectory is inserted into the tree; policy versions age the samples.

Bucket targets are *final sizes* (context + remaining), matching the bucket bounds (upper bounds on
trajectory tokens, see base.py) and classic MLFQ, which also demotes on tokens processed so far.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import (
    BucketTracker,
    FinishedTrajectory,
    Move,
    SchedRequest,
    ToolReturn,
    reprefill_tokens,
)
from libra_core.scheduling.prefix_tree import PrefixTree, StateKey

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Progress:
    codes: list[int] = field(default_factory=list)  # state code of each tool return so far
    consumed: list[int] = field(default_factory=lambda: [0])  # tokens after the prompt, per depth
    unknown: dict[int, StateKey] = field(default_factory=dict)  # index in `codes` -> state, code -1

    def push(self, code: int, key: StateKey) -> None:
        """Add a tool return's state code (-1: a state the tree has not seen yet; kept by its key)."""
        if code < 0:
            self.unknown[len(self.codes)] = key
        self.codes.append(code)

    def resolve(self, tree: PrefixTree) -> None:
        """Look up again the states that were new at their return: trajectories that finished since
        may have taught the tree them. A -1 kept in the path missed every exact-path node for the
        rest of the request (until 2026-12-07), leaving the Markov node and the shallower ancestors."""
        for index, key in list(self.unknown.items()):
            code = tree.code(key)
            if code >= 0:
                self.codes[index] = code
                del self.unknown[index]


@dataclass(slots=True)
class CMLFQCounters:
    """Why requests stayed or moved (for reports; not used for decisions)."""

    admissions_from_tree: int = 0  # admissions placed by the estimate (not defaulted to bucket 0)
    decisions: int = 0  # tool returns seen
    low_support: int = 0  # stayed: exact path below min_support
    disagree: int = 0  # stayed: the mean's bucket is not also the tail quantile's and the best one
    too_costly: int = 0  # stayed: re-prefill cost above the expected saving
    moves: int = 0


def tie_floor(best: float) -> float:
    """The least expected generated tokens a bucket may have and still be a best one, `best` the
    largest: two buckets can expect the same tokens (until 2026-12-07 the first of equal maxima was
    taken, blocking a move to the other), and the slack absorbs the float noise of evaluating each
    bucket separately. Increasing in `best` (the simulator's interval tests rely on it)."""
    return best - 1e-9 * max(1.0, best)


class CMLFQScheduler:
    def __init__(self, cfg: SchedulerConfig, tree: PrefixTree | None = None) -> None:
        self.cfg = cfg
        self.bounds = tuple(cfg.buckets)
        self.tracker = BucketTracker(len(self.bounds) + 1)
        self.tree = tree if tree is not None else PrefixTree.from_config(cfg)
        if tree is not None:
            # A tree loaded from a file follows this run's config (a resume may change it), except
            # for what its states are keyed by: those change what every node means.
            keyed: dict[str, tuple[object, object]] = {
                "payload_class_edges": (list(cfg.payload_class_edges), list(tree.payload_edges)),
            }
            if tree.size_classes:
                bins = (float(cfg.prompt_size_bins_per_octave), tree.size_bins_per_octave)
                keyed["prompt_size_bins_per_octave"] = bins
            else:  # an empty size level takes this run's bins as it fills
                self.tree.size_bins_per_octave = float(cfg.prompt_size_bins_per_octave)
            for name, (want, have) in keyed.items():
                if want != have:
                    # Removing the run's scheduler/cmlfq_tree.json was advised until 2026-12-07:
                    # a resume restores its checkpoint's copy, keyed as before.
                    value = str(have).replace(" ", "")
                    raise ValueError(
                        f"the C-MLFQ tree was built with {name}={have}, the config asks for {want}: "
                        f"its states are keyed by it; resume the run with --set scheduler.{name}={value} "
                        "(a resume restores the tree of the checkpoint it continues from), or start a "
                        "new run"
                    )
            self.tree.half_life = float(cfg.aging_half_life_versions)
            self.tree.backoff = float(cfg.backoff_pseudocount)
            self.tree.set_max_samples(cfg.max_samples_per_node)
        self.tree.prune_below = cfg.prune_below_support
        self.tree.prune_nodes_per_insert = cfg.prune_nodes_per_insert
        self.counters = CMLFQCounters()
        self._progress: dict[str, _Progress] = {}

    @classmethod
    def from_saved(cls, cfg: SchedulerConfig, tree: PrefixTree) -> CMLFQScheduler:
        """The scheduler of a run that loads its tree from a file before each rollout (the live
        pipeline): the tree as the constructor takes it, then one whole pruning pass. The pass's
        place is not saved with the tree, so a loaded tree starts a new pass, which checks the
        newest prompts first: within one iteration's inserts it never reached the oldest, the stale
        ones, and a tree loaded and saved at every rollout kept every prompt it had seen (until
        2026-12-06). The whole pass costs about what the load did."""
        sched = cls(cfg, tree)
        if cfg.prune_nodes_per_insert:
            sched.tree.prune()
        return sched

    def in_flight(self) -> int:
        return self.tracker.in_flight()

    def admit(self, request: SchedRequest) -> int:
        est = self.tree.estimate(request.prompt_id, (), (0,), prompt_tokens=request.prompt_tokens)
        bucket = 0
        if est is not None and est.support >= self.cfg.min_support:
            bucket = est.mean_bucket(self.bounds, request.prompt_tokens)
            self.counters.admissions_from_tree += 1
        with self.tracker.lock:
            self._progress[request.request_id] = _Progress()
            return self.tracker.place(request.request_id, bucket)

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        current = self.tracker.current(request.request_id)
        counters = self.counters
        counters.decisions += 1
        tree = self.tree
        with self.tracker.lock:
            progress = self._progress[request.request_id]
            key = tree.state_key(ret.tool, ret.payload_tokens, ret.status)
            progress.push(tree.code(key), key)
            if progress.unknown:
                progress.resolve(tree)
            progress.consumed.append(ret.context_tokens - request.prompt_tokens)
            codes, consumed = tuple(progress.codes), tuple(progress.consumed)
        est = tree.estimate(request.prompt_id, codes, consumed, prompt_tokens=request.prompt_tokens)
        if est is None or est.support < self.cfg.min_support:
            counters.low_support += 1
            return None
        # A move needs the mean bucket, the tail bucket and the best bucket to agree, so the cheap
        # mean test goes first: most decisions end there without evaluating the mixture.
        target = est.mean_bucket(self.bounds, ret.context_tokens)
        if target == current:
            return None
        values = est.gen_by_bucket(self.bounds, ret.context_tokens)
        tail = est.tail_bucket(self.bounds, ret.context_tokens, self.cfg.tail_quantile)
        if tail != target or values[target] < tie_floor(max(values)):
            counters.disagree += 1
            return None
        saving = (values[target] - values[current]) * self.cfg.misplaced_decode_slowdown
        if saving <= reprefill_tokens(ret) * self.cfg.prefill_decode_cost_ratio:
            counters.too_costly += 1
            return None
        counters.moves += 1
        self.tracker.place(request.request_id, target)
        return Move(target)

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        try:
            self.tree.insert(
                trajectory.prompt_id,
                trajectory.turns,
                trajectory.policy_version,
                prompt_tokens=trajectory.prompt_tokens,
            )
        finally:  # a trajectory the tree refuses has still left its instance
            with self.tracker.lock:
                self._progress.pop(trajectory.request_id, None)
            self.tracker.release(trajectory.request_id)

    def on_policy_version(self, version: int) -> None:
        self.tree.set_version(version)
