"""Per-token log-probabilities of a sequence under a causal LM, the quantity the policy loss needs.

Called by the update stage once per minibatch (with gradient) and, when a KL penalty is on, once per
minibatch on the frozen reference model (under `torch.no_grad`). Position t-1 of the output scores
token t given tokens < t, which is how `TrainBatch.loss_mask` and `behavior_logprobs` are aligned.

The distribution scored is the one the rollout sampled from: the logits divided by the sampling
temperature, as the engine reports them (vLLM's `--logprobs-mode processed_logprobs`,
`rollout/vllm_server.py`). Scored at temperature 1 while sampled at 0.7, the importance ratio and
the policy gradient would be those of a policy the rollout never ran.
"""

from __future__ import annotations

import torch


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Return float32 [B, T-1]: entry [b, t-1] = log p(input_ids[b, t] | input_ids[b, :t]).

    `input_ids` and `attention_mask` are [B, T], right-padded; values at padded positions are
    meaningless and must be masked by the caller. `model` is a Hugging Face causal LM (returns
    `.logits` [B, T, V]); it is called once, without a KV cache.

    Memory: the log-softmax over the vocabulary is never materialised as a second [B, T, V] tensor.
    We gather the target logit and subtract a logsumexp, one sequence at a time, so autograd keeps
    only the model's own logits plus [T] vectors per row; for low-precision models each row is upcast
    to float32 on its own rather than the whole batch at once.

    `temperature`: the rollout's sampling temperature; the logits are divided by it (0, greedy
    decoding, scores the plain logits, as the engine does).
    """
    assert input_ids.dim() == 2 and input_ids.shape == attention_mask.shape, (
        f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must be [B, T]"
    )
    assert input_ids.shape[1] >= 2, "need at least two positions to score a next token"
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    targets = input_ids[:, 1:]
    rows = []
    for b in range(logits.shape[0]):
        row = logits[b, :-1].float()  # [T-1, V]; no copy when the model is already float32
        if temperature > 0 and temperature != 1.0:
            row = row / temperature
        picked = row.gather(-1, targets[b].unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row, dim=-1))
    return torch.stack(rows)
