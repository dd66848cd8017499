"""Decoupled PPO (AReaL): clip around the proximal policy, weight by proximal / behaviour."""

import math

import pytest
import torch

from libra_core.training.losses import ppo_clip_loss

LN = math.log

# One trajectory, A = +1, T = 3, all tokens trained, clip_eps = 0.2.
# The behaviour policy that generated the tokens is stale; the proximal policy (start of the update)
# gives each token a higher probability: w = p_prox / p_behav = [2, 0.5, 1].
# The current policy's ratio to the proximal policy: r = [1.0, 1.5, 0.5].
#   t0: w 2.0,  min(1.0, 1.0)  = 1.0  -> -2.0
#   t1: w 0.5,  min(1.5, 1.2)  = 1.2  -> -0.6 (clipped, no gradient)
#   t2: w 1.0,  min(0.5, 0.5)  = 0.5  -> -0.5 (below 1-eps but A > 0: unclipped branch is the min)
# loss = (-2.0 - 0.6 - 0.5) / 3 = -3.1 / 3
# With the old (coupled) loss, the ratio is to the behaviour policy: r_b = r * w = [2.0, 0.75, 0.5]
#   -> min(2.0, 1.2) = 1.2, min(0.75, 0.75) = 0.75, 0.5 -> loss -(1.2 + 0.75 + 0.5) / 3 = -2.45 / 3:
#   the stale token t0 would be clipped (no gradient) although the proximal policy barely moved.
BEHAVIOUR = torch.tensor([[-2.0, -1.0, -1.5]])
W = torch.tensor([[2.0, 0.5, 1.0]])
PROXIMAL = BEHAVIOUR + torch.log(W)
RATIOS = torch.tensor([[1.0, 1.5, 0.5]])
MASK = torch.ones(1, 3, dtype=torch.int8)
ADV = torch.tensor([1.0])


def _current() -> torch.Tensor:
    return (PROXIMAL + torch.log(RATIOS)).requires_grad_(True)


def test_decoupled_loss_hand_computed() -> None:
    logprobs = _current()
    loss, metrics = ppo_clip_loss(logprobs, BEHAVIOUR, ADV, MASK, clip_eps=0.2, proximal_logprobs=PROXIMAL)
    assert loss.item() == pytest.approx(-3.1 / 3, abs=1e-6)
    assert metrics["behavior_weight_mean"] == pytest.approx(3.5 / 3, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    loss.backward()
    # d/dlogp of -w * r * A / N on unclipped tokens: t0 -2 * 1.0 / 3, t1 clipped 0, t2 -1 * 0.5 / 3
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-2.0 / 3, 0.0, -0.5 / 3]]))

    coupled, _ = ppo_clip_loss(_current(), BEHAVIOUR, ADV, MASK, clip_eps=0.2)
    assert coupled.item() == pytest.approx(-2.45 / 3, abs=1e-6)


def test_weight_cap_truncates() -> None:
    # cap 1.5: w = [1.5, 0.5, 1.0] -> loss -(1.5 + 0.6 + 0.5) / 3
    loss, _ = ppo_clip_loss(
        _current(), BEHAVIOUR, ADV, MASK, clip_eps=0.2, proximal_logprobs=PROXIMAL, behavior_weight_cap=1.5
    )
    assert loss.item() == pytest.approx(-2.6 / 3, abs=1e-6)


def test_zero_staleness_equals_on_policy_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    behaviour = -torch.rand(4, 7, generator=gen) * 3
    current = (behaviour + 0.3 * torch.randn(4, 7, generator=gen)).requires_grad_(True)
    mask = (torch.rand(4, 7, generator=gen) > 0.2).to(torch.int8)
    adv = torch.randn(4, generator=gen)
    on_policy, m1 = ppo_clip_loss(current, behaviour, adv, mask, clip_eps=0.2)
    (g1,) = torch.autograd.grad(on_policy, current)
    decoupled, m2 = ppo_clip_loss(
        current,
        behaviour,
        adv,
        mask,
        clip_eps=0.2,
        proximal_logprobs=behaviour.clone(),
        behavior_weight_cap=5.0,
    )
    (g2,) = torch.autograd.grad(decoupled, current)
    assert decoupled.item() == on_policy.item()
    torch.testing.assert_close(g1, g2, rtol=0, atol=0)
    assert m2["behavior_weight_mean"] == 1.0
    assert m1["clip_fraction"] == m2["clip_fraction"]


def test_an_uncapped_behaviour_weight_stays_finite() -> None:
    # proximal / behaviour for a token sampled at probability e^-95: exp(94) overflows float32.
    # Uncapped, the weight was inf and the loss NaN (0 x inf on the row kept for the KL term).
    from libra_core.training.losses import MAX_LOG_RATIO

    lp = torch.full((2, 2), -1.0, requires_grad=True)
    behaviour = torch.tensor([[-1.0, -95.0], [-1.0, -95.0]])
    proximal = torch.full((2, 2), -1.0)
    loss, metrics = ppo_clip_loss(
        lp,
        behaviour,
        torch.tensor([1.0, 0.0]),
        torch.ones(2, 2),
        clip_eps=0.2,
        proximal_logprobs=proximal,
        behavior_weight_cap=None,
        ref_logprobs=proximal,
        kl_coef=0.1,
    )
    assert math.isfinite(loss.item())
    # Ratio 1 everywhere; the first row's advantage 1 weighs its two tokens by 1 and by e^20 (the
    # bound), over the 2 tokens with an advantage; the KL to an equal reference is 0.
    expected = -(1.0 + math.exp(MAX_LOG_RATIO)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
