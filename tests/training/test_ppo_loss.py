import math

import pytest
import torch

from libra_core.training.losses import ppo_clip_loss

LN = math.log

# Two trajectories, T = 3, clip_eps = 0.2 (ratios clipped to [0.8, 1.2]).
# Trajectory 0, A = +1, mask [1, 1, 0]:
#   t0 ratio 1.0 -> min(1.0, 1.0) = 1.0           -> loss -1.0
#   t1 ratio 1.5 -> min(1.5, 1.2) = 1.2 (clipped) -> loss -1.2
#   t2 masked (ratio 10, would dominate if counted)
# Trajectory 1, A = -2, mask [1, 1, 1]:
#   t0 ratio 0.5 -> min(-1.0, 0.8 * -2 = -1.6) = -1.6 (clipped) -> loss 1.6
#   t1 ratio 1.1 -> min(-2.2, -2.2) = -2.2                      -> loss 2.2
#   t2 ratio 1.5 -> min(-3.0, 1.2 * -2 = -2.4) = -3.0 (unclipped, pessimistic) -> loss 3.0
# Token mean over the 5 masked tokens: (-1.0 - 1.2 + 1.6 + 2.2 + 3.0) / 5 = 4.6 / 5 = 0.92.
# clip_fraction = 2 / 5 = 0.4; ratio_mean = (1 + 1.5 + 0.5 + 1.1 + 1.5) / 5 = 1.12.
# approx_kl = mean(r - 1 - ln r) = (0 + 0.0945349 + 0.1931472 + 0.0046898 + 0.0945349) / 5 = 0.0773814.
BEHAVIOUR = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.0, -1.5]])
RATIOS = torch.tensor([[1.0, 1.5, 10.0], [0.5, 1.1, 1.5]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.int8)
ADV = torch.tensor([1.0, -2.0])


def _logprobs() -> torch.Tensor:
    return (BEHAVIOUR + torch.log(RATIOS)).requires_grad_(True)


def test_hand_computed_loss_and_metrics():
    logprobs = _logprobs()
    loss, metrics = ppo_clip_loss(logprobs, BEHAVIOUR, ADV, MASK, clip_eps=0.2)
    assert loss.item() == pytest.approx(0.92, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(0.92, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.4)
    assert metrics["ratio_mean"] == pytest.approx(1.12, abs=1e-6)
    assert metrics["approx_kl"] == pytest.approx(0.0773814, abs=1e-6)
    assert metrics["num_tokens"] == 5
    assert "kl_ref" not in metrics


def test_gradient_zero_on_clipped_and_masked_tokens():
    # d loss / d logp = -A * ratio / N on unclipped tokens (N = 5), 0 on clipped and masked ones:
    # traj 0: t0 -1 * 1.0 / 5 = -0.2; t1 clipped 0; t2 masked 0.
    # traj 1: t0 clipped 0; t1 2 * 1.1 / 5 = 0.44; t2 2 * 1.5 / 5 = 0.6.
    logprobs = _logprobs()
    loss, _ = ppo_clip_loss(logprobs, BEHAVIOUR, ADV, MASK, clip_eps=0.2)
    loss.backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.2, 0.0, 0.0], [0.0, 0.44, 0.6]]))


def test_kl_to_reference():
    # ref - logp: traj 0 [0, ln 2, ln 5 (masked)], traj 1 [-ln 2, 0, 0].
    # k3 = e^d - d - 1: d = ln 2 -> 2 - ln 2 - 1 = 0.3068528; d = -ln 2 -> 0.5 + ln 2 - 1 = 0.1931472.
    # Sum 0.5 over 5 tokens -> kl_ref = 0.1; loss = 0.92 + 0.1 * 0.1 = 0.93.
    logprobs = _logprobs()
    ref = logprobs.detach() + torch.tensor([[0.0, LN(2), LN(5)], [-LN(2), 0.0, 0.0]])
    loss, metrics = ppo_clip_loss(logprobs, BEHAVIOUR, ADV, MASK, clip_eps=0.2, ref_logprobs=ref, kl_coef=0.1)
    assert metrics["kl_ref"] == pytest.approx(0.1, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(0.92, abs=1e-6)
    assert loss.item() == pytest.approx(0.93, abs=1e-6)


def test_masked_positions_cannot_poison_the_loss():
    # Padding with absurd values (behaviour +inf-like, logp -inf) must not produce NaN loss or grads.
    logprobs = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, 50.0]])
    loss, metrics = ppo_clip_loss(
        logprobs, behaviour, torch.tensor([1.0]), torch.tensor([[1, 0]]), clip_eps=0.2
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_no_masked_tokens_gives_zero_loss():
    loss, metrics = ppo_clip_loss(
        torch.zeros(1, 2, requires_grad=True),
        torch.zeros(1, 2),
        torch.ones(1),
        torch.zeros(1, 2),
        clip_eps=0.2,
    )
    assert loss.item() == 0.0 and loss.requires_grad
    assert metrics["num_tokens"] == 0


def test_zero_advantage_rows_do_not_dilute_the_policy_gradient():
    # A group whose rewards are all equal has A = 0. The update stage drops those rows when kl_coef
    # is 0 and keeps them for the KL term otherwise; the policy-gradient term must be the same
    # either way (before, a kl_coef of 1e-12 scaled it by the share of tokens with an advantage).
    logprobs = _logprobs()
    plain, plain_metrics = ppo_clip_loss(logprobs, BEHAVIOUR, ADV, MASK, clip_eps=0.2)
    plain.backward()
    assert plain_metrics["pg_tokens"] == 5
    zero_row = torch.tensor([[-0.3, -0.7, -0.2]])
    padded = torch.cat([logprobs.detach(), zero_row]).requires_grad_(True)
    loss, metrics = ppo_clip_loss(
        padded,
        torch.cat([BEHAVIOUR, zero_row - 0.5]),
        torch.cat([ADV, torch.zeros(1)]),
        torch.cat([MASK, torch.ones(1, 3, dtype=torch.int8)]),
        clip_eps=0.2,
        ref_logprobs=padded.detach(),  # the reference equals the policy: the KL term is 0
        kl_coef=1e-12,
    )
    loss.backward()
    assert metrics["pg_loss"] == pytest.approx(0.92, abs=1e-6) and metrics["pg_tokens"] == 5
    assert metrics["num_tokens"] == 8
    assert padded.grad is not None and logprobs.grad is not None
    torch.testing.assert_close(padded.grad[:2], logprobs.grad)
    assert torch.count_nonzero(padded.grad[2]) == 0


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_a_token_far_off_its_behaviour_probability_gives_finite_gradients(adv: float) -> None:
    # log-ratio 100 (a token sampled at behaviour log-prob -100): exp overflowed float32 to inf and
    # inf x 0 made the gradient NaN, so the whole update raised FloatingPointError over one token
    behaviour = torch.tensor([[-100.0, -1.0]])
    logprobs = torch.tensor([[0.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-100.0, -1.0]])  # and a reference that far below for the k3 term
    loss, metrics = ppo_clip_loss(
        logprobs,
        behaviour,
        torch.tensor([adv]),
        torch.ones(1, 2),
        clip_eps=0.2,
        ref_logprobs=ref,
        kl_coef=0.1,
    )
    loss.backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()
    assert math.isfinite(loss.item()) and math.isfinite(metrics["ratio_mean"])
    assert logprobs.grad[0, 0] == 0  # past the bound: no gradient through that token's ratio
    assert logprobs.grad[0, 1] != 0  # the ordinary token still learns


def test_token_counts_are_exact_with_bf16_logprobs():
    # bf16 holds integers exactly only up to 256: 1001 tokens were counted as 1000, the divisor of
    # the whole loss.
    logprobs = torch.full((1, 1001), -0.5, dtype=torch.bfloat16, requires_grad=True)
    _, metrics = ppo_clip_loss(
        logprobs, logprobs.detach(), torch.ones(1), torch.ones(1, 1001, dtype=torch.int8), clip_eps=0.2
    )
    assert metrics["num_tokens"] == 1001 and metrics["pg_tokens"] == 1001


def _k3(d: float) -> float:
    return math.exp(d) - d - 1.0


def test_kl_to_reference_is_a_mean_over_every_masked_token_not_only_the_advantage_ones():
    # The KL term covers zero-advantage rows too (the update stage keeps them for it), so its divisor
    # is every masked token (8), not the policy-gradient term's (5): dividing by pg_tokens
    # overweighted the KL by 8/5 whenever a group had equal rewards.
    logprobs = _logprobs()
    zero_row = torch.tensor([[-0.3, -0.7, -0.2]])
    padded = torch.cat([logprobs.detach(), zero_row]).requires_grad_(True)
    diffs = torch.tensor([[0.0, LN(2), LN(5)], [-LN(2), 0.0, 0.0], [LN(2), -LN(2), 0.0]])  # ref - logp
    loss, metrics = ppo_clip_loss(
        padded,
        torch.cat([BEHAVIOUR, zero_row - 0.5]),
        torch.cat([ADV, torch.zeros(1)]),
        torch.cat([MASK, torch.ones(1, 3, dtype=torch.int8)]),
        clip_eps=0.2,
        ref_logprobs=padded.detach() + diffs,
        kl_coef=0.1,
    )
    loss.backward()
    # k3 over the 8 masked tokens (traj 0's t2, ln 5, is masked out): sum 0.5 + 0.5 = 1.0.
    k3_sum = sum(_k3(d) for d in [0.0, LN(2), -LN(2), 0.0, 0.0, LN(2), -LN(2), 0.0])
    assert k3_sum == pytest.approx(1.0)
    assert metrics["num_tokens"] == 8 and metrics["pg_tokens"] == 5
    assert metrics["kl_ref"] == pytest.approx(k3_sum / 8, abs=1e-6)  # 0.125, not 1.0 / 5 = 0.2
    assert loss.item() == pytest.approx(0.92 + 0.1 * k3_sum / 8, abs=1e-6)
    # The zero-advantage row learns only from the KL: d(kl_coef * k3 / 8)/d logp = kl_coef * (1 - e^d) / 8.
    assert padded.grad is not None
    torch.testing.assert_close(padded.grad[2], torch.tensor([0.1 * (1 - 2) / 8, 0.1 * (1 - 0.5) / 8, 0.0]))


def test_the_log_ratio_saturates_at_20_not_beyond():
    # log pi/pi_old = 30 with A = -1: the unclipped branch is the pessimistic one, so the loss is the
    # bounded ratio e^20 itself, and the token gets no gradient (the clamp saturates). A bound of 40
    # left e^30 in the loss and a gradient of e^30 / 2 on that token.
    logprobs = torch.tensor([[0.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[-30.0, -1.0]])
    loss, metrics = ppo_clip_loss(logprobs, behaviour, torch.tensor([-1.0]), torch.ones(1, 2), clip_eps=0.2)
    loss.backward()
    e20 = math.exp(20.0)
    assert loss.item() == pytest.approx((e20 + 1.0) / 2, rel=1e-5)  # token 1: ratio 1, loss 1
    assert metrics["ratio_mean"] == pytest.approx((e20 + 1.0) / 2, rel=1e-5)
    assert metrics["approx_kl"] == pytest.approx((e20 - 1.0 - 20.0) / 2, rel=1e-5)
    assert metrics["clip_fraction"] == 0.0
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.5]]))  # -A * ratio / 2 on token 1


def test_the_reference_log_ratio_saturates_at_20_not_beyond():
    # ref - logp = 30 on token 0: k3 uses the bounded 20, e^20 - 20 - 1, with no gradient through it.
    logprobs = torch.tensor([[-30.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.0]])
    loss, metrics = ppo_clip_loss(
        logprobs,
        logprobs.detach(),
        torch.zeros(1),
        torch.ones(1, 2),
        clip_eps=0.2,
        ref_logprobs=ref,
        kl_coef=1.0,
    )
    loss.backward()
    assert metrics["kl_ref"] == pytest.approx(_k3(20.0) / 2, rel=1e-5)
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.zeros(1, 2))  # a bound of 40: (1 - e^30) / 2


def test_behavior_weight_mean_is_over_masked_tokens_only():
    # Decoupled PPO: w = exp(proximal - behaviour). Masked tokens have w = 2 and 4; the masked-out
    # token (a tool token) holds proximal - behaviour = ln 10 and the padding ln 100, which must not
    # count: the mean is (2 + 4) / 2 = 3 (over all positions it was (2 + 4 + 1 + 1) / 4 = 2, or
    # 8 / 2 = 4 with the masked divisor, or 18 with the raw values).
    behaviour = torch.tensor([[-1.0, -2.0, -3.0, -1.0]])
    proximal = behaviour + torch.tensor([[LN(2), LN(4), LN(10), LN(100)]])
    logprobs = proximal.clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 0, 0]], dtype=torch.int8)
    loss, metrics = ppo_clip_loss(
        logprobs, behaviour, torch.ones(1), mask, clip_eps=0.2, proximal_logprobs=proximal
    )
    assert metrics["behavior_weight_mean"] == pytest.approx(3.0, abs=1e-5)
    assert metrics["num_tokens"] == 2
    assert loss.item() == pytest.approx(-3.0, abs=1e-5)  # ratio 1 vs proximal: -(w * A) averaged
