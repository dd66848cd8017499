"""Stop tokens are resolved to single vocabulary ids, by the agent loop and the greedy warm-up check."""

from __future__ import annotations

import pytest

from libra_core.config.models import RolloutConfig
from libra_core.envs.arithmetic import SPECIAL_TOKENS, ArithmeticEnv
from libra_core.envs.protocol import ENDOFTEXT, IM_END, IM_START, text_format
from libra_core.model.tokenizer import single_token_id, train_tokenizer
from libra_core.rollout.agent_loop import AgentLoop


class ChatmlEnv:
    """All the agent loop's constructor reads of a chatml environment (math_tools needs data files)."""

    stop_tokens = text_format("chatml").stop_tokens


@pytest.fixture(scope="module")
def markers_tok():
    return train_tokenizer(ArithmeticEnv().corpus(100, seed=0), SPECIAL_TOKENS, vocab_size=64)


@pytest.fixture(scope="module")
def chat_tok():
    """A tokenizer shaped like SmolLM2's: chatml tokens, none of the markers, and its unk token is
    `<|endoftext|>` (id 0), which is also one of chatml's stop tokens."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {ENDOFTEXT: 0, IM_START: 1, IM_END: 2, **{c: 3 + i for i, c in enumerate("0123456789+-*()")}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=ENDOFTEXT))
    backend.add_special_tokens([ENDOFTEXT, IM_START, IM_END])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=ENDOFTEXT, eos_token=IM_END)


def loop(env, tok) -> AgentLoop:  # noqa: ANN001
    return AgentLoop(env, tok, [object()], RolloutConfig(), policy_version=0, iteration=1)


def test_the_agent_loop_refuses_a_stop_token_missing_from_the_vocabulary(chat_tok) -> None:
    # It took the unk id (0 = <|endoftext|> for SmolLM2) for <|/call|> and <|eos|>: turns never
    # stopped on the format's markers, every trajectory ran to the token limit, reward ~0.
    assert chat_tok.convert_tokens_to_ids("<|/call|>") == chat_tok.unk_token_id
    with pytest.raises(
        ValueError, match=r"stop token '<\|/call\|>' is not a single token .*prompt_format=chatml"
    ):
        loop(ArithmeticEnv(), chat_tok)


def test_the_agent_loop_takes_each_formats_own_stop_tokens(markers_tok, chat_tok) -> None:
    env = ArithmeticEnv()
    assert loop(env, markers_tok).stop_ids == [markers_tok.convert_tokens_to_ids(t) for t in env.stop_tokens]
    assert ChatmlEnv.stop_tokens == (IM_END, ENDOFTEXT)
    assert loop(ChatmlEnv(), chat_tok).stop_ids == [2, 0]


def test_the_unk_token_itself_is_a_valid_stop_token(chat_tok, markers_tok) -> None:
    # SmolLM2's unk token is <|endoftext|>, a chatml stop token: the greedy loop's old check refused
    # every id equal to the unk id, so it refused chatml's stop tokens.
    assert single_token_id(chat_tok, ENDOFTEXT) == 0
    assert single_token_id(markers_tok, "<|unk|>") == markers_tok.unk_token_id
    for missing in ("<|/call|><|eos|>", "<|im_end|>"):
        with pytest.raises(ValueError, match="not a single token"):
            single_token_id(markers_tok, missing)
