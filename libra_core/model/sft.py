"""Supervised warm-up of the tiny policy on environment demonstrations, and its greedy check.

Runs once per run (or is read from the warm-up cache) before the first RL iteration, so that GRPO
starts from a policy that solves some problems and fails others: groups with mixed outcomes are
what gives GRPO a signal. Loss covers only what the policy writes in rollouts (tool calls and the
final answer); the prompt and the `<|result|>...<|/result|>` observations are context only.

`greedy_accuracy` is a deliberately small pure-transformers agent loop used to report warm-up
quality; the real rollout path is vLLM (libra_core.rollout).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from libra_core.config.training import WarmupConfig
from libra_core.envs.base import Environment, Problem, Segment
from libra_core.envs.splits import sample_split
from libra_core.model.tokenizer import single_token_id

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteriaList

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, float], None]
"""Called after every optimizer step as progress(step, total_steps, loss); step counts from 1."""

WARMUP_FRACTION = 0.05  # share of steps spent on the linear learning-rate ramp ...
MAX_WARMUP_STEPS = 100  # ... capped at this many steps
MIN_LR_RATIO = 0.1  # cosine decays to this fraction of the peak lr
GRAD_CLIP = 1.0
ADAM_BETAS = (0.9, 0.95)


class SegmentEncoder:
    """Tokenises demonstration segments one by one, memoised.

    Each segment is encoded on its own and the ids concatenated, so every token belongs to exactly
    one segment and the loss mask is exact. Segment texts repeat heavily (`<|call|>3+4<|/call|>`),
    so the cache removes most tokenizer calls from the training loop.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        cached = self._cache.get(text)
        if cached is None:
            cached = list(self._tokenizer.encode(text, add_special_tokens=False))
            if len(self._cache) < 200_000:
                self._cache[text] = cached
        return cached

    def demonstration(self, segments: Sequence[Segment]) -> tuple[list[int], list[int]]:
        """Token ids and per-token loss mask (1 where the token is a training target)."""
        token_ids: list[int] = []
        loss_mask: list[int] = []
        for segment in segments:
            ids = self.ids(segment.text)
            token_ids.extend(ids)
            loss_mask.extend([int(segment.trainable)] * len(ids))
        return token_ids, loss_mask


def collate(
    examples: Sequence[tuple[list[int], list[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest example: (input_ids, attention_mask, loss_mask), all [B, T]."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.float32)
    for row, (ids, mask) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[row, : len(ids)] = 1
        loss_mask[row, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return input_ids, attention, loss_mask


def masked_nll(
    model: PreTrainedModel, input_ids: torch.Tensor, attention: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Mean next-token negative log-likelihood over tokens whose `loss_mask` is 1.

    The logits at position t predict token t+1, so the mask of the *target* token decides.
    """
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    targets = input_ids[:, 1:]
    weights = loss_mask[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    return (nll * weights.reshape(-1)).sum() / weights.sum().clamp(min=1.0)


def lr_at(step: int, total_steps: int, peak_lr: float) -> float:
    """Linear warm-up over a few steps, then cosine decay to MIN_LR_RATIO * peak (step from 0)."""
    warmup = max(1, min(MAX_WARMUP_STEPS, int(total_steps * WARMUP_FRACTION)))
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return peak_lr * (MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * cosine)


def _step_seed(seed: int, step: int) -> int:
    # Distinct, reproducible problem stream per (seed, step), from the train split only.
    return random.Random(f"sft:{seed}:{step}").getrandbits(63)


def warmup_batch(env: Environment, seed: int, step: int, batch_size: int) -> list[list[Segment]]:
    """The demonstrations of warm-up step `step` (from 0): fresh problems, reproducible per step.

    An environment may vary what the warm-up sees with `warmup_demonstration(problem, rng)` (the
    arithmetic task mixes in premature answers); otherwise its `demonstration` is used.
    """
    step_seed = _step_seed(seed, step)
    problems = sample_split(env, batch_size, step_seed, "train")
    varied = getattr(env, "warmup_demonstration", None)
    if varied is None:
        return [env.demonstration(p) for p in problems]
    rng = random.Random(step_seed ^ 0x5EED)  # own stream: the problems do not depend on the flaws
    return [varied(p, rng) for p in problems]


def sft_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    env: Environment,
    cfg: WarmupConfig,
    *,
    seed: int,
    progress: ProgressFn | None = None,
) -> list[float]:
    """Train `model` in place for `cfg.steps` AdamW steps on fresh demonstrations; return losses
    (one per step taken; a step whose demonstrations are all longer than the model's positions is
    skipped, and how many were left out is logged).

    Each step draws `cfg.batch_size` new problems from `env`, so the model never sees a fixed
    training set (see `warmup_batch`). Deterministic given `seed` and the model's initial weights
    (on one thread count).
    """
    import torch

    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer has no pad token; build it with train_tokenizer or set pad_token")
    encoder = SegmentEncoder(tokenizer)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=ADAM_BETAS, weight_decay=0.0)
    losses: list[float] = []
    # A demonstration past the model's positions would train on positions the engines never serve
    # (they run with --max-model-len at that limit) and pad the whole batch to it: left out.
    limit = int(getattr(model.config, "max_position_embeddings", 0)) or None
    dropped = seen = 0
    model.train()
    for step in range(cfg.steps):
        examples = [encoder.demonstration(d) for d in warmup_batch(env, seed, step, cfg.batch_size)]
        seen += len(examples)
        if limit is not None:
            fitting = [e for e in examples if len(e[0]) <= limit]
            dropped += len(examples) - len(fitting)
            examples = fitting
        if not examples:
            continue
        batch = [t.to(device) for t in collate(examples, tokenizer.pad_token_id)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr)
        loss = masked_nll(model, *batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, cfg.steps, losses[-1])
    model.eval()
    if dropped:
        logger.warning(
            "SFT warm-up left out %d of %d demonstrations longer than the model's %d positions "
            "(model.max_position_embeddings)",
            dropped,
            seen,
            limit,
        )
    if losses:
        logger.info("SFT warm-up: %d steps, loss %.4f -> %.4f", cfg.steps, losses[0], losses[-1])
    return losses


def greedy_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    env: Environment,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int = 48,
    max_turns: int = 8,
    max_total_tokens: int | None = None,
    batch_size: int = 64,
    temperature: float = 0.0,
) -> list[str | None]:
    """Run the agent loop greedily for each problem; return each final answer (None if none).

    `temperature` > 0 samples instead (seeded by the caller via torch.manual_seed), which
    estimates what rollouts at that temperature would score.

    Turns end at any of `env.stop_tokens`; a tool call is executed by `env` and its observation
    tokens appended before the next turn; an answer or an invalid turn ends the trajectory. All
    unfinished trajectories advance one turn per round, generated in left-padded batches.

    The limits are the agent loop's (libra_core.rollout.agent_loop), per trajectory: a turn gets
    `min(max_new_tokens, max_total_tokens - its context length)` tokens, an observation is cut to
    the room left, and a trajectory whose context reaches `max_total_tokens` ends. A batch's rows
    have their own budgets, so a short context is not cut short by a long one beside it.
    """
    import torch

    encoder = SegmentEncoder(tokenizer)
    stop_ids = [single_token_id(tokenizer, t) for t in env.stop_tokens]
    pad_id = tokenizer.pad_token_id
    device = next(model.parameters()).device
    limit = max_total_tokens or int(getattr(model.config, "max_position_embeddings", 512))
    contexts = [list(encoder.ids(env.render_prompt(p))) for p in problems]
    answers: list[str | None] = [None] * len(problems)
    active = list(range(len(problems)))
    # Plain sampling (no top-k/top-p truncation), as vLLM does with temperature only.
    sampling = (
        dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        if temperature > 0
        else {"do_sample": False}
    )
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for _ in range(max_turns):
            active = [i for i in active if len(contexts[i]) < limit]
            if not active:
                break
            still_active = []
            for start in range(0, len(active), batch_size):
                chunk = active[start : start + batch_size]
                width = max(len(contexts[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                attention = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    input_ids[row, width - len(contexts[i]) :] = torch.tensor(contexts[i])
                    attention[row, width - len(contexts[i]) :] = 1
                # The agent loop's max_tokens: min(max_tokens_per_turn, room left), row by row (>= 1:
                # rows at the limit left `active` above).
                budgets = [min(max_new_tokens, limit - len(contexts[i])) for i in chunk]
                # Only when the limit binds unevenly; otherwise max_new_tokens is every row's budget.
                uneven = _row_budgets(width, budgets, device) if min(budgets) < max(budgets) else None
                out = model.generate(  # type: ignore[operator]
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    **sampling,
                    max_new_tokens=max(budgets),
                    stopping_criteria=uneven,
                    eos_token_id=stop_ids,
                    pad_token_id=pad_id,
                )
                for row, i in enumerate(chunk):
                    turn = _until_stop(out[row, width : width + budgets[row]].tolist(), stop_ids)
                    contexts[i].extend(turn)
                    action = env.parse_turn(str(tokenizer.decode(turn, skip_special_tokens=False)))
                    if action.kind == "tool_call":
                        observation = encoder.ids(env.format_observation(env.run_tool(action)))
                        contexts[i].extend(observation[: max(limit - len(contexts[i]), 0)])
                        still_active.append(i)
                    elif action.kind == "answer":
                        answers[i] = action.answer
            active = still_active
    model.train(was_training)
    return answers


def _row_budgets(width: int, budgets: list[int], device: torch.device) -> StoppingCriteriaList:
    """Stopping criteria that end row r of a `generate` call once it has `budgets[r]` new tokens
    past the `width` prompt positions (generate then pads it; the caller cuts there)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    limits = torch.tensor(budgets, device=device)

    class RowBudgets(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: object, **kwargs: object) -> torch.Tensor:
            return (input_ids.shape[1] - width) >= limits

    return StoppingCriteriaList([RowBudgets()])


def _until_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    # generate() pads finished rows after their stop token; cut there.
    for pos, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: pos + 1]
    return tokens


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    env: Environment,
    problems: Sequence[Problem],
    *,
    correct_reward: float,
    max_new_tokens: int = 48,
    max_turns: int = 8,
    max_total_tokens: int | None = None,
    batch_size: int = 64,
) -> float:
    """Share of `problems` whose greedy final answer earns `correct_reward` (the environment's
    `reward.correct`: an exact answer, all tests passed), as the iterations' evaluations count.

    The limits are those of `greedy_answers`; pass the rollout's to score what rollouts can reach.
    """
    if not problems:
        raise ValueError("greedy_accuracy needs at least one problem")
    answers = greedy_answers(
        model,
        tokenizer,
        env,
        problems,
        max_new_tokens=max_new_tokens,
        max_turns=max_turns,
        max_total_tokens=max_total_tokens,
        batch_size=batch_size,
    )
    # Not `reward(ref, ref)`: a code problem's reference is its tests (JSON), and code that is not a
    # solution scores `well_formed` (0.1) against them, so any code at all would count as solved.
    solved = sum(
        env.reward(p.reference_answer, a) >= correct_reward for p, a in zip(problems, answers, strict=True)
    )
    return solved / len(problems)
