"""The compared policies, each a configuration of the same simulator, and how each builds its layout.

A `Deployment` is what a policy runs: the training GPUs and layout, the rollout instances (TP degree
and bucket each) and the bucket bounds the router's scheduler uses. Every planner-driven policy calls
the real planner (`search_plans`, `best_train`, `segment_table`); nothing here re-derives a cost.

| policy | split | rollout instances | routing (libra_core/scheduling) | replan | elastic |
|---|---|---|---|---|---|
| colocated | all GPUs time-shared | homogeneous TP | least-load, 1 bucket | no | no |
| static-uniform | half / half | homogeneous TP | round-robin pinned to an instance | no | no |
| greedy | half / half, then measured (*) | homogeneous TP | least-load (queue-driven), 1 bucket | once | no |
| static-optimal | planner, iteration 0 | planner's homogeneous TP | least-load, 1 bucket | no | no |
| +planning | planner | planner's homogeneous TP | least-load, 1 bucket | yes | no |
| +hetero-tp | planner | planner's TP multiset + length ranges | mlfq | yes | no |
| +cmlfq | planner | planner's TP multiset + length ranges | cmlfq | yes | no |
| +elastic (Libra) | planner | planner's TP multiset + length ranges | cmlfq | yes | yes |

(*) greedy starts on the half split and, at rollout `GREEDY_RESPLIT_AT`, re-splits once in proportion
to each stage's measured GPU-seconds (`measured_split`), then keeps that split.

Homogeneous TP is the degree the planner's segment table prices best for one group serving every
length on the rollout GPUs (`max(critical path, work / instances)`, `assignment.homogeneous`). The
policies without heterogeneous instances plan with `SearchSettings.homogeneous`: the planner
chooses the split and the one TP degree together (before 2026-12-02 it chose a heterogeneous plan
and the policy then swapped in one degree, leaving the GPUs that did not divide by it idle and
pricing its replans on a layout it did not run). static-optimal is AReaL-Static-Optimal: the best
static split for the first iteration's workload, on the homogeneous instances AReaL deploys
(before 2026-12-02 it ran the planner's heterogeneous plan under mlfq, which AReaL cannot).
The heterogeneous policies whose scheduler admits to the shortest bucket and promotes (`PROMOTING`)
plan with `SearchSettings.promote`, and every planner-driven policy plans for the expected
iteration (`SimSettings.plan_for_spread`), so the heterogeneous ones may choose one degree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from libra_core.planner.assignment import homogeneous
from libra_core.planner.rollout_cost import RolloutCostModel, instance_tp_degrees
from libra_core.planner.search import Plan, SearchSettings, best_train, mixed_gap, search_plans, segment_table
from libra_core.planner.specs import HardwareSpec, ModelSpec
from libra_core.planner.train_cost import TrainLayout, TrainShape
from libra_core.planner.workload import Workload

OPEN_BOUND = 10**9  # one open bucket: every size is <= this


@dataclass(frozen=True)
class PolicySpec:
    name: str
    colocated: bool = False
    # "measured": the half split, then once (at GREEDY_RESPLIT_AT) GPUs in proportion to each stage's
    # measured GPU-seconds (`measured_split`), the rule of thumb of a greedy operator.
    split: Literal["all", "half", "measured", "planner"] = "planner"
    hetero: bool = False
    scheduler: str = "static"  # libra_core.scheduling registry name
    placement: Literal["least_load", "round_robin"] = "least_load"
    replan: bool = False
    elastic: bool = False


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("colocated", colocated=True, split="all"),
        PolicySpec("static-uniform", split="half", placement="round_robin"),
        PolicySpec("greedy", split="measured"),
        PolicySpec("static-optimal"),
        PolicySpec("+planning", replan=True),
        PolicySpec("+hetero-tp", hetero=True, scheduler="mlfq", replan=True),
        PolicySpec("+cmlfq", hetero=True, scheduler="cmlfq", replan=True),
        PolicySpec("+elastic", hetero=True, scheduler="cmlfq", replan=True, elastic=True),
        # Calibration only (not in `all`): the planner's iteration-0 heterogeneous layout with
        # perfect admission, and +hetero-tp's (replanned) with perfect admission.
        PolicySpec("oracle-routing", hetero=True, scheduler="oracle"),
        PolicySpec("oracle-replan", hetero=True, scheduler="oracle", replan=True),
    )
}
CALIBRATION = ("oracle-routing", "oracle-replan")
# Schedulers that admit to the shortest bucket and move a request up as it grows: their planner
# prices that routing (`SearchSettings.promote`), the oracle's prices admission by final length.
PROMOTING = ("mlfq", "cmlfq")
ABLATION = ("greedy", "+planning", "+hetero-tp", "+cmlfq", "+elastic")
ALIASES = {"libra": "+elastic"}
# greedy re-splits at this rollout start: rollouts 0 and 1 and update 0 have been measured by then
# (rollout j needs update j - 2 with staleness 1).
GREEDY_RESPLIT_AT = 2


def resolve_policies(names: list[str] | tuple[str, ...]) -> list[PolicySpec]:
    """The policies `names` give, in order, each once: `all` (alone or among other names) stands for
    every policy but the calibration ones, `libra` for `+elastic`, and a policy named again (also
    through `all` or an alias) keeps its first place. Unknown names raise a ValueError.

    Before 2026-12-06 a repeated name ran twice (two identical rows, a repeated CSV column) and
    `all` was refused beside other names."""
    out: dict[str, PolicySpec] = {}
    for n in names:
        keys = [k for k in POLICIES if k not in CALIBRATION] if n == "all" else [ALIASES.get(n, n)]
        for key in keys:
            if key not in POLICIES:
                raise ValueError(f"unknown policy {n!r}; valid: {[*POLICIES, *ALIASES, 'all']}")
            out.setdefault(key, POLICIES[key])
    return list(out.values())


def check_cluster_size(specs: list[PolicySpec], num_gpus: int) -> None:
    """Every policy but colocated gives training and rollout GPUs of their own: at least 2 in all.
    Raises a ValueError naming the policies that cannot run on `num_gpus`."""
    if num_gpus >= 2:
        return
    split = [p.name for p in specs if not p.colocated]
    if split:
        raise ValueError(
            f"{', '.join(split)}: each splits the cluster into training and rollout GPUs, so needs at"
            f" least 2 GPUs; the cluster has {num_gpus}. Use more GPUs or only the colocated policy"
        )


@dataclass(frozen=True)
class Deployment:
    train_gpus: int
    train_layout: TrainLayout
    instances: tuple[tuple[int, int], ...]  # (tp, bucket) per rollout instance
    bucket_bounds: tuple[int, ...]  # ascending upper bounds; len = buckets - 1 (>= 1, see OPEN_BOUND)
    rollout_gpus: int  # GPUs given to rollout (>= sum of instance TPs; the rest idle or hybrid)
    plan: Plan | None = None
    # A heterogeneous search's best mixed-TP price over its best one-degree price, minus 1
    # (`search.mixed_gap`); not part of what is deployed, so not compared.
    mixed_gap: float | None = field(default=None, compare=False)

    @property
    def spare_gpus(self) -> int:
        """Rollout GPUs no instance holds (a layout that does not fill the rollout side); the
        elastic pool trains on them."""
        return self.rollout_gpus - sum(tp for tp, _ in self.instances)

    @property
    def num_buckets(self) -> int:
        return max(b for _, b in self.instances) + 1

    def label(self) -> str:
        tps: dict[int, int] = {}
        for tp, _ in self.instances:
            tps[tp] = tps.get(tp, 0) + 1
        inst = " ".join(f"{n}xTP{t}" for t, n in sorted(tps.items()))
        return f"train {self.train_gpus} ({self.train_layout.label()}) | rollout {self.rollout_gpus} ({inst})"


def homogeneous_tp(
    model: ModelSpec, hw: HardwareSpec, workload: Workload, rollout_gpus: int, settings: SearchSettings
) -> int:
    """The TP degree the planner prices best for one group on `rollout_gpus` (a fixed split's)."""
    cost = RolloutCostModel(model, hw, settings.max_num_seqs)
    tps = tuple(t for t in instance_tp_degrees(model, hw) if t <= rollout_gpus)
    table = segment_table(cost, workload, tps, rollout_gpus, replace(settings, promote=False))  # one group
    best = homogeneous(table, rollout_gpus)
    return best.groups[0].tp if best else tps[0]


def build_deployment(
    policy: PolicySpec,
    model: ModelSpec,
    hw: HardwareSpec,
    num_gpus: int,
    workload: Workload,
    settings: SearchSettings,
) -> Deployment:
    """The policy's layout for `workload` (iteration 0's trajectories, or a replanning window)."""
    if policy.split != "planner":
        n_train = num_gpus if policy.split == "all" else num_gpus // 2
        n_roll = num_gpus if policy.split == "all" else num_gpus - n_train
        return fixed_split(model, hw, workload, settings, n_train, n_roll)
    plans = search_plans(model, hw, num_gpus, workload, settings)
    if not plans:
        raise ValueError(f"the planner found no plan for {model.name} on {num_gpus}x{hw.name}")
    dep = deployment_from_plan(policy, plans[0], model, hw, settings)
    return replace(dep, mixed_gap=mixed_gap(plans)) if policy.hetero else dep


def fixed_split(
    model: ModelSpec,
    hw: HardwareSpec,
    workload: Workload,
    settings: SearchSettings,
    n_train: int,
    n_roll: int,
) -> Deployment:
    """`n_train` training GPUs (the best layout on them) and one-degree instances on `n_roll`."""
    est = best_train(model, hw, n_train, TrainShape.from_workload(workload))
    if est is None:
        raise ValueError(f"{model.name} does not train on {n_train} {hw.name} GPUs; use more GPUs")
    tp = homogeneous_tp(model, hw, workload, n_roll, settings)
    inst = tuple((tp, 0) for _ in range(n_roll // tp))
    return Deployment(n_train, est.layout, inst, (OPEN_BOUND,), n_roll)


def measured_split(
    model: ModelSpec,
    hw: HardwareSpec,
    num_gpus: int,
    workload: Workload,
    settings: SearchSettings,
    rollout_gpu_s: float,
    train_gpu_s: float,
) -> Deployment:
    """greedy's re-split: training gets `num_gpus x train / (rollout + train)` GPUs (measured
    GPU-seconds of one rollout and one update), rounded to the nearest count it trains on.

    The rule assumes both stages scale linearly with their GPUs; a rollout bound by its slowest
    trajectories does not, which is what the planner's split knows and this one does not.
    """
    assert rollout_gpu_s > 0 and train_gpu_s > 0, "measure one rollout and one update first"
    shape = TrainShape.from_workload(workload)
    want = num_gpus * train_gpu_s / (rollout_gpu_s + train_gpu_s)
    counts = sorted(range(1, num_gpus), key=lambda n: (abs(n - want), n))
    n_train = next((n for n in counts if best_train(model, hw, n, shape) is not None), num_gpus // 2)
    return fixed_split(model, hw, workload, settings, n_train, num_gpus - n_train)


def deployment_from_plan(
    policy: PolicySpec,
    plan: Plan,
    model: ModelSpec,
    hw: HardwareSpec,
    settings: SearchSettings,
) -> Deployment:
    if not policy.hetero:
        assert settings.homogeneous and len(plan.rollout.groups) == 1, (
            f"policy {policy.name} runs one TP degree; plan it with SearchSettings(homogeneous=True)"
        )
        tp = plan.rollout.groups[0].tp
        inst = tuple((tp, 0) for _ in range(plan.rollout_gpus // tp))
        return Deployment(plan.train_gpus, plan.train.layout, inst, (OPEN_BOUND,), plan.rollout_gpus, plan)
    # One bucket per DP group (contiguous length range); groups with equal bounds merge, and so do
    # neighbouring groups of one TP degree (a move between them would re-prefill for nothing).
    bounds: list[int] = []
    members: list[tuple[int, int]] = []
    groups = plan.rollout.groups
    longest = int(plan.bin_max_len[-1]) if plan.bin_max_len else OPEN_BOUND
    for gi, g in enumerate(groups):
        bound = OPEN_BOUND if gi == len(groups) - 1 else int(plan.bin_max_len[g.end_bin - 1])
        # Bins of equal length (trajectories cut at the context cap) cannot be told apart by length:
        # a group whose bound is already the longest length takes every later group into its bucket.
        bound = OPEN_BOUND if bound >= longest else bound
        if bounds and groups[gi - 1].tp == g.tp:
            bounds[-1] = max(bounds[-1], bound)
        elif not bounds or bound > bounds[-1]:
            bounds.append(bound)
        members.extend((g.tp, len(bounds) - 1) for _ in range(g.instances))
    if len(bounds) > 1:
        bounds = bounds[:-1]  # the last bucket is open
    return Deployment(
        plan.train_gpus, plan.train.layout, tuple(members), tuple(bounds), plan.rollout_gpus, plan
    )
