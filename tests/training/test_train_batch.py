import numpy as np
import pytest
import torch

from libra_core.data.schema import table_from_rows
from libra_core.training.batch import build_batch, split_minibatches, spread_groups


def _table(row):
    return table_from_rows(
        [
            # Response [7, 8, 9] at positions 2, 3, 4; token 8 is a tool token (mask 0, log-prob 0).
            row(
                prompt_ids=[5, 6],
                response_ids=[7, 8, 9],
                loss_mask=[1, 0, 1],
                behavior_logprobs=[-0.5, 0.0, -0.25],
                group_id="g",
                sample_index=0,
            ),
            # Response [4] at position 3.
            row(
                prompt_ids=[1, 2, 3],
                response_ids=[4],
                loss_mask=[1],
                behavior_logprobs=[-1.5],
                group_id="g",
                sample_index=1,
            ),
        ]
    )


def test_alignment(row):
    batch = build_batch(_table(row), np.array([0.5, -0.5]), pad_id=31)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 31]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # Column c scores token c + 1: row 0 response tokens 7, 8, 9 sit in columns 1, 2, 3; row 1's token 4 in 2.
    assert batch.loss_mask.tolist() == [[0, 1, 0, 1], [0, 0, 1, 0]]
    assert batch.behavior_logprobs.tolist() == [[0.0, -0.5, 0.0, -0.25], [0.0, 0.0, -1.5, 0.0]]
    assert batch.advantages.tolist() == [0.5, -0.5]
    assert batch.num_tokens == 3
    # The trained columns point at exactly the policy-generated response tokens.
    trained = batch.input_ids[:, 1:][batch.loss_mask.bool()].tolist()
    assert trained == [7, 9, 4]


def test_select_trims_padding(row):
    batch = build_batch(_table(row), np.array([0.5, -0.5]), pad_id=0)
    one = batch.select([1])
    assert one.input_ids.tolist() == [[1, 2, 3, 4]]
    assert one.loss_mask.tolist() == [[0, 0, 1]]
    assert one.behavior_logprobs.tolist() == [[0.0, 0.0, -1.5]]
    assert one.advantages.tolist() == [-0.5]
    both = batch.select(np.array([1, 0]))
    assert both.input_ids.shape == (2, 5) and both.input_ids[1].tolist() == [5, 6, 7, 8, 9]
    assert both.to("cpu").advantages.dtype == torch.float32


def test_split_minibatches():
    parts = split_minibatches(5, 2, np.random.default_rng(3))
    assert [len(p) for p in parts] == [3, 2]
    assert sorted(np.concatenate(parts).tolist()) == [0, 1, 2, 3, 4]
    again = split_minibatches(5, 2, np.random.default_rng(3))
    assert all((a == b).all() for a, b in zip(parts, again, strict=True))
    assert [len(p) for p in split_minibatches(2, 4, np.random.default_rng(0))] == [1, 1]
    assert split_minibatches(0, 2, np.random.default_rng(0)) == []


def test_split_minibatches_keeps_groups_whole():
    groups = np.array(["a", "b", "a", "c", "b", "d", "c", "d", "a", "e"])
    parts = split_minibatches(len(groups), 3, np.random.default_rng(5), groups)
    assert len(parts) == 3
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(groups)))
    owners = {g: {i for i, part in enumerate(parts) if g in set(groups[part])} for g in set(groups)}
    assert all(len(o) == 1 for o in owners.values()), owners  # no group is split across parts
    sizes = sorted(len(p) for p in parts)
    assert sizes[-1] - sizes[0] <= 3  # balanced up to one group (the largest has 3 rows)
    again = split_minibatches(len(groups), 3, np.random.default_rng(5), groups)
    assert all((a == b).all() for a, b in zip(parts, again, strict=True))
    # fewer groups than minibatches: one part per group
    assert len(split_minibatches(4, 8, np.random.default_rng(0), np.array(["x", "y", "x", "y"]))) == 2
    with pytest.raises(ValueError, match="one label per row"):
        split_minibatches(3, 2, np.random.default_rng(0), np.array(["x", "y"]))


def test_spread_groups_adds_whole_groups_to_the_existing_parts():
    parts = [np.array([0, 1]), np.array([2])]
    rows = np.array([3, 4, 5, 6, 7, 8, 9])
    labels = np.array(["x", "y", "x", "z", "y", "w", "x"])
    out = spread_groups(parts, rows, labels, np.random.default_rng(0))
    assert len(out) == 2  # no part of its own for the added rows
    assert sorted(np.concatenate(out).tolist()) == list(range(10))
    assert out[0][:2].tolist() == [0, 1] and out[1][:1].tolist() == [2]  # each part's own rows first
    by_row = dict(zip(rows.tolist(), labels.tolist(), strict=True))
    owners = {
        g: {i for i, part in enumerate(out) for r in part.tolist() if by_row.get(r) == g} for g in "wxyz"
    }
    assert all(len(o) == 1 for o in owners.values()), owners  # groups stay whole
    assert sorted(len({g for g, o in owners.items() if i in o}) for i in range(2)) == [2, 2]  # round-robin
    assert (
        spread_groups(parts, np.array([], dtype=np.int64), np.array([], dtype=str), np.random.default_rng(0))
        == parts
    )
    with pytest.raises(ValueError, match="one label per row"):
        spread_groups(parts, rows, labels[:3], np.random.default_rng(0))
