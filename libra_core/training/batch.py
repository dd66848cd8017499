"""Turn a trajectory table into padded training tensors, and split it into minibatches.

Called by the update stage once per iteration, after advantages are computed. The one subtle part is
alignment: the response token at response index j sits at sequence position len(prompt) + j, and
`token_logprobs` scores position p at output column p - 1, so its loss-mask and behaviour log-prob go
to column len(prompt) + j - 1. Prompt tokens and padding get loss-mask 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch


@dataclass
class TrainBatch:
    """Padded tensors for B trajectories of at most T tokens (prompt + response).

    input_ids [B, T] int64, right-padded; attention_mask [B, T] int64 (1 real token, 0 padding);
    loss_mask [B, T-1] float32 and behavior_logprobs [B, T-1] float32, both aligned with the output of
    `token_logprobs` (column t-1 scores token t); advantages [B] float32; proximal_logprobs [B, T-1]
    (the policy at the start of the update, for decoupled PPO) or None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    advantages: torch.Tensor
    proximal_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        b, t = self.input_ids.shape
        assert self.attention_mask.shape == (b, t), (
            f"attention_mask {tuple(self.attention_mask.shape)} != {(b, t)}"
        )
        for name in ("loss_mask", "behavior_logprobs", "proximal_logprobs"):
            if getattr(self, name) is None:
                continue
            shape = tuple(getattr(self, name).shape)
            assert shape == (b, t - 1), f"{name} {shape} must be {(b, t - 1)}"
        assert tuple(self.advantages.shape) == (b,), (
            f"advantages {tuple(self.advantages.shape)} must be {(b,)}"
        )

    @property
    def num_tokens(self) -> int:
        """Trained (loss-mask 1) tokens in the batch."""
        return int(self.loss_mask.sum().item())

    def select(self, indices: np.ndarray | list[int]) -> TrainBatch:
        """Rows `indices`, with padding columns that no selected row uses trimmed off (at least 2 kept)."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        attention = self.attention_mask[idx]
        width = max(int(attention.sum(dim=1).max().item()) if len(idx) else 0, 2)
        return TrainBatch(
            input_ids=self.input_ids[idx, :width],
            attention_mask=attention[:, :width],
            loss_mask=self.loss_mask[idx, : width - 1],
            behavior_logprobs=self.behavior_logprobs[idx, : width - 1],
            advantages=self.advantages[idx],
            proximal_logprobs=None
            if self.proximal_logprobs is None
            else self.proximal_logprobs[idx, : width - 1],
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            behavior_logprobs=self.behavior_logprobs.to(device),
            advantages=self.advantages.to(device),
            proximal_logprobs=None if self.proximal_logprobs is None else self.proximal_logprobs.to(device),
        )


def build_batch(table: pa.Table, advantages: np.ndarray, pad_id: int) -> TrainBatch:
    """Build a TrainBatch from a validated trajectory table and its per-row advantages ([N]).

    `pad_id` fills positions past each sequence's end; it is never attended to or trained on, but must
    be a valid token id for the model's embedding. T is the longest prompt + response in the table.
    """
    prompts = table.column("prompt_ids").to_pylist()
    responses = table.column("response_ids").to_pylist()
    masks = table.column("loss_mask").to_pylist()
    behaviour = table.column("behavior_logprobs").to_pylist()
    adv = np.asarray(advantages, dtype=np.float32)
    n = table.num_rows
    if adv.shape != (n,):
        raise ValueError(f"advantages has shape {adv.shape}; expected ({n},), one per trajectory row")
    width = max([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)] + [2])

    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    loss_mask = np.zeros((n, width - 1), dtype=np.float32)
    behavior = np.zeros((n, width - 1), dtype=np.float32)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        p, r = len(prompt), len(response)
        input_ids[i, :p] = prompt
        input_ids[i, p : p + r] = response
        attention[i, : p + r] = 1
        # Response token j is at position p + j and is scored in column p + j - 1 (p >= 1 by schema).
        loss_mask[i, p - 1 : p - 1 + r] = masks[i]
        behavior[i, p - 1 : p - 1 + r] = behaviour[i]
    return TrainBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention),
        loss_mask=torch.from_numpy(loss_mask),
        behavior_logprobs=torch.from_numpy(behavior),
        advantages=torch.from_numpy(adv),
    )


def split_minibatches(
    n: int, k: int, rng: np.random.Generator, groups: np.ndarray | None = None
) -> list[np.ndarray]:
    """Shuffle row indices 0..n-1 with `rng` and split them into at most k parts of near-equal size.

    Every index appears exactly once; no part is empty (so with fewer rows than k there are fewer
    optimizer steps than asked). Returns [] when n == 0.

    With `groups` (one label per row, e.g. the GRPO prompt group), each group's rows stay together in
    one part: groups are shuffled and dealt whole, each to the part with the fewest rows so far, into
    min(k, number of groups) parts. The tokens a group's members share (a common prefix) then get
    one net push, the sum of their advantages (zero with `negative_weight` 1); split apart, one step
    would push that prefix up and a later one push it down.
    """
    if k < 1:
        raise ValueError(f"minibatches must be >= 1, got {k}")
    if n <= 0:
        return []
    if groups is None:
        order = rng.permutation(n)
        return [part for part in np.array_split(order, min(k, n))]
    labels = np.asarray(groups)
    if labels.shape != (n,):
        raise ValueError(f"groups has shape {labels.shape}; expected ({n},), one label per row")
    unique, inverse = np.unique(labels, return_inverse=True)
    members = [np.flatnonzero(inverse == g) for g in range(len(unique))]
    parts: list[list[np.ndarray]] = [[] for _ in range(min(k, len(unique)))]
    sizes = np.zeros(len(parts), dtype=np.int64)
    for g in rng.permutation(len(unique)):
        target = int(np.argmin(sizes))  # ties go to the first part
        parts[target].append(rng.permutation(members[g]))
        sizes[target] += len(members[g])
    return [np.concatenate(part) for part in parts]


def spread_groups(
    parts: list[np.ndarray], rows: np.ndarray, labels: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Add `rows` (indices in no part; `labels[i]` is row i's group) to the existing `parts`: their
    groups are shuffled with `rng` and dealt whole, round-robin, so no new part is made.

    The update passes its zero-advantage rows here when the KL term needs their tokens: they ride
    along in the steps the rows with signal set, since a part of them alone would be an optimizer
    step with no policy gradient that Adam's momentum still moves the weights on. Each part keeps
    its own rows first. Returns `parts` unchanged when `rows` is empty.
    """
    rows, labels = np.asarray(rows), np.asarray(labels)
    if labels.shape != rows.shape:
        raise ValueError(f"labels has shape {labels.shape}; expected {rows.shape}, one label per row")
    if len(rows) == 0:
        return list(parts)
    assert parts, "spread_groups needs at least one part to add rows to"
    unique, inverse = np.unique(labels, return_inverse=True)
    extra: list[list[np.ndarray]] = [[] for _ in parts]
    for j, g in enumerate(rng.permutation(len(unique))):
        extra[j % len(parts)].append(rows[inverse == g])
    return [np.concatenate([part, *more]) for part, more in zip(parts, extra, strict=True)]
