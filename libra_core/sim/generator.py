"""The scenario generator: a built-in scenario's trajectories per iteration, drawn from its
`ScenarioSpec` (scenarios.py). `workloads.load_scenario` builds it for a scenario name (a trace
file is replayed by trace_replay.py instead); the engine asks it for each iteration's trajectories.

Generators are shaped like three public agentic RL recipes (figures are illustrative shapes, not fits):
- `search-r1`: multi-hop retrieval, 1-8 turns, long retrieved passages, fast tools (Qwen2.5-7B);
- `dapo-math`: long chain-of-thought with 1-3 python calls, long-tailed lengths (Qwen3-8B);
- `r2e-gym`: SWE agent, many turns of bash/edit/test, slow tools, a heavy tail to 32K (Qwen3-14B).

Model, per prompt of a fixed pool (prompts recur across epochs, as in a real dataset): a latent
difficulty `d ~ LogNormal(0, difficulty_sigma)`. A trajectory plans `1 + Geometric` subtasks, the
geometric's mean set by `max(1, mean_subtasks x d^0.5 x turn drift)`: at least one, so a
`mean_subtasks` below 1 (dapo-math's 0.6) changes little and almost every trajectory calls a tool
(dapo-math: 1-3 calls; said "occasional" until 2026-12-07); each subtask is one turn of
`LogNormal(gen_median x d^0.3 x gen drift, turn_sigma)` generated tokens ending in a tool call. A
call fails with `fail_prob` (the subtask is retried: one more turn), times out with `timeout_prob`
(retried, latency `timeout_s`), or succeeds; a success returns a large payload with
`big_payload_prob` and then uncovers 1-2 more subtasks. So a tool return carries evidence about the
work left (what C-MLFQ's tree learns). The last turn answers (no tool). Drift: generated lengths
grow linearly to `gen_drift` and subtasks to `turn_drift` at the last iteration, the failure rate
falls by half (the policy learns). A trajectory stops at `max_total_tokens`. Groups: every prompt of
an iteration is sampled `group_size` times (GRPO). With `prompt_latency_sigma` > 0 (0.8 in the three
agentic scenarios, 0 in `tiny`) each prompt's tool calls are all slower or faster by a factor
`LogNormal(0, sigma)`, drawn from a stream of its own: the token counts and statuses stay the draws
they are without it, only the latencies of successes and failures scale.

The shapes aim at the paper's long tail, read as rollout wall time: in each scenario, over 100
iterations, more than half of an iteration's rollout comes after 90% of its trajectories have
finished (docs/simulator-notebook.md, "A long tail by default"). By summed trajectory latency the
slowest 10% take about a quarter to a third.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from libra_core.scheduling.base import ToolStatus, Turn
from libra_core.sim.scenarios import ScenarioSpec
from libra_core.sim.trajectory import SimTrajectory


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
