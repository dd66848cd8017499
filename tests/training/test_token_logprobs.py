import torch

from libra_core.training.logprobs import token_logprobs
from tests.training.builders import VOCAB_SIZE, tiny_qwen2


def _direct(model: torch.nn.Module, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 on one unpadded sequence, by full log_softmax and indexing."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[None]).logits[0].double() / temperature, dim=-1)
    return torch.stack([logp[t - 1, ids[t]] for t in range(1, len(ids))]).float()


def test_matches_direct_computation_with_right_padding():
    model = tiny_qwen2(seed=1)
    gen = torch.Generator().manual_seed(0)
    full = torch.randint(1, VOCAB_SIZE, (7,), generator=gen)
    short = torch.randint(1, VOCAB_SIZE, (4,), generator=gen)
    input_ids = torch.zeros(2, 7, dtype=torch.long)
    input_ids[0], input_ids[1, :4] = full, short
    attention_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])

    out = token_logprobs(model, input_ids, attention_mask)

    assert out.shape == (2, 6) and out.dtype == torch.float32
    torch.testing.assert_close(out[0], _direct(model, full), atol=1e-5, rtol=1e-5)
    # The padded row's real positions must equal the same sequence scored alone (padding is invisible).
    torch.testing.assert_close(out[1, :3], _direct(model, short), atol=1e-5, rtol=1e-5)
    assert (out <= 0).all()


def test_gradient_reaches_the_output_head():
    model = tiny_qwen2(seed=2)
    ids = torch.randint(0, VOCAB_SIZE, (2, 5), generator=torch.Generator().manual_seed(1))
    token_logprobs(model, ids, torch.ones_like(ids)).sum().backward()
    grad = model.lm_head.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_scores_the_distribution_sampled_at_the_rollout_temperature():
    # The engine samples from softmax(logits / T) and reports that log-prob; the trainer must too.
    model = tiny_qwen2(seed=3)
    ids = torch.randint(1, VOCAB_SIZE, (6,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cold = token_logprobs(model, ids[None], torch.ones(1, 6), temperature=0.7)[0]
        plain = token_logprobs(model, ids[None], torch.ones(1, 6))[0]
        greedy = token_logprobs(model, ids[None], torch.ones(1, 6), temperature=0.0)[0]
    torch.testing.assert_close(cold, _direct(model, ids, 0.7), atol=1e-5, rtol=1e-5)
    assert (cold - plain).abs().max() > 1e-3  # a different distribution
    torch.testing.assert_close(greedy, plain)  # greedy decoding reports the plain logits
