"""Synthetic agentic traces with long tails, policy drift, and tool returns that cause work.

Generative story (all draws from the `random.Random` passed in, so a seed pins the trace):

- A prompt has a latent difficulty `d ~ N(0, 1)`, a favourite tool, and a size
  `prompt_tokens ~ LogNormal(log(prompt_tokens_median) + prompt_size_signal * d, 0.4)`, so prompt size
  carries only `prompt_size_signal` of the difficulty (the input-length baseline gets a fair but
  partial signal). Each iteration draws `prompts_per_iteration` prompts from a pool of `prompt_pool`
  (0: every prompt is new, as in the real arithmetic runs) and samples `group_size` trajectories each.
- A trajectory needs `K = 1 + floor(LogNormal(0.7 + 0.6 d, subtask_sigma))` subtasks (long tail).
  Every turn generates `LogNormal(log(gen_median * drift_factor) + 0.2 d, 0.5)` tokens and calls a
  tool (the favourite with probability 0.6 + 0.4/3 = 0.73: the other draws pick any of the three,
  the favourite too). The *hidden outcome* of the call:
  - fails with `p = sigmoid(-1.5 + 0.8 d - improvement)`, or times out with probability 0.05
    (0.10 for `shell`): the subtask is retried, the payload is a short error (failure, ~60 tokens)
    or nothing useful (timeout, ~12 tokens);
  - otherwise succeeds and finishes one subtask; with probability 0.25 the result is large
    (Pareto-tailed, ~1500+ tokens: a file or page to digest) and uncovers 1-3 more subtasks.
  When no subtask is left, a final answer turn (no tool, ~2x a normal generation) ends it; at
  `max_turns` it is cut off.
- Causality: failures, timeouts and large payloads *cause* more remaining work; difficulty makes
  the prompt's trajectories long. That is the signal C-MLFQ is meant to exploit; nothing in the
  generator reads a scheduler's buckets or statistics.
- Noise (`observation_noise` in [0, 1]): with that probability a tool return's *observed* status
  and payload size are redrawn from their marginal distribution, independent of the hidden outcome,
  so tool returns are only partly informative (the realistic setting).
- Drift: with `progress = iteration / (num_iterations - 1)`, generation lengths grow by the factor
  `drift_factor = 1 + drift * progress` (the policy gets more verbose) and `improvement = 1.5 * drift
  * progress` lowers the failure rate (the policy gets better at using tools).

Latencies: every tool call gets a wall time, drawn from a stream of its own (seeded from the
state of the generator passed in, before its first draw), so the tokens and statuses are the
draws they were before traces carried latencies. A call takes `LogNormal(log(TOOL_LATENCY_S[tool]),
LATENCY_SIGMA)` seconds, twice that when it returned a large payload (>= 1,000 tokens), and
`TIMEOUT_S` when it timed out. The medians are illustrative (a search API, a python sandbox, a
shell running tests), not fitted; the schedulers and the evaluator read only tokens and statuses,
the simulator's replay and `libra plan` the latencies.

Presets (`PRESETS`): `causal` (informative tool returns, prompts repeat), `noisy` (half of the
tool returns uninformative, more spread within a prompt) and `fresh` (no prompt ever repeats, some
noise; the situation of the real arithmetic lake, where prompt-level evidence does not exist).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pyarrow as pa

from libra_core.scheduling.base import ToolStatus, Turn
from libra_core.traces.schema import TraceTrajectory, trace_table

TOOLS = ("search", "python", "shell")
TOOL_LATENCY_S = {"search": 0.5, "python": 2.0, "shell": 5.0}  # median wall time of a call
LATENCY_SIGMA = 0.6
TIMEOUT_S = 30.0  # a call that timed out waited this long
LARGE_PAYLOAD_TOKENS = 1000


@dataclass(frozen=True, slots=True)
class SyntheticTraceConfig:
    num_iterations: int = 40
    prompts_per_iteration: int = 32
    group_size: int = 8
    prompt_pool: int = 200  # distinct prompts to draw from; 0: fresh prompts every iteration
    prompt_tokens_median: int = 300
    prompt_size_signal: float = 0.3  # how much of the difficulty shows in the prompt size (log scale)
    gen_median: int = 150  # generated tokens per turn at iteration 0
    subtask_sigma: float = 0.6  # spread of subtask counts around a prompt's difficulty
    observation_noise: float = 0.0  # share of tool returns whose observed state is random
    drift: float = 1.0  # growth of generation length over the run (1.0: doubles by the end)
    max_turns: int = 40


PRESETS: dict[str, SyntheticTraceConfig] = {
    "causal": SyntheticTraceConfig(),
    "noisy": SyntheticTraceConfig(observation_noise=0.5, subtask_sigma=0.9),
    "fresh": SyntheticTraceConfig(prompt_pool=0, observation_noise=0.25),
}


@dataclass(frozen=True, slots=True)
class _Prompt:
    prompt_id: str
    difficulty: float
    prompt_tokens: int
    favourite_tool: str


def _new_prompt(rng: random.Random, cfg: SyntheticTraceConfig, index: int) -> _Prompt:
    d = rng.gauss(0.0, 1.0)
    size = rng.lognormvariate(math.log(cfg.prompt_tokens_median) + cfg.prompt_size_signal * d, 0.4)
    return _Prompt(f"p{index:06d}", d, max(1, round(size)), rng.choice(TOOLS))


def _observed(rng: random.Random, status: ToolStatus, payload: int, noise: float) -> tuple[ToolStatus, int]:
    if noise <= 0 or rng.random() >= noise:
        return status, payload
    r = rng.random()  # marginal: roughly the overall mix of outcomes
    if r < 0.2:
        return "failure", round(rng.lognormvariate(math.log(60), 0.4))
    if r < 0.26:
        return "timeout", round(rng.lognormvariate(math.log(12), 0.3))
    if r < 0.45:
        return "success", round(1500 * rng.paretovariate(1.8))
    return "success", round(rng.lognormvariate(math.log(120), 0.5))


def _trajectory(
    rng: random.Random, cfg: SyntheticTraceConfig, prompt: _Prompt, progress: float
) -> tuple[Turn, ...]:
    d = prompt.difficulty
    drift_factor = 1.0 + cfg.drift * progress
    improvement = 1.5 * cfg.drift * progress
    subtasks = 1 + int(rng.lognormvariate(0.7 + 0.6 * d, cfg.subtask_sigma))
    p_fail = 1.0 / (1.0 + math.exp(1.5 - 0.8 * d + improvement))
    gen_mu = math.log(cfg.gen_median * drift_factor) + 0.2 * d
    turns: list[Turn] = []
    while subtasks > 0 and len(turns) < cfg.max_turns - 1:
        gen = max(1, round(rng.lognormvariate(gen_mu, 0.5)))
        tool = prompt.favourite_tool if rng.random() < 0.6 else rng.choice(TOOLS)
        r = rng.random()
        p_timeout = 0.10 if tool == "shell" else 0.05
        status: ToolStatus
        if r < p_fail:
            status, payload = "failure", round(rng.lognormvariate(math.log(60), 0.4))
        elif r < p_fail + p_timeout:
            status, payload = "timeout", round(rng.lognormvariate(math.log(12), 0.3))
        else:
            status = "success"
            subtasks -= 1
            if rng.random() < 0.25:
                payload = round(1500 * rng.paretovariate(1.8))
                subtasks += rng.randint(1, 3)
            else:
                payload = round(rng.lognormvariate(math.log(120), 0.5))
        status, payload = _observed(rng, status, payload, cfg.observation_noise)
        turns.append(Turn(gen, tool, payload, status))
    turns.append(Turn(max(1, round(2 * rng.lognormvariate(gen_mu, 0.5))), None, 0, None))
    return tuple(turns)


def _latencies(rng: random.Random, turns: tuple[Turn, ...]) -> tuple[float | None, ...]:
    """Each turn's tool-call wall time (None on the last turn), from the latency stream."""
    out: list[float | None] = []
    for t in turns:
        if t.tool is None:
            out.append(None)
        elif t.status == "timeout":
            out.append(TIMEOUT_S)
        else:
            x = rng.lognormvariate(math.log(TOOL_LATENCY_S.get(t.tool, 1.0)), LATENCY_SIGMA)
            out.append(round(x * (2.0 if t.payload_tokens >= LARGE_PAYLOAD_TOKENS else 1.0), 6))
    return tuple(out)


def synthetic_trajectories(rng: random.Random, cfg: SyntheticTraceConfig) -> list[TraceTrajectory]:
    """Generate a trace as TraceTrajectory rows (see the module docstring for the model)."""
    # Its own stream, from the state before the first draw: the token draws stay what they were.
    lat_rng = random.Random(str(rng.getstate()[1]))
    pool = [_new_prompt(rng, cfg, i) for i in range(cfg.prompt_pool)]
    fresh = cfg.prompt_pool
    out: list[TraceTrajectory] = []
    for iteration in range(cfg.num_iterations):
        progress = iteration / max(1, cfg.num_iterations - 1)
        if pool:
            chosen = rng.sample(pool, min(len(pool), cfg.prompts_per_iteration))
        else:
            chosen = [_new_prompt(rng, cfg, fresh + i) for i in range(cfg.prompts_per_iteration)]
            fresh += cfg.prompts_per_iteration
        for g, prompt in enumerate(chosen):
            for s in range(cfg.group_size):
                turns = _trajectory(rng, cfg, prompt, progress)
                out.append(
                    TraceTrajectory(
                        trajectory_id=f"it{iteration:05d}-g{g:04d}-s{s:02d}",
                        prompt_id=prompt.prompt_id,
                        iteration=iteration,
                        prompt_tokens=prompt.prompt_tokens,
                        turns=turns,
                        tool_latency_s=_latencies(lat_rng, turns),
                    )
                )
    return out


def synthetic_trace(rng: random.Random, cfg: SyntheticTraceConfig | str = "causal") -> pa.Table:
    """A synthetic trace table (TRACE_SCHEMA); `cfg` is a config or a PRESETS name."""
    if isinstance(cfg, str):
        if cfg not in PRESETS:
            raise ValueError(f"unknown synthetic preset {cfg!r}; valid: {sorted(PRESETS)}")
        cfg = PRESETS[cfg]
    return trace_table(synthetic_trajectories(rng, cfg))
