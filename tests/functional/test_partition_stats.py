"""Partition statistics against hand-built examples and a loop-based reference of Zhao et al.'s EMD."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fed.functional import class_distribution, earth_movers_distance, label_histogram, mean_emd


def reference_emd(row: list[float], population: list[float]) -> float:
    """Σ_i |p_k(i) − p(i)|, written out with plain Python loops."""
    n_k, n = sum(row), sum(population)
    return sum(abs(r / n_k - q / n) for r, q in zip(row, population))


def test_label_histogram_hand_built() -> None:
    labels = torch.tensor([0, 1, 1, 2, 2, 2])
    parts = [torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5]), torch.tensor([], dtype=torch.int64)]
    hist = label_histogram(labels, parts, num_classes=4)
    assert hist.dtype == torch.int64 and hist.shape == (3, 4)
    # Counted by hand: client 0 holds labels {0, 1}, client 1 holds {1, 2, 2, 2}, client 2 nothing.
    assert hist.tolist() == [[1, 1, 0, 0], [0, 1, 3, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="num_classes"):
        label_histogram(labels, parts, num_classes=2)
    with pytest.raises(ValueError, match="`num_classes` must be an integer >= 1"):
        label_histogram(labels, parts, num_classes=0)


def test_class_distribution_rows_sum_to_one_and_empty_rows_stay_zero() -> None:
    hist = torch.tensor([[3, 1, 0], [0, 0, 0], [2, 2, 4]])
    dist = class_distribution(hist)
    assert dist.dtype == torch.float64
    assert torch.allclose(dist.sum(1), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(dist[0], hist[0].double() / 4)


@pytest.mark.parametrize("num_classes", [2, 5, 10])
def test_emd_of_one_class_clients(num_classes: int) -> None:
    hist = torch.eye(num_classes, dtype=torch.int64) * 100  # client k holds only class k; pooled is balanced
    expected = (1 - 1 / num_classes) + (num_classes - 1) / num_classes  # formula: |1 - 1/C| + (C-1)|0 - 1/C|
    assert torch.allclose(earth_movers_distance(hist), torch.full((num_classes,), expected, dtype=torch.float64))
    if num_classes == 10:
        assert mean_emd(hist) == pytest.approx(1.8)  # Zhao et al.'s value for 1-class non-IID


def test_emd_of_iid_clients_is_zero() -> None:
    hist = torch.full((4, 10), 25)
    assert torch.allclose(earth_movers_distance(hist), torch.zeros(4, dtype=torch.float64))
    assert mean_emd(hist) == pytest.approx(0.0)


def test_emd_matches_loop_reference_and_is_bounded() -> None:
    generator = torch.Generator().manual_seed(0)
    hist = torch.randint(0, 50, (8, 6), generator=generator)
    pooled = hist.sum(0).tolist()
    expected = [reference_emd(row, pooled) for row in hist.tolist()]
    emd = earth_movers_distance(hist)
    assert torch.allclose(emd, torch.tensor(expected, dtype=torch.float64))
    assert ((emd >= 0) & (emd <= 2)).all()


def test_emd_against_given_reference_accepts_counts_or_probabilities() -> None:
    hist = torch.tensor([[5, 5], [9, 1]])
    expected = [reference_emd(row, [1.0, 0.0]) for row in hist.tolist()]
    for reference in (torch.tensor([1.0, 0.0]), torch.tensor([30, 0])):
        assert torch.allclose(earth_movers_distance(hist, reference), torch.tensor(expected, dtype=torch.float64))
    with pytest.raises(ValueError, match="reference"):
        earth_movers_distance(hist, torch.tensor([1.0, 0.0, 0.0]))


def test_mean_emd_is_weighted_by_client_size_and_skips_empty_clients() -> None:
    hist = torch.tensor([[30, 0], [5, 5], [0, 0]])
    pooled = hist.sum(0).tolist()
    sizes = [sum(row) for row in hist.tolist()]
    per_client = [reference_emd(row, pooled) for row in hist.tolist()[:2]]
    expected = sum(n * e for n, e in zip(sizes, per_client)) / sum(sizes)
    assert mean_emd(hist) == pytest.approx(expected)
    assert mean_emd(hist) != pytest.approx(sum(per_client) / 2)  # the unweighted mean differs here
    assert math.isnan(float(earth_movers_distance(hist)[2]))
