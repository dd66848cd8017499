from pathlib import Path

import pytest
import torch

from libra_core.training.checkpoint import (
    OPTIMIZER_FILE,
    load_optimizer_state,
    save_optimizer_state,
)


def _stepped_optimizer(shape: tuple[int, ...], lr: float) -> torch.optim.AdamW:
    param = torch.nn.Parameter(torch.ones(shape))
    optimizer = torch.optim.AdamW([param], lr=lr)
    param.grad = torch.full(shape, 0.5)
    optimizer.step()
    return optimizer


def test_optimizer_round_trip_keeps_config_hyperparameters(tmp_path: Path):
    save_optimizer_state(_stepped_optimizer((3,), lr=1e-3), tmp_path / "state")
    assert [p.name for p in (tmp_path / "state").iterdir()] == [OPTIMIZER_FILE]  # no temp file left

    fresh = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=5e-4)
    assert load_optimizer_state(fresh, tmp_path / "state", "cpu")
    assert fresh.param_groups[0]["lr"] == 5e-4  # the current config wins over the saved lr
    state = next(iter(fresh.state.values()))
    assert int(state["step"]) == 1
    torch.testing.assert_close(state["exp_avg"], torch.full((3,), 0.05))  # (1 - 0.9) * 0.5


def test_missing_state_is_not_an_error(tmp_path: Path):
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    assert not load_optimizer_state(optimizer, tmp_path / "nothing", "cpu")


def test_mismatched_state_is_refused(tmp_path: Path):
    save_optimizer_state(_stepped_optimizer((3,), lr=1e-3), tmp_path)
    other = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match="delete it"):
        load_optimizer_state(other, tmp_path, "cpu")
