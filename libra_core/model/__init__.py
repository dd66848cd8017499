"""The policy model: locally trained tokenizer, tiny Qwen2 build/save, SFT warm-up, initial policy.

Heavy imports (torch, transformers) happen inside the functions, so importing this package is cheap.
"""

from libra_core.model.policy import build_tiny_policy, count_parameters, replace_dir, save_policy
from libra_core.model.prepare import PreparedPolicy, cache_key, prepare_initial_policy
from libra_core.model.sft import (
    SegmentEncoder,
    collate,
    greedy_accuracy,
    greedy_answers,
    lr_at,
    masked_nll,
    sft_warmup,
)
from libra_core.model.tokenizer import UNK_TOKEN, train_tokenizer

__all__ = [
    "UNK_TOKEN",
    "PreparedPolicy",
    "SegmentEncoder",
    "build_tiny_policy",
    "cache_key",
    "collate",
    "count_parameters",
    "greedy_accuracy",
    "greedy_answers",
    "lr_at",
    "masked_nll",
    "prepare_initial_policy",
    "replace_dir",
    "save_policy",
    "sft_warmup",
    "train_tokenizer",
]
