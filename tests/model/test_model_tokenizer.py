"""Tokenizer properties the policy and the agent loop rely on."""

from __future__ import annotations

import pytest

from libra_core.envs.arithmetic import SPECIAL_TOKENS, ArithmeticEnv
from libra_core.model.tokenizer import UNK_TOKEN, train_tokenizer


@pytest.fixture(scope="module")
def env() -> ArithmeticEnv:
    return ArithmeticEnv()


@pytest.fixture(scope="module")
def corpus(env: ArithmeticEnv) -> list[str]:
    return env.corpus(500, seed=0)


@pytest.fixture(scope="module")
def tok(corpus: list[str]):
    return train_tokenizer(corpus, SPECIAL_TOKENS, vocab_size=64)


def test_round_trip_on_whole_corpus(tok, corpus: list[str]) -> None:
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_distinct_ids(tok) -> None:
    ids = []
    for token in SPECIAL_TOKENS:
        encoded = tok.encode(token, add_special_tokens=False)
        assert encoded == [tok.convert_tokens_to_ids(token)], token
        ids.append(encoded[0])
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    assert ids[:2] == [0, 1]  # pad, eos in the order given
    assert (tok.pad_token, tok.eos_token) == ("<|pad|>", "<|eos|>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 1)


def test_digits_are_single_tokens(tok) -> None:
    for digit in "0123456789":
        assert len(tok.encode(digit, add_special_tokens=False)) == 1
    ids = tok.encode("-1234567890", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == list("-1234567890")
    multi_char_digits = [t for t in tok.get_vocab() if len(t) > 1 and any(c.isdigit() for c in t)]
    assert multi_char_digits == []


def test_letters_merge_within_words_only(tok, corpus: list[str]) -> None:
    error = corpus[-1]  # the calculator's usage message
    tokens = tok.convert_ids_to_tokens(tok.encode(error, add_special_tokens=False))
    assert len(tokens) < len(error) - 40  # merges shorten words ...
    assert all(" " not in t or t == " " for t in tokens)  # ... but never cross a space


def test_nothing_is_prepended(tok) -> None:
    prompt = "<|user|>(3+4)<|assistant|>"
    assert tok.encode(prompt) == tok.encode(prompt, add_special_tokens=False)
    assert tok.convert_ids_to_tokens(tok.encode(prompt)) == [
        "<|user|>",
        "(",
        "3",
        "+",
        "4",
        ")",
        "<|assistant|>",
    ]


def test_concatenation_at_special_token_boundary(tok, env: ArithmeticEnv) -> None:
    for problem in env.sample_problems(50, seed=1):
        segments = [s.text for s in env.demonstration(problem)]
        full = tok.encode("".join(segments), add_special_tokens=False)
        pieces = [i for s in segments for i in tok.encode(s, add_special_tokens=False)]
        assert full == pieces
        for cut in range(1, len(segments)):
            left, right = "".join(segments[:cut]), "".join(segments[cut:])
            assert full == tok.encode(left, add_special_tokens=False) + tok.encode(
                right, add_special_tokens=False
            )


def test_unknown_characters_become_unk_not_dropped(tok) -> None:
    ids = tok.encode("Q7", add_special_tokens=False)
    assert ids == [tok.convert_tokens_to_ids(UNK_TOKEN), tok.convert_tokens_to_ids("7")]


def test_vocab_size_is_an_upper_bound_beyond_the_alphabet(corpus: list[str]) -> None:
    small = train_tokenizer(corpus, SPECIAL_TOKENS, vocab_size=16)
    big = train_tokenizer(corpus, SPECIAL_TOKENS, vocab_size=80)
    assert len(small) < len(big) <= 80
    text = corpus[0]
    assert small.decode(small.encode(text), skip_special_tokens=False) == text


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="pad"):
        train_tokenizer(["1+2"], ("<|eos|>",), 64)
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer([], SPECIAL_TOKENS, 64)
