"""Target-EMD partitions (Zhao et al. 2018, §3.2): rolled distributions that hit Table 2's EMD levels."""

import pytest
import torch

from lightning_fed.datamodules import IidPartitioner, ShardPartitioner, TargetEmdPartitioner
from lightning_fed.datamodules.partitioners.target_emd import peak_distribution
from lightning_fed.functional.partition_stats import earth_movers_distance, label_histogram

# Zhao et al. (arXiv:1806.00582), Table 2.
TABLE_2_EMD = [0.0, 0.36, 0.72, 1.08, 1.44, 1.62, 1.764, 1.8]
BALANCED = torch.arange(10).repeat(300)  # 10 balanced classes, 3000 examples


def _emd(parts):
    return earth_movers_distance(label_histogram(BALANCED, parts, 10))


def test_one_class_client_has_emd_1_8_and_iid_client_0():
    one_class = ShardPartitioner(10, 1, seed=0).partition(BALANCED)
    assert torch.allclose(_emd(one_class), torch.full((10,), 1.8, dtype=torch.float64))
    stratified = [torch.arange(0, 1500), torch.arange(1500, 3000)]  # each holds 150 of every class
    assert torch.allclose(_emd(stratified), torch.zeros(2, dtype=torch.float64))
    assert _emd(IidPartitioner(2, seed=0).partition(BALANCED)).max() < 0.1


@pytest.mark.parametrize("target", TABLE_2_EMD)
def test_closed_form_distribution_has_the_target_emd(target):
    distribution = peak_distribution(target, 10)
    assert distribution.sum() == pytest.approx(1.0)
    assert abs(distribution - 0.1).sum() == pytest.approx(target)


@pytest.mark.parametrize("target", TABLE_2_EMD)
def test_partition_hits_table_2_and_uses_every_example_exactly_once(target):
    parts = TargetEmdPartitioner(10, target, seed=3).partition(BALANCED)
    assert abs(float(_emd(parts).mean()) - target) <= 0.02
    assert {part.numel() for part in parts} == {300}
    # 10 clients over 10 balanced classes: every example is used, none twice.
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(3000))


def test_clients_hold_p_shifted_by_one_class():
    parts = TargetEmdPartitioner(10, 1.08, seed=1).partition(BALANCED)
    histogram = label_histogram(BALANCED, parts, 10)
    # Every client has P's counts (over a seeded class order), its peak one class further: all peaks differ.
    for k in range(10):
        assert torch.equal(torch.sort(histogram[k]).values, torch.sort(histogram[0]).values)
    assert histogram.argmax(dim=1).unique().numel() == 10
    assert int(histogram[0].max()) == round(300 * (0.1 + 1.08 / 2))


@pytest.mark.parametrize("num_clients", [7, 13])
def test_other_client_counts_use_each_example_at_most_once(num_clients):
    parts = TargetEmdPartitioner(num_clients, 1.44, seed=0).partition(BALANCED)
    flat = torch.cat(parts)
    assert flat.unique().numel() == flat.numel()
    assert len({part.numel() for part in parts}) == 1
    reference = earth_movers_distance(label_histogram(BALANCED, parts, 10), torch.ones(10))
    assert abs(float(reference.mean()) - 1.44) <= 0.02


def test_seed_changes_the_draw_but_not_the_emd():
    first = TargetEmdPartitioner(10, 0.72, seed=0).partition(BALANCED)
    second = TargetEmdPartitioner(10, 0.72, seed=1).partition(BALANCED)
    assert any(not torch.equal(a, b) for a, b in zip(first, second))
    assert torch.equal(torch.cat(first), torch.cat(TargetEmdPartitioner(10, 0.72, seed=0).partition(BALANCED)))
    assert float(_emd(first).mean()) == pytest.approx(float(_emd(second).mean()))


@pytest.mark.parametrize("target", [-0.1, 2.0, 5])
def test_unreachable_target_raises_at_construction(target):
    with pytest.raises(ValueError, match="target_emd"):
        TargetEmdPartitioner(10, target)


def test_target_above_2_c_minus_1_over_c_raises_for_the_data():
    four_classes = torch.arange(4).repeat(100)  # max EMD 2 * 3 / 4 = 1.5
    with pytest.raises(ValueError, match="target_emd.*unreachable"):
        TargetEmdPartitioner(4, 1.6).partition(four_classes)
    TargetEmdPartitioner(4, 1.5).partition(four_classes)
