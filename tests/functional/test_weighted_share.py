"""One client's float64 share of a weighted sum travels as float32 entries and a weight and is rebuilt to the bit."""

from __future__ import annotations

import pytest
import torch

from lightning_fed.functional.weighted_share import share_as_float32, share_from_float32


def _entries(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "lora_A": torch.randn(8, 64, generator=generator) * scale,
        "lora_B": torch.randn(64, 8, generator=generator) * scale * 1e-3,
    }


@pytest.mark.parametrize("weight", [1.0, 0.5, 1 / 3, 0.1234567891234, 7 / 1000, 1e-6])
@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e30])
def test_a_single_clients_share_is_rebuilt_bit_for_bit_from_its_float32_entries(weight, scale):
    entries = _entries(0, scale)
    # The share as FedAvg's update accumulates it: float64 zeros plus the weight times the float32 entries.
    share = {
        name: torch.zeros(t.shape, dtype=torch.float64).add_(t.double(), alpha=weight) for name, t in entries.items()
    }
    recovered = share_as_float32(share, weight)
    assert recovered is not None
    for name, entry in recovered.items():
        assert entry.dtype == torch.float32 and torch.equal(entry, entries[name]), name
    for name, rebuilt in share_from_float32(recovered, weight).items():
        assert rebuilt.dtype == torch.float64 and torch.equal(rebuilt, share[name]), name


def test_a_share_that_is_not_one_clients_float32_entries_travels_as_it_is():
    first, second = _entries(0), _entries(1)
    # Two clients' shares added in float64 are no float32 tensor times the total weight.
    two = {
        n: torch.zeros(t.shape, dtype=torch.float64).add_(t, alpha=0.3).add_(second[n], alpha=0.7)
        for n, t in first.items()
    }
    assert share_as_float32(two, 1.0) is None
    # Float64 values that float32 cannot hold, a zero weight (every client rejected) and a non-finite one.
    fine = {"w": torch.tensor([1.0 + 2.0**-40], dtype=torch.float64)}
    assert share_as_float32(fine, 1.0) is None
    assert share_as_float32({"w": torch.zeros(3, dtype=torch.float64)}, 0.0) is None
    assert share_as_float32({"w": torch.ones(3, dtype=torch.float64)}, float("nan")) is None
    assert share_as_float32({"w": torch.ones(3, dtype=torch.float32)}, 1.0) is None
