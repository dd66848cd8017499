"""Character-level BPE tokenizer trained locally with `tokenizers` for the tiny policy.

Built once per run by `prepare_initial_policy` from the environment's corpus and saved next to the
weights, so transformers (training) and vLLM (rollout) read the same `tokenizer.json`.

Why the shape is what it is:
- Digits are always single tokens (numbers are read and written digit by digit); a merge such as
  "12" would make carries and multiplication much harder for a sub-million-parameter model.
- Every non-letter character is its own pre-token, so BPE merges can only join runs of letters
  (which appear in tool error messages, never in what the model is trained to write).
- Environment markers (`<|call|>`, ...) are added special tokens: extracted before
  pre-tokenisation, so they are atomic and no merge ever crosses them. That makes
  `encode(a + b) == encode(a) + encode(b)` whenever `b` starts with a special token, which the agent
  loop relies on when it appends observation tokens without re-tokenising earlier turns.
- No normalizer and a `Fuse` decoder: decoding reproduces the text exactly.
- No post-processor: nothing (no BOS) is prepended, so `encode(prompt)` in transformers and in vLLM
  yields exactly the ids the policy was trained on.

`single_token_id` resolves an environment's stop tokens in any policy's tokenizer (this one or a
pretrained model's), refusing one that is not in its vocabulary.
"""

from __future__ import annotations

import re
import string
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

UNK_TOKEN = "<|unk|>"
"""Stands for characters the corpus never showed (e.g. an unusual tool error); BPE would otherwise
drop them silently."""

# Letter runs stay together (mergeable); any other single character is a pre-token on its own.
_PRE_TOKEN_PATTERN = r"\p{L}+|[\s\S]"
# Always in the alphabet, whatever the corpus happens to contain.
_BASE_ALPHABET = tuple(string.digits) + ("+", "-", "*", "(", ")", " ")


def train_tokenizer(
    corpus: list[str], special_tokens: tuple[str, ...], vocab_size: int
) -> PreTrainedTokenizerFast:
    """Train a character-level BPE tokenizer on `corpus`.

    `special_tokens` must contain `<|eos|>` and `<|pad|>`; they get ids 0..n-1 in the given order
    (then `<|unk|>`), followed by the alphabet and the letter merges. `vocab_size` is an upper
    bound: the full alphabet is always kept even if that exceeds it, and the result can be smaller
    when the corpus offers fewer merges.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    missing = [t for t in ("<|eos|>", "<|pad|>") if t not in special_tokens]
    if missing:
        raise ValueError(
            f"special_tokens {special_tokens!r} lack {missing}; the policy needs eos and pad tokens"
        )
    if not corpus:
        raise ValueError("corpus is empty; pass the environment's corpus (env.corpus(n, seed))")
    specials = list(dict.fromkeys((*special_tokens, UNK_TOKEN)))

    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(_PRE_TOKEN_PATTERN), behavior="isolated")
    backend.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=list(_BASE_ALPHABET),
        show_progress=False,
    )
    # The trainer does not extract added tokens from its input, so markers are cut out first;
    # otherwise merges would be spent on fragments such as "<|" or "result".
    marker = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
    pieces = (piece for text in corpus for piece in marker.split(text) if piece)
    backend.train_from_iterator(pieces, trainer=trainer)
    # The trainer registers `specials` as added special tokens: atomic, never normalised or split.

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        # No BOS exists in the task's protocol; eos doubles as bos (GPT-2 style) so loaders that
        # insist on one find it, and no post-processor ever inserts it.
        bos_token="<|eos|>",
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )


class TokenLookup(Protocol):
    """What `single_token_id` needs of a tokenizer (transformers' tokenizers have it)."""

    @property
    def unk_token(self) -> Any: ...
    @property
    def unk_token_id(self) -> Any: ...
    def convert_tokens_to_ids(self, tokens: str) -> Any: ...


def single_token_id(tokenizer: TokenLookup, token: str) -> int:
    """The id of `token` if it is one token of `tokenizer`'s vocabulary, else a ValueError.

    Called for each of the environment's stop tokens by the agent loop (once per rollout stage) and
    the greedy warm-up check. `convert_tokens_to_ids` does not refuse a token missing from the
    vocabulary: it returns the unk id (SmolLM2: `<|endoftext|>`, id 0) or None, and a turn would then
    never stop on it. The unk token itself is a valid stop token (SmolLM2's chatml stops on it).
    """
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int) or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ValueError(
            f"stop token {token!r} is not a single token of the tokenizer, so model turns would never "
            "end on it: the environment's prompt_format does not match the model's tokenizer (a "
            "pretrained chat model such as SmolLM2 needs environment.prompt_format=chatml; the "
            "`markers` format needs a tokenizer with the markers as special tokens, such as the one "
            "model.type=tiny_qwen2 trains)"
        )
    return token_id
