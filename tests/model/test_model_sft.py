"""SFT warm-up: exact loss masks, the schedule, a loss that drops, and the greedy agent loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from libra_core.config.models import ArithmeticEnvConfig, TinyModelConfig
from libra_core.config.training import WarmupConfig
from libra_core.envs.arithmetic import SPECIAL_TOKENS, ArithmeticEnv
from libra_core.envs.base import Problem
from libra_core.model import sft
from libra_core.model.policy import build_tiny_policy
from libra_core.model.sft import (
    SegmentEncoder,
    collate,
    greedy_accuracy,
    greedy_answers,
    lr_at,
    masked_nll,
    sft_warmup,
    warmup_batch,
)
from libra_core.model.tokenizer import train_tokenizer

TINY = TinyModelConfig(
    hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=32, intermediate_size=128
)


@pytest.fixture(scope="module")
def env() -> ArithmeticEnv:
    return ArithmeticEnv()


@pytest.fixture(scope="module")
def tok(env: ArithmeticEnv):
    return train_tokenizer(env.corpus(200, seed=0), SPECIAL_TOKENS, vocab_size=64)


@pytest.fixture(scope="module")
def trained(env: ArithmeticEnv, tok):
    """A tiny model after 60 SFT steps, with its loss curve."""
    torch.set_num_threads(2)
    model = build_tiny_policy(TINY, len(tok), seed=0)
    calls: list[tuple[int, int, float]] = []
    losses = sft_warmup(
        model,
        tok,
        env,
        WarmupConfig(steps=60, batch_size=32, lr=3e-3),
        seed=0,
        progress=lambda step, total, loss: calls.append((step, total, loss)),
    )
    return model, losses, calls


def test_mask_is_one_exactly_on_calls_and_answer(env: ArithmeticEnv, tok) -> None:
    problem = Problem("p", "((3+4)*5)", "35", 2)
    ids, mask = SegmentEncoder(tok).demonstration(env.demonstration(problem))
    text = "".join(s.text for s in env.demonstration(problem))
    assert ids == tok.encode(text, add_special_tokens=False)
    assert len(mask) == len(ids)
    trained_tokens = [t for t, m in zip(tok.convert_ids_to_tokens(ids), mask, strict=True) if m]
    expected = "<|call|>3+4<|/call|><|call|>7*5<|/call|><|answer|>35<|eos|>"
    assert trained_tokens == tok.convert_ids_to_tokens(tok.encode(expected, add_special_tokens=False))
    context_tokens = [t for t, m in zip(tok.convert_ids_to_tokens(ids), mask, strict=True) if not m]
    assert (
        "".join(context_tokens)
        == "<|user|>((3+4)*5)<|assistant|><|result|>7<|/result|><|result|>35<|/result|>"
    )


def test_masked_nll_averages_only_masked_targets(env: ArithmeticEnv, tok) -> None:
    model = build_tiny_policy(TINY, len(tok), seed=1).eval()
    encoder = SegmentEncoder(tok)
    examples = [encoder.demonstration(env.demonstration(p)) for p in env.sample_problems(4, seed=5)]
    input_ids, attention, loss_mask = collate(examples, tok.pad_token_id)
    assert attention.sum() == sum(len(ids) for ids, _ in examples)
    with torch.no_grad():
        loss = masked_nll(model, input_ids, attention, loss_mask)
        logp = F.log_softmax(model(input_ids=input_ids, attention_mask=attention).logits, dim=-1)
    terms = [
        -logp[row, pos - 1, ids[pos]]
        for row, (ids, mask) in enumerate(examples)
        for pos in range(1, len(ids))
        if mask[pos]
    ]
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-5)
    # Changing the loss mask on a prompt/observation position changes nothing only if it is 0 there.
    only_first = torch.zeros_like(loss_mask)
    first_trained = examples[0][1].index(1)
    only_first[0, first_trained] = 1
    with torch.no_grad():
        single = masked_nll(model, input_ids, attention, only_first)
    assert torch.allclose(single, -logp[0, first_trained - 1, examples[0][0][first_trained]], atol=1e-5)


def test_lr_schedule_warms_up_then_decays() -> None:
    lrs = [lr_at(s, 1000, 1e-3) for s in range(1000)]
    assert lrs[0] < lrs[10] < lrs[49] == pytest.approx(1e-3)
    assert max(lrs) == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[50:], lrs[51:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_sft_drops_the_masked_loss(trained) -> None:
    model, losses, calls = trained
    assert len(losses) == 60 and [c[0] for c in calls] == list(range(1, 61)) and calls[-1][1] == 60
    initial, final = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert final < 0.6 * initial, (initial, final)
    assert not model.training


def test_sft_is_deterministic(env: ArithmeticEnv, tok) -> None:
    runs = []
    for _ in range(2):
        model = build_tiny_policy(TINY, len(tok), seed=0)
        runs.append(sft_warmup(model, tok, env, WarmupConfig(steps=3, batch_size=8), seed=7))
    assert runs[0] == runs[1]


def test_greedy_loop_batched_equals_one_by_one(trained, env: ArithmeticEnv, tok) -> None:
    model = trained[0]
    problems = env.sample_problems(6, seed=123)
    batched = greedy_answers(model, tok, env, problems, max_new_tokens=24, max_turns=5, batch_size=6)
    single = greedy_answers(model, tok, env, problems, max_new_tokens=24, max_turns=5, batch_size=1)
    assert batched == single
    accuracy = greedy_accuracy(model, tok, env, problems, correct_reward=1.0, max_new_tokens=24, max_turns=5)
    expected = sum(a == p.reference_answer for a, p in zip(batched, problems, strict=True)) / len(problems)
    assert accuracy == expected


def test_greedy_loop_gives_each_row_its_own_token_budget(trained, env: ArithmeticEnv, tok) -> None:
    # The agent loop gives a turn min(max_tokens_per_turn, max_total_tokens - its own context): a
    # short prompt batched beside a long one must not get the long one's smaller budget (it cut the
    # short rows' first call, which ended them unanswered and understated the warm-up accuracy).
    model = trained[0]
    encoder = SegmentEncoder(tok)
    problems = env.sample_problems(40, seed=123)
    lengths = [len(encoder.ids(env.render_prompt(p))) for p in problems]
    short = [p for p, n in zip(problems, lengths, strict=True) if n == min(lengths)][:3]
    long = [p for p, n in zip(problems, lengths, strict=True) if n == max(lengths)][:1]
    mixed, limit = short + long, max(lengths) + 3  # the long row has room for 3 tokens only
    limits = dict(max_new_tokens=24, max_turns=5, max_total_tokens=limit)
    one_by_one = greedy_answers(model, tok, env, mixed, **limits, batch_size=1)
    assert any(a is not None for a in one_by_one[: len(short)]), "no short row answers: nothing tested"
    assert greedy_answers(model, tok, env, mixed, **limits, batch_size=len(mixed)) == one_by_one


def test_early_answer_demonstration_stops_after_the_given_calls(env: ArithmeticEnv) -> None:
    problem = Problem("p", "((3+4)*5)", "35", 2)
    early = env.early_answer_demonstration(problem, 1)
    assert "".join(s.text for s in early) == (
        "<|user|>((3+4)*5)<|assistant|><|call|>3+4<|/call|><|result|>7<|/result|><|answer|>7<|eos|>"
    )
    assert [s.trainable for s in early] == [False, True, False, True]
    assert env.early_answer_demonstration(problem, 2) == env.demonstration(problem)
    assert env.reward(problem.reference_answer, "7") < env.reward(problem.reference_answer, "35")
    for bad in (0, 3):
        with pytest.raises(ValueError, match="calls must be in 1..2"):
            env.early_answer_demonstration(problem, bad)


@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_warmup_batch_stops_early_at_the_configured_rate(rate: float) -> None:
    flawed = ArithmeticEnv(ArithmeticEnvConfig(warmup_early_answer_rate=rate))
    batches = [warmup_batch(flawed, seed=3, step=step, batch_size=64) for step in range(20)]
    plain_env = ArithmeticEnv(ArithmeticEnvConfig(warmup_early_answer_rate=0.0))
    plain = [warmup_batch(plain_env, seed=3, step=step, batch_size=64) for step in range(20)]
    pairs = [(d, full) for b, pb in zip(batches, plain, strict=True) for d, full in zip(b, pb, strict=True)]
    multi = [(d, full) for d, full in pairs if len(full) >= 6]  # two or more tool calls
    assert all(d == full for d, full in pairs if len(full) < 6)  # one call: nothing to cut
    assert all(d[0] == full[0] for d, full in pairs)  # same problems whatever the rate
    early = [(d, full) for d, full in multi if d != full]
    share = len(early) / len(multi)
    assert share == rate if rate in (0.0, 1.0) else abs(share - rate) < 0.05, share
    for d, full in early:  # a prefix of the real solution, answered with its last result
        assert 4 <= len(d) < len(full) and d[:-1] == full[: len(d) - 1]
        assert d[-1].text == f"<|answer|>{d[-2].text[len('<|result|>') : -len('<|/result|>')]}<|eos|>"
    assert warmup_batch(flawed, seed=3, step=0, batch_size=64) == batches[0]


def test_warmup_batch_without_a_warmup_hook_uses_plain_demonstrations(env: ArithmeticEnv) -> None:
    class Plain:  # an environment without `warmup_demonstration`
        name = "plain"

        def sample_problems(self, n, seed, *, min_difficulty=None):
            return env.sample_problems(n, seed)

        def demonstration(self, problem):
            return env.demonstration(problem)

    batch = warmup_batch(Plain(), seed=0, step=0, batch_size=4)  # type: ignore[arg-type]
    assert batch == [env.demonstration(p) for p in env.sample_problems(4, sft._step_seed(0, 0))]


def test_demonstrations_past_the_models_positions_are_left_out(
    env: ArithmeticEnv, tok, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = sorted(len(SegmentEncoder(tok).demonstration(d)[0]) for d in warmup_batch(env, 7, 0, 8))
    limit = lengths[len(lengths) // 2]  # about half of step 0's demonstrations are longer
    model = build_tiny_policy(TINY.model_copy(update={"max_position_embeddings": limit}), len(tok), seed=0)
    widths: list[int] = []
    real = sft.collate

    def recording(examples, pad):  # noqa: ANN001, ANN202
        widths.append(max(len(ids) for ids, _ in examples))
        return real(examples, pad)

    monkeypatch.setattr(sft, "collate", recording)
    with caplog.at_level("WARNING", logger=sft.logger.name):
        sft_warmup(model, tok, env, WarmupConfig(steps=2, batch_size=8), seed=7)
    assert widths and max(widths) <= limit < lengths[-1]
    assert "demonstrations longer than the model's" in caplog.text
