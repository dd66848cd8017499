"""Cost model against the Vidur operator profiles (skipped when ../shared/data is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_core.planner.calibration import (
    COMPUTE_PROFILES,
    NETWORK_PROFILES,
    error_rows,
    load_compute_samples,
    load_network_samples,
)
from libra_core.planner.specs import get_hardware

PROFILES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "profiles"
pytestmark = pytest.mark.skipif(not PROFILES.is_dir(), reason=f"Vidur profiles not found at {PROFILES}")
SPEC = {"A100": "A100-80G", "H100": "H100"}


@pytest.mark.parametrize("gpu", ["A100", "H100"])
def test_gemm_and_intra_node_collectives_within_tolerance(gpu: str) -> None:
    hw = get_hardware(SPEC[gpu])
    samples = [s for rel in COMPUTE_PROFILES[gpu] for s in load_compute_samples(PROFILES / rel)]
    samples += [s for rel in NETWORK_PROFILES[gpu] for s in load_network_samples(PROFILES / rel)]
    rows = {r.kind: r for r in error_rows(gpu, hw, samples)}
    assert rows["gemm"].median_ape < 0.15 and 0.85 < rows["gemm"].bias < 1.15
    assert rows["all_reduce_intra"].median_ape < 0.15
    assert rows["elementwise"].median_ape < 0.25
    assert rows["send_recv_intra"].median_ape < 0.15


def test_vidur_sizes_are_bytes() -> None:
    rows = load_network_samples(PROFILES / NETWORK_PROFILES["A100"][0])
    assert max(s.bytes_moved for s in rows) == 4096 * 8192 * 2  # max_collective_size fp16 elements x 2
