"""Documented synthetic workload presets (agentic length distributions), seeded and reproducible.

Each trajectory draws:
- a turn count `Geometric(1/mean_turns)` >= 1, capped at max_turns;
- a length multiplier `LogNormal(0, traj_sigma)` (the long tail: some prompts make the policy
  ramble);
- per turn, `LogNormal(log(gen_median x multiplier), turn_sigma)` generated tokens and, after every
  turn but the last, a tool reply of `LogNormal(log(payload_median), 0.5)` tokens taking
  `LogNormal(log(tool_latency_s), 0.5)` seconds.
A trajectory stops at `max_total_tokens`. The figures are illustrative shapes (short
math-with-calculator, retrieval, SWE-style long tail), not fits to a particular dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libra_core.planner.workload import Turns, Workload, workload_from_turns


@dataclass(frozen=True)
class SyntheticSpec:
    description: str
    prompts_per_iteration: int
    group_size: int
    prompt_median: float
    mean_turns: float
    max_turns: int
    gen_median: float
    turn_sigma: float
    traj_sigma: float
    payload_median: float
    tool_latency_s: float
    max_total_tokens: int


PRESETS: dict[str, SyntheticSpec] = {
    "arith-tiny": SyntheticSpec(
        "the project's CPU calculator task (tiny model, 16x8 per iteration, ~60-120 tokens)",
        16,
        8,
        20,
        3.0,
        8,
        12,
        0.3,
        0.2,
        4,
        0.001,
        400,
    ),
    "math-short": SyntheticSpec(
        "math with a calculator/python tool: 1-4 turns, ~1K tokens, light tail",
        64,
        8,
        200,
        2.0,
        4,
        500,
        0.6,
        0.5,
        30,
        0.3,
        8192,
    ),
    "search-medium": SyntheticSpec(
        "multi-hop retrieval: 2-10 turns, long tool replies, ~4K tokens",
        64,
        8,
        400,
        4.0,
        10,
        250,
        0.6,
        0.6,
        700,
        1.0,
        16384,
    ),
    "swe-longtail": SyntheticSpec(
        "SWE-style agent: many turns, heavy tail to 32K tokens, slow tools",
        32,
        16,
        1500,
        10.0,
        50,
        150,
        0.8,
        1.0,
        400,
        3.0,
        32768,
    ),
}


def synthetic_workload(
    name: str, spec: SyntheticSpec, rng: np.random.Generator, num_samples: int | None = None
) -> Workload:
    n = num_samples or min(spec.prompts_per_iteration * spec.group_size, 2048)
    prompts = np.maximum(1, np.round(rng.lognormal(np.log(spec.prompt_median), 0.3, n))).astype(int)
    turns_n = np.minimum(spec.max_turns, rng.geometric(1.0 / spec.mean_turns, n))  # support >= 1
    scale = rng.lognormal(0.0, spec.traj_sigma, n)
    gen_all, pay_all, lat_all = [], [], []
    for i in range(n):
        k = int(turns_n[i])
        gen = np.maximum(1, np.round(rng.lognormal(np.log(spec.gen_median * scale[i]), spec.turn_sigma, k)))
        pay = np.maximum(1, np.round(rng.lognormal(np.log(spec.payload_median), 0.5, k)))
        pay[-1] = 0  # the last turn is the answer: no tool call
        lat = rng.lognormal(np.log(spec.tool_latency_s), 0.5, k)
        budget = spec.max_total_tokens - int(prompts[i])
        g_out: list[int] = []
        y_out: list[int] = []
        latency = 0.0
        for g, y, t in zip(gen, pay, lat, strict=True):
            g = int(min(g, budget))
            budget -= g
            y = int(min(y, budget)) if budget > 0 else 0
            budget -= y
            g_out.append(g)
            y_out.append(y)
            latency += float(t) if y > 0 else 0.0
            if budget <= 0:
                break
        gen_all.append(g_out)
        pay_all.append(y_out)
        lat_all.append(latency)
    turns = Turns([int(p) for p in prompts], gen_all, pay_all, lat_all)
    return workload_from_turns(name, turns, spec.prompts_per_iteration, spec.group_size)


def workload_preset(name: str, seed: int = 0, num_samples: int | None = None) -> Workload:
    """A preset by name; unknown names raise a ValueError listing the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown workload preset {name!r}; valid: {sorted(PRESETS)}")
    return synthetic_workload(name, PRESETS[name], np.random.default_rng(seed), num_samples)
