"""Shared test settings (importable from tests as `tests.support`)."""

# A small but learnable setup: short SFT so tests start from a policy that sometimes succeeds.
TEST_OVERRIDES = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "model.head_dim=32",
    "model.intermediate_size=128",
    "training.warmup.steps=150",
    "training.warmup.batch_size=32",
    "training.warmup.lr=0.003",
    "environment.max_ops=3",
    "environment.warmup_early_answer_rate=0",  # full demonstrations: tests need successes early
    "rollout.prompts_per_iteration=4",
    "training.grpo.group_size=4",
    "eval.num_prompts=8",
    "eval.every=2",
]
