import numpy as np
import pytest

from libra_core.training.advantages import group_advantages, mixed_group_share

# Groups interleaved on purpose: a = rows 0, 2, 4; b = rows 1, 3; c = row 5 (a group of one).
GROUP_IDS = ["a", "b", "a", "b", "a", "c"]
REWARDS = np.array([1.0, 0.1, 0.0, 0.1, 0.5, 0.7])


def test_centred_without_std():
    # Group a: mean 0.5 -> [0.5, -0.5, 0.0]; b and c have no spread -> 0.
    adv = group_advantages(REWARDS, GROUP_IDS, scale_by_std=False)
    np.testing.assert_allclose(adv, [0.5, 0.0, -0.5, 0.0, 0.0, 0.0], atol=1e-12)


def test_scaled_by_population_std():
    # Group a: population variance = (0.25 + 0.25 + 0) / 3 = 1/6, std = 0.4082483 (ddof=1 would give 0.5),
    # so 0.5 / (0.4082483 + 1e-6) = 1.2247418.
    adv = group_advantages(REWARDS, GROUP_IDS, scale_by_std=True)
    expected = 0.5 / (np.sqrt(1 / 6) + 1e-6)
    np.testing.assert_allclose(adv, [expected, 0.0, -expected, 0.0, 0.0, 0.0], rtol=1e-9, atol=1e-12)
    assert expected == pytest.approx(1.2247418, rel=1e-6)


def test_zero_variance_group_is_exactly_zero():
    # 0.1 + 0.1 + 0.1 = 0.30000000000000004, so a naive mean leaves a ~1e-17 residue that std-scaling
    # would blow up to ~1e-11; the advantage must be exactly 0.
    adv = group_advantages(np.array([0.1, 0.1, 0.1]), ["g", "g", "g"], scale_by_std=True)
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_two_sample_group():
    # mean 0.5, std 0.5 -> +-0.5 / (0.5 + 1e-3) with a custom eps.
    adv = group_advantages(np.array([1.0, 0.0]), ["g", "g"], scale_by_std=True, eps=1e-3)
    np.testing.assert_allclose(adv, [0.5 / 0.501, -0.5 / 0.501])


def test_mixed_group_share():
    # Only group a (of a, b, c) has differing rewards.
    assert mixed_group_share(REWARDS, GROUP_IDS) == pytest.approx(1 / 3)
    assert mixed_group_share(np.array([]), []) == 0.0


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(np.array([1.0, 0.0]), ["g"], scale_by_std=True)
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(np.array([np.nan, 0.0]), ["g", "g"], scale_by_std=True)


def test_negative_weight_scales_only_negative_advantages() -> None:
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    groups = ["a", "a", "a", "a", "b", "b"]
    plain = group_advantages(rewards, groups, scale_by_std=False)
    np.testing.assert_allclose(plain[:4], [0.75, -0.25, -0.25, -0.25])
    leaned = group_advantages(rewards, groups, scale_by_std=False, negative_weight=0.2)
    np.testing.assert_allclose(leaned[:4], [0.75, -0.05, -0.05, -0.05])
    assert (leaned[4:] == 0.0).all()  # a uniform group still carries nothing
    scaled = group_advantages(rewards, groups, scale_by_std=True, negative_weight=0.5)
    expected = np.where(plain[:4] < 0, 0.5, 1.0) * plain[:4] / plain[:4].std()
    np.testing.assert_allclose(scaled[:4], expected, rtol=1e-4)  # eps=1e-6 in the denominator
    with pytest.raises(ValueError, match="negative_weight"):
        group_advantages(rewards, groups, scale_by_std=False, negative_weight=1.5)


def test_rewards_apart_only_by_rounding_are_one_value() -> None:
    # 0.1 + 0.2 is 0.30000000000000004: the group counted as mixed, its members got +-5.6e-11
    # advantages, stayed in training and inflated the policy-gradient divisor.
    noisy = np.array([0.1 + 0.2, 0.3, 0.3, 0.3, 1.0, 0.0])
    groups = ["n", "n", "n", "n", "m", "m"]
    adv = group_advantages(noisy, groups, scale_by_std=True)
    assert adv[:4].tolist() == [0.0] * 4
    assert adv[4] > 0 > adv[5]
    assert mixed_group_share(noisy, groups) == 0.5
    # a real difference, however small a reward scale uses, is still signal
    small = np.array([0.3, 0.3 + 1e-6])
    assert mixed_group_share(small, ["s", "s"]) == 1.0
