import itertools

import pytest
import torch

from lightning_fed.functional import robust
from lightning_fed.functional.robust import (
    bulyan,
    bulyan_select,
    coordinate_median,
    krum_scores,
    mean_of_rows,
    multi_krum_select,
    pairwise_squared_distances,
    trimmed_mean,
)


def _rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def _reference_krum_scores(points: torch.Tensor, f: int) -> list[float]:
    """Blanchard et al. 2017, Sec. 4, written out: sum of the n - f - 2 smallest ||x_i - x_j||^2 over j != i."""
    n = len(points)
    scores = []
    for i in range(n):
        others = sorted(float(((points[i].double() - points[j].double()) ** 2).sum()) for j in range(n) if j != i)
        scores.append(sum(others[: max(n - f - 2, 0)]))
    return scores


def _reference_bulyan(points: torch.Tensor, f: int) -> torch.Tensor:
    """El Mhamdi et al. 2018, Alg. 1 with A = Krum, written out with Python lists."""
    remaining = list(range(len(points)))
    chosen = []
    while len(chosen) < len(points) - 2 * f:
        scores = _reference_krum_scores(points[remaining], f)
        best = min(range(len(remaining)), key=lambda k: (scores[k], k))
        chosen.append(remaining.pop(best))
    beta = len(chosen) - 2 * f
    result = []
    for j in range(points.shape[1]):
        values = sorted(float(points[i, j]) for i in chosen)
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])
        closest = sorted(values, key=lambda v: (abs(v - median), v))[:beta]
        result.append(sum(closest) / beta)
    return torch.tensor(result, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 5, 7])
def test_median_of_odd_n_is_torch_median(n):
    rows = _rows(n, 13)
    assert torch.equal(coordinate_median(rows), torch.median(rows, dim=0).values.double())


def test_median_of_even_n_averages_the_two_middle_values():
    rows = _rows(6, 13)
    ordered = rows.double().sort(dim=0).values
    torch.testing.assert_close(coordinate_median(rows), (ordered[2] + ordered[3]) / 2, rtol=0, atol=0)
    torch.testing.assert_close(coordinate_median(rows), torch.quantile(rows.double(), 0.5, dim=0))


@pytest.mark.parametrize(("n", "k"), [(5, 0), (5, 2), (10, 3)])
def test_trimmed_mean_drops_k_values_at_each_end(n, k):
    rows = _rows(n, 9, seed=n + k)
    expected = [sum(sorted(rows[:, j].double().tolist())[k : n - k]) / (n - 2 * k) for j in range(9)]
    torch.testing.assert_close(trimmed_mean(rows, k), torch.tensor(expected, dtype=torch.float64))


def test_trimmed_mean_of_nothing_trimmed_is_the_mean_and_k_must_leave_a_value():
    rows = _rows(4, 3)
    torch.testing.assert_close(trimmed_mean(rows, 0), rows.double().mean(0))
    with pytest.raises(ValueError, match="num_trimmed=2"):
        trimmed_mean(rows, 2)


def test_column_blocks_do_not_change_any_result(monkeypatch):
    rows = _rows(7, 50)
    whole = [coordinate_median(rows), trimmed_mean(rows, 2), bulyan(rows, 1), pairwise_squared_distances(rows)]
    monkeypatch.setattr(robust, "BLOCK_ELEMENTS", 7 * 3)  # blocks of 3 columns, the last one of 2
    blocked = [coordinate_median(rows), trimmed_mean(rows, 2), bulyan(rows, 1), pairwise_squared_distances(rows)]
    for a, b in zip(whole, blocked):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_pairwise_distances_equal_direct_differences_and_ignore_the_centre():
    rows = _rows(6, 20) + 1000.0  # far from the origin: centring is what keeps the Gram identity precise
    direct = ((rows.double()[:, None, :] - rows.double()[None, :, :]) ** 2).sum(-1)
    centred = pairwise_squared_distances(rows, center=rows[0])
    torch.testing.assert_close(centred, direct, rtol=1e-9, atol=1e-9)
    assert torch.equal(centred.diagonal(), torch.zeros(6, dtype=torch.float64))


def test_krum_scores_by_hand_on_a_two_dimensional_example():
    # a=(0,0) b=(1,0) c=(0,2) e=(10,10) p=(1,1); n=5, f=1: each score sums the 5-1-2 = 2 closest squared distances.
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [10.0, 10.0], [1.0, 1.0]])
    scores = krum_scores(pairwise_squared_distances(points), num_byzantine=1)
    # a: 1 (b) + 2 (p); b: 1 (a) + 1 (p); c: 2 (p) + 4 (a); e: 162 (p) + 164 (c); p: 1 (b) + 2 (a or c).
    assert scores.tolist() == [3.0, 2.0, 6.0, 326.0, 3.0]
    assert scores.tolist() == _reference_krum_scores(points, 1)
    # Krum picks b; Multi-Krum's next two tie at 3 and keep row order (a before p).
    assert multi_krum_select(pairwise_squared_distances(points), 1, 1).tolist() == [1]
    assert multi_krum_select(pairwise_squared_distances(points), 1, 3).tolist() == [1, 0, 4]


@pytest.mark.parametrize(("n", "f"), [(5, 1), (9, 3), (4, 0)])
def test_krum_scores_match_the_written_out_definition(n, f):
    points = _rows(n, 6, seed=n)
    torch.testing.assert_close(
        krum_scores(pairwise_squared_distances(points), f),
        torch.tensor(_reference_krum_scores(points, f), dtype=torch.float64),
    )


def test_multi_krum_averages_the_lowest_scores_and_selecting_all_is_the_mean():
    points = _rows(7, 5)
    distances = pairwise_squared_distances(points)
    scores = torch.tensor(_reference_krum_scores(points, 2))
    best3 = sorted(range(7), key=lambda i: (float(scores[i]), i))[:3]
    selected = multi_krum_select(distances, 2, 3)
    assert selected.tolist() == best3
    torch.testing.assert_close(mean_of_rows(points, selected), points[best3].double().mean(0))
    torch.testing.assert_close(mean_of_rows(points, multi_krum_select(distances, 2, 7)), points.double().mean(0))


def test_bulyan_by_hand_on_one_dimensional_values():
    # f = 1, n = 7 = 4f + 3. Krum (neighbours n-3) picks 2, then 4, then 1 (the scores 46 vs 66 of the rest), then
    # 0 over 7 (tied at 49: the lower row), then 7 (no neighbours left: the first remaining row).
    values = torch.tensor([[0.0], [1.0], [2.0], [4.0], [7.0], [100.0], [-50.0]])
    assert bulyan_select(pairwise_squared_distances(values), 1).tolist() == [2, 3, 1, 0, 4]
    # beta = theta - 2f = 3 values of {0, 1, 2, 4, 7} closest to their median 2: 2, 1, and 0 (tied with 4 at
    # distance 2: the lower value).
    assert bulyan(values, 1).tolist() == [1.0]


@pytest.mark.parametrize(("n", "f", "seed"), [(7, 1, 0), (11, 2, 1), (12, 2, 2), (3, 0, 3)])
def test_bulyan_matches_the_written_out_algorithm(n, f, seed):
    points = _rows(n, 4, seed=seed)
    torch.testing.assert_close(bulyan(points, f), _reference_bulyan(points, f))


def test_bulyan_refuses_too_few_rows():
    with pytest.raises(ValueError, match="needs 7"):
        bulyan(_rows(6, 2), 1)


def test_a_far_outlier_does_not_move_median_krum_or_bulyan_but_moves_the_mean():
    honest = _rows(8, 10)
    direction = torch.ones(1, 10)

    def with_outlier(scale: float) -> torch.Tensor:
        return torch.cat([honest, scale * direction])

    def krum(rows: torch.Tensor) -> torch.Tensor:
        return mean_of_rows(rows, multi_krum_select(pairwise_squared_distances(rows), 1, 1))

    near, far = with_outlier(1e3), with_outlier(1e6)
    for rule in (coordinate_median, lambda r: trimmed_mean(r, 1), krum, lambda r: bulyan(r, 1)):
        assert torch.equal(rule(near), rule(far))
        assert rule(far).abs().max() < honest.abs().max()
    assert not torch.equal(near.double().mean(0), far.double().mean(0))


@pytest.mark.parametrize("rule", [coordinate_median, lambda rows: trimmed_mean(rows, 0)])
def test_bad_input_is_named(rule):
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        rule(torch.zeros(0, 3))
    with pytest.raises(TypeError, match="floating point"):
        rule(torch.zeros(3, 3, dtype=torch.int64))


def test_every_pair_of_rows_orders_the_same_in_krum_whatever_the_row_order():
    # Permuting the rows permutes the scores: Krum depends on the set of updates, not on the order they arrived in.
    points = _rows(6, 4)
    for permutation in itertools.islice(itertools.permutations(range(6)), 0, 720, 97):
        order = torch.tensor(permutation)
        scores = krum_scores(pairwise_squared_distances(points[order]), 1)
        torch.testing.assert_close(scores, krum_scores(pairwise_squared_distances(points), 1)[order])
