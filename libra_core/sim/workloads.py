"""Simulated workloads: agentic trajectories per iteration, generated here or replayed from a trace
(`trace_replay.py`; `load_scenario` picks either by name).

Generators are shaped like three public agentic RL recipes (figures are illustrative shapes, not fits):
- `search-r1`: multi-hop retrieval, 1-8 turns, long retrieved passages, fast tools (Qwen2.5-7B);
- `dapo-math`: long chain-of-thought with an occasional python call, long-tailed lengths (Qwen3-8B);
- `r2e-gym`: SWE agent, many turns of bash/edit/test, slow tools, a heavy tail to 32K (Qwen3-14B).

Model, per prompt of a fixed pool (prompts recur across epochs, as in a real dataset): a latent
difficulty `d ~ LogNormal(0, difficulty_sigma)`. A trajectory plans `Geometric` subtasks with mean
`mean_subtasks x d^0.5 x turn drift`; each subtask is one turn of `LogNormal(gen_median x d^0.3 x
gen drift, turn_sigma)` generated tokens ending in a tool call. A call fails with `fail_prob` (the
subtask is retried: one more turn), times out with `timeout_prob` (retried, latency `timeout_s`), or
succeeds; a success returns a large payload with `big_payload_prob` and then uncovers 1-2 more
subtasks. So a tool return carries evidence about the work left (what C-MLFQ's tree learns). The last
turn answers (no tool). Drift: generated lengths grow linearly to `gen_drift` and subtasks to
`turn_drift` at the last iteration, the failure rate falls by half (the policy learns). A trajectory
stops at `max_total_tokens`. Groups: every prompt of an iteration is sampled `group_size` times (GRPO).
With `prompt_latency_sigma` > 0 (0.8 in the three agentic scenarios, 0 in `tiny`) each prompt's tool
calls are all slower or faster by a factor `LogNormal(0, sigma)`, drawn from a stream of its own: the
token counts and statuses stay the draws they are without it, only the latencies of successes and
failures scale.

The shapes aim at the paper's long tail, read as rollout wall time: in each scenario, over 100
iterations, more than half of an iteration's rollout comes after 90% of its trajectories have
finished (docs/simulator-notebook.md, "A long tail by default"). By summed trajectory latency the
slowest 10% take about a quarter to a third.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra_core.scheduling.base import ToolStatus, Turn
from libra_core.traces.schema import MAX_TOOL_LATENCY_S

if TYPE_CHECKING:
    from libra_core.sim.trace_replay import TraceSpec, TraceWorkload


@dataclass(frozen=True, slots=True)
class SimTrajectory:
    """One trajectory to replay: its turns and the latency of each turn's tool call (0 on the last)."""

    trajectory_id: str
    prompt_id: str
    iteration: int
    prompt_tokens: int
    turns: tuple[Turn, ...]
    tool_latency_s: tuple[float, ...]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + sum(t.gen_tokens + t.payload_tokens for t in self.turns)


# Upper bounds of `ScenarioSpec` fields (each a ValueError naming the field past it).
MAX_PROMPT_POOL = 1_000_000  # the pool's per-prompt draws are held in memory: ~130 MB at this size
MAX_TRAJECTORIES = 100_000  # per iteration (prompts x group); the built-in scenarios run 512
MAX_TURNS = 10_000
MAX_TOKENS = 10_000_000  # a trajectory's token cap and each token median
MAX_SIGMA = 10.0  # a log-normal's sigma: e^10 (22,000x) per standard deviation
MAX_DRIFT = 100.0  # gen_drift: generated lengths 100x longer by the last iteration
MAX_MEAN_SUBTASKS = 10_000.0  # mean_subtasks x turn_drift (turns are capped by max_turns anyway)
_TOKEN_MEDIANS = ("prompt_median", "gen_median", "payload_median", "big_payload_tokens")
_MAY_BE_ZERO = ("timeout_s", "difficulty_sigma", "turn_sigma", "prompt_latency_sigma")


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    model: str  # models.yaml key of the policy
    description: str
    prompts_per_iteration: int
    group_size: int
    prompt_pool: int
    prompt_median: float
    difficulty_sigma: float
    mean_subtasks: float
    max_turns: int
    gen_median: float
    turn_sigma: float
    tool: str
    payload_median: float
    big_payload_tokens: float
    tool_latency_s: float
    fail_prob: float
    timeout_prob: float
    timeout_s: float
    big_payload_prob: float
    max_total_tokens: int
    gen_drift: float  # generated-length multiplier reached at the last iteration
    turn_drift: float  # subtask-count multiplier reached at the last iteration
    # Per-prompt tool-latency factor LogNormal(0, sigma): some tasks' tools are slow on every call
    # (an R2E-Gym repository whose test suite takes minutes); 0 = every prompt alike.
    prompt_latency_sigma: float = 0.0

    def __post_init__(self) -> None:
        counts = ("prompts_per_iteration", "group_size", "prompt_pool", "max_turns", "max_total_tokens")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"scenario {self.name!r}: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("fail_prob", "timeout_prob", "big_payload_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"scenario {self.name!r}: {name} must be in [0, 1], got {value}")
        if self.prompts_per_iteration > self.prompt_pool:
            raise ValueError(
                f"scenario {self.name!r}: prompts_per_iteration ({self.prompts_per_iteration}) exceeds "
                f"prompt_pool ({self.prompt_pool}); an iteration draws distinct prompts"
            )
        if self.fail_prob + self.timeout_prob > 1.0:
            raise ValueError(f"scenario {self.name!r}: fail_prob + timeout_prob must be <= 1")
        positive = ("prompt_median", "gen_median", "payload_median", "big_payload_tokens", "tool_latency_s")
        for name in (*positive, "mean_subtasks", "gen_drift", "turn_drift"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"scenario {self.name!r}: {name} must be > 0, got {getattr(self, name)}")
        for name in ("difficulty_sigma", "turn_sigma", "timeout_s", "prompt_latency_sigma"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"scenario {self.name!r}: {name} must be >= 0, got {getattr(self, name)}")
        self._check_upper_bounds()

    def _check_upper_bounds(self) -> None:
        """Values past these drew overflowing log-normals, divided by zero in the subtask draw,
        filled memory, or pushed the simulated clock where a decode step no longer moves it."""
        limits: dict[str, float] = {
            "prompt_pool": MAX_PROMPT_POOL,
            "max_turns": MAX_TURNS,
            "max_total_tokens": MAX_TOKENS,
            "gen_drift": MAX_DRIFT,
            **dict.fromkeys(_TOKEN_MEDIANS, MAX_TOKENS),
            **dict.fromkeys(("tool_latency_s", "timeout_s"), MAX_TOOL_LATENCY_S),
            **dict.fromkeys(("difficulty_sigma", "turn_sigma", "prompt_latency_sigma"), MAX_SIGMA),
        }
        for name, limit in limits.items():
            value = getattr(self, name)
            if value > limit:
                low = "[1" if isinstance(value, int) else "[0" if name in _MAY_BE_ZERO else "(0"
                raise ValueError(
                    f"scenario {self.name!r}: {name} must be in {low}, {limit:g}], got {value:g}"
                )
        subtasks = self.mean_subtasks * max(1.0, self.turn_drift)
        if subtasks > MAX_MEAN_SUBTASKS:
            raise ValueError(
                f"scenario {self.name!r}: mean_subtasks x turn_drift (the mean subtasks at the last "
                f"iteration) must be in (0, {MAX_MEAN_SUBTASKS:g}], got {self.mean_subtasks:g} x "
                f"{self.turn_drift:g} = {subtasks:g}"
            )
        per_iteration = self.prompts_per_iteration * self.group_size
        if per_iteration > MAX_TRAJECTORIES:
            raise ValueError(
                f"scenario {self.name!r}: prompts_per_iteration x group_size (trajectories per "
                f"iteration) must be in [1, {MAX_TRAJECTORIES}], got {self.prompts_per_iteration} x "
                f"{self.group_size} = {per_iteration}"
            )


SCENARIOS: dict[str, ScenarioSpec] = {
    "search-r1": ScenarioSpec(
        "search-r1",
        "qwen2.5-7b",
        "multi-hop retrieval QA with a search tool",
        32,
        16,
        4000,
        250,
        0.5,
        2.0,
        8,
        120,
        0.5,
        "search",
        500,
        1500,
        0.8,
        0.08,
        0.02,
        10.0,
        0.3,
        8192,
        1.3,
        1.6,
        prompt_latency_sigma=0.8,
    ),
    "dapo-math": ScenarioSpec(
        "dapo-math",
        "qwen3-8b",
        "math reasoning with an optional python tool, long CoT",
        32,
        16,
        4000,
        150,
        0.9,
        0.6,
        4,
        400,
        1.3,
        "python",
        60,
        400,
        1.5,
        0.15,
        0.03,
        20.0,
        0.2,
        20480,
        1.8,
        1.2,
        prompt_latency_sigma=0.8,
    ),
    "r2e-gym": ScenarioSpec(
        "r2e-gym",
        "qwen3-14b",
        "SWE agent with bash/edit/test tools, heavy tail",
        32,
        16,
        2000,
        1500,
        0.8,
        8.0,
        60,
        160,
        0.7,
        "bash",
        300,
        3000,
        4.0,
        0.25,
        0.05,
        60.0,
        0.25,
        32768,
        1.6,
        1.5,
        prompt_latency_sigma=0.8,
    ),
    "tiny": ScenarioSpec(  # for tests: a few short trajectories per iteration
        "tiny",
        "qwen2.5-3b",
        "test scenario",
        4,
        4,
        8,
        100,
        0.6,
        2.0,
        6,
        60,
        0.5,
        "calc",
        40,
        200,
        0.5,
        0.2,
        0.05,
        5.0,
        0.3,
        2048,
        1.5,
        1.5,
    ),
}


class ScenarioWorkload:
    """Iteration -> trajectories for a generated scenario; seeded, so iteration k is reproducible."""

    def __init__(self, spec: ScenarioSpec, iterations: int, seed: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.model = spec.model
        self.iterations = iterations
        self.seed = seed
        pool_rng = random.Random(seed * 1_000_003 + 17)
        self._difficulty = [
            pool_rng.lognormvariate(0.0, spec.difficulty_sigma) for _ in range(spec.prompt_pool)
        ]
        self._prompt_len = [
            max(16, round(pool_rng.lognormvariate(math.log(spec.prompt_median), 0.3)))
            for _ in range(spec.prompt_pool)
        ]
        longest = max(self._prompt_len)
        if longest >= spec.max_total_tokens:  # a trajectory must generate at least one token
            raise ValueError(
                f"scenario {spec.name!r}: max_total_tokens ({spec.max_total_tokens}) leaves no room to "
                f"generate after the longest prompt ({longest} tokens); raise it above {longest}"
            )
        order = list(range(spec.prompt_pool))
        pool_rng.shuffle(order)
        self._order = order
        # Its own stream, so a scenario without the factor draws exactly what it drew before.
        lat_rng = random.Random(seed * 1_000_003 + 29)
        sigma = spec.prompt_latency_sigma
        self._latency_shift = [sigma * lat_rng.gauss(0.0, 1.0) if sigma > 0 else 0.0 for _ in order]

    def drift(self, iteration: int) -> float:
        """0 at the first iteration, 1 at the last."""
        return iteration / max(1, self.iterations - 1)

    def describe(self) -> str:
        """One line for the report: the generator and its load."""
        s = self.spec
        return (
            f"generated {s.name} ({s.description}): {s.prompts_per_iteration} prompts x {s.group_size} "
            "trajectories per iteration"
        )

    def trajectories(self, iteration: int) -> list[SimTrajectory]:
        s = self.spec
        rng = random.Random((self.seed + 1) * 7919 + iteration * 104_729)
        x = self.drift(iteration)
        gen_scale = 1.0 + (s.gen_drift - 1.0) * x
        turn_scale = 1.0 + (s.turn_drift - 1.0) * x
        fail = s.fail_prob * (1.0 - 0.5 * x)
        n = s.prompts_per_iteration
        start = (iteration * n) % s.prompt_pool
        prompts = [self._order[(start + i) % s.prompt_pool] for i in range(n)]
        out = []
        for p in prompts:
            for g in range(s.group_size):
                tid = f"i{iteration}-p{p}-g{g}"
                out.append(self._one(rng, tid, p, iteration, gen_scale, turn_scale, fail))
        return out

    def _one(
        self, rng: random.Random, tid: str, p: int, it: int, gen_scale: float, turn_scale: float, fail: float
    ) -> SimTrajectory:
        s = self.spec
        rand, bits = rng.random, rng.getrandbits
        d = self._difficulty[p]
        mean = max(1.0, s.mean_subtasks * math.sqrt(d) * turn_scale)
        if mean > 1:  # Geometric(1 / mean) by inversion
            q = math.log(1.0 - 1.0 / mean)  # 0.0 past mean ~ 1e16 (a hard prompt at a large sigma)
            todo = 1 + int(math.log(1.0 - rand()) / (q if q < 0.0 else math.log1p(-1.0 / mean)))
        else:
            todo = 1
        budget = s.max_total_tokens - self._prompt_len[p]
        gen_mu = math.log(s.gen_median * d**0.3 * gen_scale)
        latency_mu = math.log(s.tool_latency_s) + self._latency_shift[p]
        payload_mu = math.log(s.payload_median)
        big_mu = math.log(s.big_payload_tokens)
        turns: list[Turn] = []
        lat: list[float] = []
        # Token counts are `min(budget, max(1, round(x)))`, written with comparisons (the same ints):
        # the builtins parse their arguments at each call, a large share of this loop.
        while len(turns) < s.max_turns and budget > 0:
            g = round(_lognormal(rand, gen_mu, s.turn_sigma))
            g = g if g > 1 else 1
            g = g if g < budget else budget
            budget -= g
            if todo <= 0 or budget <= 0 or len(turns) == s.max_turns - 1:
                turns.append(Turn(g, None, 0, None))
                lat.append(0.0)
                break
            u = rand()
            status: ToolStatus
            latency = _lognormal(rand, latency_mu, 0.5)
            payload = _lognormal(rand, payload_mu, 0.5)
            if u < fail:
                status = "failure"  # the subtask is retried
            elif u < fail + s.timeout_prob:
                status, latency, payload = "timeout", s.timeout_s, 8.0
            else:
                status = "success"
                todo -= 1
                if rand() < s.big_payload_prob:
                    payload = _lognormal(rand, big_mu, 0.4)
                    todo += 1 + _below_2(bits)  # a large observation uncovers 1-2 more subtasks
            y = round(payload)
            y = y if y > 1 else 1
            y = y if y < budget else budget
            budget -= y
            turns.append(Turn(g, s.tool, y, status))
            lat.append(latency)
        if turns and turns[-1].tool is not None:  # ended on a tool return: a final empty turn
            turns.append(Turn(0, None, 0, None))
            lat.append(0.0)
        return SimTrajectory(tid, f"p{p}", it, self._prompt_len[p], tuple(turns), tuple(lat))


# Generating a workload draws a few log-normals per turn; CPython's `lognormvariate` costs two method
# calls on top of the Kinderman-Monahan loop, so the loop is written here for the generator's hot path.
# Both helpers make the same draws and return the same floats as `random.Random` (a test checks it).


_NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)  # `random.NV_MAGICCONST`, computed the same way


def _lognormal(rand: Callable[[], float], mu: float, sigma: float) -> float:
    """`Random.lognormvariate(mu, sigma)` given the generator's `random` method."""
    while True:
        u1 = rand()
        u2 = 1.0 - rand()
        z = _NV_MAGICCONST * (u1 - 0.5) / u2
        if z * z / 4.0 <= -math.log(u2):
            return math.exp(mu + z * sigma)


def _below_2(bits: Callable[[int], int]) -> int:
    """`Random.randint(1, 2) - 1` given the generator's `getrandbits` method (rejection sampling on
    two bits, as `Random._randbelow` does)."""
    r = bits(2)
    while r >= 2:
        r = bits(2)
    return r


def is_trace(scenario: str | Path) -> bool:
    """Whether `scenario` names a trace file to replay rather than a built-in generator."""
    return isinstance(scenario, Path) or str(scenario).endswith(".parquet")


def spec_class(scenario: str | Path) -> type:
    """The dataclass `--spec FIELD=VALUE` changes for `scenario`: `ScenarioSpec` for a generator,
    `trace_replay.TraceSpec` for a trace."""
    if is_trace(scenario):
        from libra_core.sim.trace_replay import TraceSpec

        return TraceSpec
    return ScenarioSpec


def scenario_spec(
    scenario: str | Path, model: str | None = None, spec_overrides: dict[str, Any] | None = None
) -> ScenarioSpec | TraceSpec:
    """The spec `load_scenario` runs `scenario` with: a built-in generator's `ScenarioSpec`, or a
    trace replay's `TraceSpec`, changed by `spec_overrides`. Reads no file and draws nothing, so a
    caller checks names, fields and ranges with it before a long task (ValueErrors)."""
    if is_trace(scenario):
        from libra_core.sim.trace_replay import TraceSpec

        valid = {f.name for f in fields(TraceSpec)}
        bad = sorted(set(spec_overrides or {}) - valid)
        if bad:
            raise ValueError(
                f"fields {bad} do not apply to a trace replay; a trace's --spec fields are {sorted(valid)}"
            )
        return TraceSpec(**(spec_overrides or {}))
    if scenario not in SCENARIOS:
        raise ValueError(
            f"unknown scenario {scenario!r}; valid: {sorted(SCENARIOS)} or a trace .parquet path"
        )
    spec = SCENARIOS[scenario]
    if model is not None:
        spec = replace(spec, model=model)
    if spec_overrides:
        spec = replace(spec, **spec_overrides)
    return spec


def load_scenario(
    scenario: str | Path,
    iterations: int,
    seed: int,
    model: str | None = None,
    spec_overrides: dict[str, Any] | None = None,
) -> ScenarioWorkload | TraceWorkload:
    """A scenario name (`SCENARIOS`) or a trace Parquet path; unknown names raise a ValueError.
    `spec_overrides` changes fields of the scenario's `spec_class` (a what-if)."""
    spec = scenario_spec(scenario, model, spec_overrides)
    if isinstance(spec, ScenarioSpec):
        return ScenarioWorkload(spec, iterations, seed)
    from libra_core.sim.trace_replay import TraceWorkload

    return TraceWorkload(scenario, model or "qwen3-8b", spec)


def long_tail_share(latencies_s: Sequence[float], top: float = 0.1) -> float:
    """Share of summed trajectory latency taken by the slowest `top` fraction."""
    xs = sorted(latencies_s, reverse=True)
    k = max(1, round(len(xs) * top))
    total = sum(xs)
    return sum(xs[:k]) / total if total > 0 else 0.0
