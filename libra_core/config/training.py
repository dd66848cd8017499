"""The `training:` section of stages.yaml: optimizer, GRPO loss and batching, and the SFT warm-up.

Read by the update stage (`training/update.py`) and the warm-up (`model/sft.py`); part of
`LibraConfig` (config/models.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from libra_core.config.base import Frozen

# torch.optim.AdamW refuses others, but only at the first update (after the warm-up and a rollout).
AdamBeta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerConfig(Frozen):
    type: Literal["adamw"] = Field("adamw", description="Optimizer.")
    lr: float = Field(5e-5, gt=0, description="Learning rate.")
    betas: tuple[AdamBeta, AdamBeta] = Field(
        (0.9, 0.999), description="Adam betas (decay rates of the moment estimates), each in [0, 1)."
    )
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Max global grad norm.")
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="Linear lr warm-up over the first N RL optimizer steps (0: none). A fresh Adam's "
        "first steps move every weight by the full lr whatever the gradient's size.",
    )


class GRPOConfig(Frozen):
    group_size: int = Field(
        8, ge=2, description="Samples per prompt (G); advantages normalise within a group."
    )
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip epsilon.")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL penalty to the reference (SFT) policy."
    )
    minibatches: int = Field(
        4,
        ge=1,
        description="Optimizer steps per iteration, at most: the rows with signal (a nonzero advantage "
        "and a policy token) are split into this many parts, fewer when there are fewer of them (of "
        "their prompt groups with `whole_groups`); zero-advantage rows kept for the KL term ride "
        "along in those steps and never add one.",
    )
    scale_by_std: bool = Field(True, description="Divide group-centred rewards by the group std.")
    negative_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Multiplier on negative advantages (1: plain GRPO; below 1 leans on reinforcing "
        "a group's better samples rather than pushing its worse ones down). 0 is not the limit of "
        "small values: the worse samples then carry no advantage, so their tokens leave the loss's "
        "divisor too (the tokens with an advantage) and each step on the better ones is larger by "
        "(all tokens) / (the better samples' tokens).",
    )
    whole_groups: bool = Field(
        True,
        description="Keep each prompt group inside one minibatch, so the tokens its samples share get "
        "one net push, the sum of their advantages (zero only with `negative_weight` 1), not a push "
        "up in one step and down in the next (false: rows are shuffled across minibatches).",
    )


class WarmupConfig(Frozen):
    """Supervised warm-up on generated demonstrations, so RL starts from a policy that sometimes wins.

    tiny_qwen2 only: hf_local and smollm2 policies skip the warm-up (libra_core/model/prepare.py)."""

    steps: int = Field(350, ge=0, description="tiny_qwen2 only: SFT optimizer steps (0 skips warm-up).")
    batch_size: int = Field(64, ge=1, description="tiny_qwen2 only: demonstrations per SFT step.")
    lr: float = Field(1e-3, gt=0, description="tiny_qwen2 only: SFT learning rate (cosine-decayed).")
    cache: bool = Field(
        True,
        description="tiny_qwen2 only: reuse a warm-up from `<output_dir>/.cache` with identical "
        "settings, seed, rollout limits and data file contents. smollm2 keeps its conversion cache "
        "there whatever this says.",
    )


class TrainingConfig(Frozen):
    backend: Literal["torch", "ddp", "deepspeed"] = Field(
        "torch",
        description="Training backend (libra_core/training/backends): torch (one process). ddp "
        "(torch.distributed) and deepspeed (ZeRO-1/2) are refused in an experiment until the update "
        "stage launches data-parallel ranks.",
    )
    device: Literal["cpu", "cuda", "auto"] = Field("auto", description="Device for the update stage.")
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="Optimizer of the RL update (not the SFT warm-up's)."
    )
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPO loss, grouping and batching.")
    warmup: WarmupConfig = Field(
        default_factory=WarmupConfig, description="tiny_qwen2 only: the SFT warm-up before RL."
    )
    threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads of the update stage on CPU (not the SFT warm-up, which "
        "keeps torch's default); 0 keeps torch's default in the sync pipeline and gives the trainer "
        "half of the cores in the async one (libra_core/pipeline/cpu_split.py).",
    )
