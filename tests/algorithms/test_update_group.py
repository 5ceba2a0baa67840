"""`Aggregator.update_group`, which folds a batched group's accepted updates at once, gives the aggregate of `update`
on each in turn; and `finite_rows`, the group's per-client finite check, agrees with `torch.isfinite`."""

import pytest
import torch
from typing_extensions import override

from lightning_fed import ClientStateStore, ClientUpdate, RoundContext
from lightning_fed.aggregators import FedAvg, FedAvgM, NormBound
from lightning_fed.functional.state_dict import all_finite, finite_rows

SIZES = {0: 7, 2: 13, 5: 30, 8: 1}


def _stacked(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Four clients' states stacked along dimension 0, as a batched group holds them."""
    generator = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(len(SIZES), 5, 3, generator=generator).to(dtype),
        "bn.running_mean": torch.randn(len(SIZES), 3, generator=generator).to(dtype),
        "bn.num_batches_tracked": torch.arange(len(SIZES)) + 10,
    }


def _global() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(5, 3), "bn.running_mean": torch.ones(3), "bn.num_batches_tracked": torch.tensor(0)}


def _updates(stacked: dict[str, torch.Tensor], accepted: list[int]) -> list[ClientUpdate]:
    ids = list(SIZES)
    return [ClientUpdate(ids[i], SIZES[ids[i]], 1, {n: t[i] for n, t in stacked.items()}) for i in accepted]


def _aggregate(aggregator, updates: list[ClientUpdate], grouped: bool) -> dict[str, torch.Tensor]:
    global_params = _global()
    round_ctx = RoundContext(0, list(SIZES), global_params, SIZES, ClientStateStore(), parameter_names=frozenset({"w"}))
    aggregator.reset(global_params, round_ctx)
    if grouped:
        aggregator.update_group(updates[:2])
        aggregator.update_group(updates[2:])
    else:
        for update in updates:
            aggregator.update(update)
    return aggregator.compute(global_params)


class ClippedFedAvg(FedAvg):
    """A FedAvg whose `update` changes the update: its group update must keep going through `update`."""

    @override
    def update(self, update: ClientUpdate) -> None:
        params = {n: t.clamp(-0.5, 0.5) if t.is_floating_point() else t for n, t in update.params.items()}
        super().update(ClientUpdate(update.client_id, update.num_samples, 1, params))


@pytest.mark.parametrize(
    "make",
    [
        FedAvg,
        lambda: FedAvg(weighting="uniform", server_lr=0.7),
        lambda: FedAvgM(momentum=0.9),
        ClippedFedAvg,
        lambda: NormBound(FedAvg(), max_norm=1.0),
    ],  # fmt: skip
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("accepted", [[0, 1, 2, 3], [3, 1, 0], [2]])
def test_update_group_is_bit_identical_to_update_on_each(make, dtype, accepted):
    stacked = _stacked(dtype)
    one_by_one = _aggregate(make(), _updates(stacked, accepted), grouped=False)
    grouped = _aggregate(make(), _updates(stacked, accepted), grouped=True)
    assert one_by_one.keys() == grouped.keys()
    for name, expected in one_by_one.items():
        assert grouped[name].dtype == expected.dtype
        assert torch.equal(grouped[name], expected), name


def test_update_group_copies_the_latest_clients_integer_entries():
    stacked = _stacked()
    result = _aggregate(FedAvg(), _updates(stacked, [3, 1, 0]), grouped=True)
    # The round's latest accepted client by position (client 8, at position 3), not the last one folded.
    assert result["bn.num_batches_tracked"].item() == 13


def test_finite_rows_agrees_with_isfinite():
    generator = torch.Generator().manual_seed(1)
    big = torch.randn(6, 40, 7, generator=generator)
    big[1, 3, 2] = float("nan")
    big[2, 0, 0] = float("inf")
    big[3, 5, 1], big[3, 6, 1] = float("inf"), float("-inf")
    # Finite, but its sum overflows float32: checked element by element, still finite.
    big[4, :2] = torch.finfo(torch.float32).max
    small = torch.randn(6, 3, generator=generator)
    small[5, 1] = float("-inf")
    transposed = torch.randn(6, 4, 9, generator=generator).transpose(1, 2)
    tensors = [big, small, transposed]
    expected = torch.stack([torch.isfinite(t).reshape(6, -1).all(1) for t in tensors]).all(0).tolist()
    assert finite_rows(tensors, 6) == expected == [True, False, False, False, True, False]
    assert finite_rows([], 3) == [True, True, True]


def test_all_finite_agrees_with_isfinite_on_every_row_of_the_same_cases():
    generator = torch.Generator().manual_seed(1)
    big = torch.randn(6, 40, 7, generator=generator)
    big[1, 3, 2] = float("nan")
    big[2, 0, 0] = float("inf")
    big[3, 5, 1], big[3, 6, 1] = float("inf"), float("-inf")  # their sum is NaN
    big[4, :2] = torch.finfo(torch.float32).max  # finite, but its sum overflows: checked element by element
    transposed = torch.randn(6, 4, 9, generator=generator).transpose(1, 2)
    for row in range(6):
        state = {"w": big[row], "v": transposed[row], "count": torch.tensor(row)}
        expected = all(bool(torch.isfinite(t).all()) for t in (big[row], transposed[row]))
        assert all_finite(state) == expected, row
    assert all_finite({"count": torch.tensor(3)}) and all_finite({})
