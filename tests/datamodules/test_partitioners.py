"""Invariants of every partitioner: disjointness, cover, sizes, seeding, and each scheme's defining property."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from lightning_fed.datamodules.partitioners import (
    DirichletPartitioner,
    GroupPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    Partitioner,
    ShardPartitioner,
    SimilarityPartitioner,
)

NUM_CLASSES = 10
BALANCED = torch.arange(NUM_CLASSES).repeat_interleave(100)  # 10 balanced classes, 1000 examples, sorted
BIG_BALANCED = torch.arange(NUM_CLASSES).repeat_interleave(1000)

# name -> (factory taking a seed, whether every example is used exactly once)
SCHEMES: dict[str, tuple[Callable[[int], Partitioner], bool]] = {
    "iid": (lambda seed: IidPartitioner(10, seed=seed), True),
    "dirichlet_class": (lambda seed: DirichletPartitioner(10, alpha=0.5, seed=seed), True),
    "dirichlet_client": (lambda seed: DirichletPartitioner(10, alpha=0.5, proportions="per_client", seed=seed), True),
    "shard_1": (lambda seed: ShardPartitioner(10, 1, seed=seed), True),
    "shard_2": (lambda seed: ShardPartitioner(10, 2, seed=seed), True),
    "similarity": (lambda seed: SimilarityPartitioner(10, 0.3, seed=seed), True),
    "group": (lambda seed: GroupPartitioner(9, samples_per_client=[60, 40, 20], seed=seed), False),
}


def histogram(labels: Tensor, parts: list[Tensor]) -> Tensor:
    """Per-client class counts, computed independently of the stats module."""
    return torch.stack([torch.bincount(labels[p], minlength=int(labels.max()) + 1) for p in parts])


def max_emd(labels: Tensor, parts: list[Tensor]) -> float:
    """Largest L1 distance between a client's class distribution and the population's."""
    counts = histogram(labels, parts).double()
    population = torch.bincount(labels).double() / labels.numel()
    return float((counts / counts.sum(1, keepdim=True) - population).abs().sum(1).max())


def assert_disjoint(parts: list[Tensor], num_examples: int, cover: bool) -> None:
    assert all(p.dtype == torch.int64 and p.ndim == 1 for p in parts)
    flat = torch.cat(parts)
    assert flat.unique().numel() == flat.numel(), "an example was given to two clients"
    assert flat.numel() == 0 or (flat.min() >= 0 and flat.max() < num_examples)
    if cover:
        assert flat.numel() == num_examples, "some example was left out"


@pytest.mark.parametrize("name", SCHEMES)
def test_disjoint_and_cover(name: str) -> None:
    factory, cover = SCHEMES[name]
    parts = factory(0).partition(BALANCED)
    assert len(parts) == factory(0).num_partitions
    assert_disjoint(parts, BALANCED.numel(), cover)


@pytest.mark.parametrize("name", SCHEMES)
def test_seed_reproducible_and_seed_sensitive(name: str) -> None:
    factory, _ = SCHEMES[name]
    first, again, other = factory(3).partition(BALANCED), factory(3).partition(BALANCED), factory(4).partition(BALANCED)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("name", SCHEMES)
def test_leaves_global_rng_alone(name: str) -> None:
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    SCHEMES[name][0](0).partition(BALANCED)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state)


@pytest.mark.parametrize("partitioner", [IidPartitioner(3), ShardPartitioner(2, 1), SimilarityPartitioner(2, 0.5)])
def test_rejects_bad_labels(partitioner: Partitioner) -> None:
    with pytest.raises(ValueError, match="labels"):
        partitioner.partition(torch.zeros(4, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="labels"):
        partitioner.partition(torch.rand(10))


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: IidPartitioner(0), "num_partitions"),
        (lambda: DirichletPartitioner(5, alpha=0.0), "alpha"),
        (lambda: DirichletPartitioner(5, alpha=float("inf")), "alpha"),
        (lambda: DirichletPartitioner(5, alpha=1.0, min_partition_size=-1), "min_partition_size"),
        (lambda: DirichletPartitioner(5, alpha=1.0, max_retries=0), "max_retries"),
        (lambda: DirichletPartitioner(5, alpha=1.0, proportions="per_label"), "proportions"),
        (lambda: DirichletPartitioner(5, alpha=1.0, partition_by="label"), "partition_by"),
        (lambda: ShardPartitioner(5, 0), "shards_per_client"),
        (lambda: SimilarityPartitioner(5, 1.5), "similarity"),
        (lambda: SimilarityPartitioner(5, -0.1), "similarity"),
        (lambda: GroupPartitioner(5, dominant_ratio=1.2), "dominant_ratio"),
        (lambda: GroupPartitioner(2, num_groups=3), "num_groups"),
        (lambda: GroupPartitioner(6, samples_per_client=[10, 20]), "samples_per_client"),
        (lambda: GroupPartitioner(6, samples_per_client=[10, 0, 5]), "samples_per_client"),
        (lambda: GroupPartitioner(6, clients_per_group=[1, 2, 2]), "clients_per_group"),
        (lambda: GroupPartitioner(6, classes_per_group=[1, 2]), "classes_per_group"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(build: Callable[[], Partitioner], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        build()


def test_iid_sizes_differ_by_at_most_one() -> None:
    labels = torch.arange(1003) % 7
    sizes = [p.numel() for p in IidPartitioner(10, seed=1).partition(labels)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003
    with pytest.raises(ValueError, match="num_partitions"):
        IidPartitioner(20).partition(labels[:5])


@pytest.mark.parametrize("form", ["per_class", "per_client"])
def test_dirichlet_large_alpha_is_close_to_iid(form: str) -> None:
    parts = DirichletPartitioner(10, alpha=1e4, proportions=form, seed=0).partition(BIG_BALANCED)
    assert_disjoint(parts, BIG_BALANCED.numel(), cover=True)
    # 1000 draws per client leave a multinomial L1 error of ~0.08 around the population.
    assert max_emd(BIG_BALANCED, parts) < 0.2


@pytest.mark.parametrize("form", ["per_class", "per_client"])
def test_dirichlet_smaller_alpha_is_more_skewed(form: str) -> None:
    def mean_skew(alpha: float) -> float:
        parts = DirichletPartitioner(10, alpha=alpha, proportions=form, min_partition_size=0).partition(BIG_BALANCED)
        top_share = histogram(BIG_BALANCED, parts).max(1).values / torch.tensor([p.numel() for p in parts])
        return float(top_share.mean())

    assert mean_skew(0.05) > mean_skew(1.0) > mean_skew(100.0)


def test_dirichlet_respects_min_partition_size_and_client_form_sizes() -> None:
    parts = DirichletPartitioner(20, alpha=0.5, min_partition_size=20, seed=2).partition(BALANCED)
    assert min(p.numel() for p in parts) >= 20
    sizes = [p.numel() for p in DirichletPartitioner(7, alpha=0.1, proportions="per_client").partition(BALANCED)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == BALANCED.numel()


@pytest.mark.parametrize(("old", "new"), [("class", "per_class"), ("client", "per_client")])
def test_dirichlet_partition_by_is_a_deprecated_alias_of_proportions(old: str, new: str) -> None:
    with pytest.deprecated_call(match="proportions"):
        aliased = DirichletPartitioner(10, alpha=0.5, partition_by=old, seed=3)
    assert aliased.proportions == new
    expected = DirichletPartitioner(10, alpha=0.5, proportions=new, seed=3).partition(BALANCED)
    assert all(torch.equal(a, b) for a, b in zip(aliased.partition(BALANCED), expected))
    with pytest.deprecated_call(match="proportions"):
        assert aliased.partition_by == old


def test_dirichlet_partition_by_contradicting_proportions_is_an_error() -> None:
    with pytest.raises(ValueError, match="partition_by.*proportions"):
        DirichletPartitioner(10, alpha=0.5, proportions="per_client", partition_by="class")


def test_dirichlet_infeasible_gives_up_after_bounded_retries_naming_the_knobs() -> None:
    with pytest.raises(ValueError, match="min_partition_size") as error:
        DirichletPartitioner(50, alpha=0.01, min_partition_size=10, max_retries=5).partition(BALANCED)
    assert "alpha" in str(error.value) and "num_partitions" in str(error.value)
    with pytest.raises(ValueError, match="min_partition_size"):  # impossible for any draw: 1000 < 200 x 10
        DirichletPartitioner(200, alpha=1.0, min_partition_size=10, max_retries=10**9).partition(BALANCED)


@pytest.mark.parametrize(("num_clients", "per_client"), [(10, 1), (10, 2), (20, 2), (50, 2), (5, 2), (10, 5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shards_give_exactly_c_classes_on_balanced_labels(num_clients: int, per_client: int, seed: int) -> None:
    parts = ShardPartitioner(num_clients, per_client, seed=seed).partition(BALANCED)
    assert_disjoint(parts, BALANCED.numel(), cover=True)
    assert {p.numel() for p in parts} == {BALANCED.numel() // (num_clients * per_client) * per_client}
    assert ((histogram(BALANCED, parts) > 0).sum(1) == per_client).all()


def test_shard_class_pairings_vary_with_seed() -> None:
    def pairings(seed: int) -> set[tuple[int, ...]]:
        parts = ShardPartitioner(20, 2, seed=seed).partition(BALANCED)
        return {tuple(BALANCED[p].unique().tolist()) for p in parts}

    assert len({frozenset(pairings(seed)) for seed in range(5)}) > 1


def test_shard_warns_when_duplicates_are_unavoidable_and_errors_when_too_few_examples() -> None:
    skewed = torch.tensor([0] * 60 + [1] * 6)  # class 0 fills 5 of 6 shards, but there are only 3 clients
    with pytest.warns(UserWarning, match="num_partitions"):
        parts = ShardPartitioner(3, 2).partition(skewed)
    assert_disjoint(parts, skewed.numel(), cover=True)
    with pytest.raises(ValueError, match="shards_per_client"):
        ShardPartitioner(4, 3).partition(torch.arange(11))


def test_similarity_zero_is_sorted_one_class_per_client() -> None:
    parts = SimilarityPartitioner(10, 0.0, seed=5).partition(BALANCED)
    assert_disjoint(parts, BALANCED.numel(), cover=True)
    for client, part in enumerate(parts):
        assert BALANCED[part].unique().tolist() == [client]  # chunk k of the label-sorted data goes to client k


def test_similarity_one_is_iid_and_skew_falls_with_similarity() -> None:
    parts = SimilarityPartitioner(10, 1.0).partition(BIG_BALANCED)
    assert max_emd(BIG_BALANCED, parts) < 0.2
    skews = [max_emd(BIG_BALANCED, SimilarityPartitioner(10, s).partition(BIG_BALANCED)) for s in (0, 0.3, 0.7, 1)]
    assert skews == sorted(skews, reverse=True)
    sizes = [p.numel() for p in SimilarityPartitioner(7, 0.37).partition(BALANCED)]
    assert max(sizes) - min(sizes) <= 2 and sum(sizes) == BALANCED.numel()


def test_group_dominant_ratio_and_group_sizes() -> None:
    labels = torch.arange(12).repeat_interleave(300)
    sizes = [200, 140, 80]
    parts = GroupPartitioner(9, num_groups=3, samples_per_client=sizes, seed=1).partition(labels)
    assert_disjoint(parts, labels.numel(), cover=False)
    counts = histogram(labels, parts)
    for client, row in enumerate(counts):
        group = client // 3  # three clients and four consecutive dominant classes per group
        size = sizes[group]
        assert int(row.sum()) == size
        assert abs(float(row[4 * group : 4 * group + 4].sum()) / size - 0.8) <= 1 / size
        assert (row > 0).all(), "every client holds every class in the practical setting"


def test_group_matches_fedamp_emnist_setup() -> None:
    labels = torch.arange(62).repeat_interleave(1000)
    blocks = [10, 26, 26]
    partitioner = GroupPartitioner(62, 3, 0.8, [1000, 700, 400], clients_per_group=blocks, classes_per_group=blocks)
    counts = histogram(labels, partitioner.partition(labels))
    starts = [0, 10, 36]
    for client, row in enumerate(counts):
        group = int(np.searchsorted(np.cumsum(blocks), client, side="right"))
        dominant = row[starts[group] : starts[group] + blocks[group]].sum()
        assert int(row.sum()) == [1000, 700, 400][group]
        assert float(dominant) / float(row.sum()) == pytest.approx(0.8, abs=1e-3)


def test_group_default_sizes_are_equal_and_test_split_keeps_the_class_mix() -> None:
    labels = torch.arange(12).repeat_interleave(300)
    parts = GroupPartitioner(6, num_groups=2).partition(labels)
    assert len({p.numel() for p in parts}) == 1
    assert_disjoint(parts, labels.numel(), cover=False)
    test_parts = GroupPartitioner(6, num_groups=2, samples_per_client=[100, 100]).partition(labels[::3])
    train_top = histogram(labels, parts).argsort(1, descending=True)[:, :6].sort(1).values
    test_top = histogram(labels[::3], test_parts).argsort(1, descending=True)[:, :6].sort(1).values
    assert torch.equal(train_top, test_top)


def test_group_not_enough_examples_raises() -> None:
    with pytest.raises(ValueError, match="samples_per_client"):
        GroupPartitioner(9, samples_per_client=[1000, 700, 400]).partition(BALANCED)
    with pytest.raises(ValueError, match="classes_per_group"):
        GroupPartitioner(3, classes_per_group=[4, 4, 4]).partition(BALANCED)


def test_natural_id_mapping() -> None:
    labels = torch.zeros(6, dtype=torch.int64)
    natural_ids = torch.tensor([5, 3, 5, 9, 3, 3])
    parts = NaturalIdPartitioner(3).partition(labels, natural_ids)
    for part, writer in zip(parts, sorted(set(natural_ids.tolist()))):
        assert part.tolist() == [i for i, w in enumerate(natural_ids.tolist()) if w == writer]
    with pytest.raises(ValueError, match="natural_ids"):
        NaturalIdPartitioner(3).partition(labels)
    with pytest.raises(ValueError, match="num_partitions"):
        NaturalIdPartitioner(4).partition(labels, natural_ids)
    with pytest.raises(ValueError, match="natural_ids"):
        NaturalIdPartitioner(3).partition(labels, natural_ids[:5])
