"""`ScenarioSpec`: the shape of a generated workload (`--spec FIELD=VALUE`), range-checked; the
built-in scenarios (`SCENARIOS`: `search-r1`, `dapo-math`, `r2e-gym`, `tiny`).

A spec is built once per run (`workloads.scenario_spec`: a built-in one, changed by the run's
`--spec` pairs) and read by the generator (generator.py, whose docstring says what each field
draws); nothing mutates it. Every field is checked when the spec is made: a value outside its
range is a ValueError naming the scenario, the field, the value and the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from libra_core.traces.schema import MAX_TOOL_LATENCY_S

# Upper bounds of `ScenarioSpec` fields (each a ValueError naming the field past it).
MAX_PROMPT_POOL = 1_000_000  # the pool's per-prompt draws are held in memory: ~130 MB at this size
MAX_TRAJECTORIES = 100_000  # per iteration (prompts x group); the built-in scenarios run 512
MAX_TURNS = 10_000
# Trajectories per iteration x max_turns: the most turns one iteration may draw (each held in memory
# until its trajectory finishes). The built-in scenarios reach 30,720 (r2e-gym); without this bound
# the two limits above allowed 1e9.
MAX_TURNS_PER_ITERATION = 5_000_000
MAX_TOKENS = 10_000_000  # a trajectory's token cap and each token median
MAX_SIGMA = 10.0  # a token log-normal's sigma: e^10 (22,000x) per standard deviation
# The per-prompt tool-latency factor's sigma. Its draws are not capped as token counts are (by the
# budget and `max_turns`): at 10 the slowest call of 10 r2e-gym iterations lasted 9e12 s and of
# dapo-math 7e18 s, and one prompt's calls set every policy's makespan. At 2, one prompt in a thousand
# (3.1 sigma) waits 500x the median prompt on its tools; that longest call was 4,290 s (r2e-gym)
# and 15,530 s (dapo-math). The built-in scenarios use 0.8.
MAX_LATENCY_SIGMA = 2.0
MAX_DRIFT = 100.0  # gen_drift: generated lengths 100x longer by the last iteration
MAX_MEAN_SUBTASKS = 10_000.0  # mean_subtasks x turn_drift (turns are capped by max_turns anyway)
_TOKEN_MEDIANS = ("prompt_median", "gen_median", "payload_median", "big_payload_tokens")
_MAY_BE_ZERO = ("timeout_s", "difficulty_sigma", "turn_sigma", "prompt_latency_sigma")


@dataclass(frozen=True)
class ScenarioSpec:
    """A generated scenario's shape: what generator.py's model draws from (its docstring says how)."""

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
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"scenario {self.name!r}: {f.name} must be a finite number, got {value}")
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
            **dict.fromkeys(("difficulty_sigma", "turn_sigma"), MAX_SIGMA),
            "prompt_latency_sigma": MAX_LATENCY_SIGMA,
        }
        for name, limit in limits.items():
            value = getattr(self, name)
            if value > limit:
                # by the field's type, not the value's (a gen_median given as 10000001 read "[1")
                whole = _FIELD_TYPES.get(name) in ("int", int)
                low = "[1" if whole else "[0" if name in _MAY_BE_ZERO else "(0"
                raise ValueError(
                    # the value as given: `:g` rounded 10000001 to 1e+07, inside the range it broke
                    f"scenario {self.name!r}: {name} must be in {low}, {_limit(limit)}], got {value!r}"
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
        turn_slots = per_iteration * self.max_turns
        if turn_slots > MAX_TURNS_PER_ITERATION:
            raise ValueError(
                f"scenario {self.name!r}: prompts_per_iteration x group_size x max_turns (the most "
                f"turns an iteration may draw) must be at most {MAX_TURNS_PER_ITERATION:,}, got "
                f"{self.prompts_per_iteration} x {self.group_size} x {self.max_turns} = {turn_slots:,}"
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


def _limit(x: float) -> str:
    """A range's end as written: 10,000,000, not 1e+07 (beside a value of 10000001)."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


_FIELD_TYPES = {f.name: f.type for f in fields(ScenarioSpec)}
