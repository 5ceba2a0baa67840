"""Index bookkeeping shared by the datamodules: per-client index sets and label-stratified holdouts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class RaggedIndex:
    """One int64 index tensor per client, stored flat with offsets.

    Two tensors hold every client's indices, so 10 000 registered clients cost two allocations instead of 10 000
    tensor objects, and a client's indices are a free view.

    Args:
        flat: The clients' indices, client 0's first.
        offsets: ``[num_clients + 1]`` int64; client ``k`` owns ``flat[offsets[k]:offsets[k + 1]]``.
    """

    def __init__(self, flat: Tensor, offsets: Tensor) -> None:
        self.flat = flat.to(torch.int64)
        self.offsets = offsets.to(torch.int64)

    @classmethod
    def from_parts(cls, parts: Sequence[Tensor]) -> RaggedIndex:
        """Builds it from one index tensor per client."""
        lengths = torch.tensor([part.numel() for part in parts], dtype=torch.int64)
        flat = torch.cat([part.reshape(-1).to(torch.int64) for part in parts]) if parts else _empty()
        return cls(flat, _offsets(lengths))

    @classmethod
    def from_groups(cls, flat: Tensor, groups: Tensor, num_groups: int) -> RaggedIndex:
        """Builds it from indices already sorted by ``groups`` (their client ids)."""
        return cls(flat, _offsets(torch.bincount(groups, minlength=num_groups)))

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, client_id: int) -> Tensor:
        return self.flat[int(self.offsets[client_id]) : int(self.offsets[client_id + 1])]

    def lengths(self) -> Tensor:
        """Number of indices of every client."""
        return self.offsets.diff()

    def group_ids(self) -> Tensor:
        """The client id of every entry of ``flat``."""
        return torch.repeat_interleave(torch.arange(len(self)), self.lengths())

    def parts(self) -> list[Tensor]:
        """One view per client."""
        return list(self.flat.split(self.lengths().tolist()))


def _empty() -> Tensor:
    return torch.zeros(0, dtype=torch.int64)


def _offsets(lengths: Tensor) -> Tensor:
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return offsets


def holdout_sizes(lengths: Tensor, fraction: float, size: int | None) -> Tensor:
    """How many examples each group holds out: ``round(n * fraction)`` or ``size``, leaving at least one example."""
    if size is not None:
        wanted = torch.full_like(lengths, size)
    else:
        wanted = torch.floor(lengths.double() * fraction + 0.5).to(torch.int64)
    return torch.minimum(wanted, (lengths - 1).clamp(min=0))


def stratified_holdout(labels: Tensor, groups: Tensor, sizes: Tensor, generator: torch.Generator) -> Tensor:
    """Chooses ``sizes[g]`` examples of every group ``g`` so that the choice has the group's label distribution.

    Label ``c`` of group ``g`` (``n_gc`` of the group's ``n_g`` examples) gives ``floor(n_gc * sizes[g] / n_g)``
    examples, and the examples still missing come one each from the labels with the largest remainders (ties broken
    at random). Every label's count in the holdout is therefore within one of its exact share. Which examples of a
    label are chosen is uniformly random. Integer arithmetic keeps the apportionment exact.

    Args:
        labels: ``[n]`` int64 labels.
        groups: ``[n]`` int64 group (client) ids in ``[0, len(sizes))``.
        sizes: ``[num_groups]`` int64 holdout sizes, each at most its group's size.
        generator: Source of every random choice.

    Returns:
        ``[n]`` bool mask of the held-out examples.
    """
    n = labels.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.bool)
    num_labels = int(labels.max()) + 1
    # A random order, stably sorted by (group, label) cell, lists each cell's examples in random order.
    order = torch.randperm(n, generator=generator)
    cell_sorted, resort = torch.sort(groups[order] * num_labels + labels[order], stable=True)
    order = order[resort]
    cells, counts = torch.unique_consecutive(cell_sorted, return_counts=True)
    cell_group = cells // num_labels
    group_sizes = torch.bincount(groups, minlength=sizes.numel())
    numerator = counts * sizes[cell_group]
    quota = numerator // group_sizes[cell_group]
    shortfall = sizes - torch.zeros_like(sizes).index_add_(0, cell_group, quota)
    # Within a group all cells share the denominator, so integer remainders rank the fractional parts exactly.
    quota += _largest_remainders(numerator % group_sizes[cell_group], cell_group, shortfall, generator)
    starts = counts.cumsum(0) - counts
    rank_in_cell = torch.arange(n) - starts.repeat_interleave(counts)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[order] = rank_in_cell < quota.repeat_interleave(counts)
    return mask


def _largest_remainders(
    remainders: Tensor, cell_group: Tensor, shortfall: Tensor, generator: torch.Generator
) -> Tensor:
    """1 for the ``shortfall[g]`` cells of each group ``g`` with the largest remainders, else 0."""
    shuffled = torch.randperm(remainders.numel(), generator=generator)
    by_remainder = shuffled[torch.sort(-remainders[shuffled], stable=True).indices]
    order = by_remainder[torch.sort(cell_group[by_remainder], stable=True).indices]
    sorted_groups = cell_group[order]
    group_counts = torch.bincount(sorted_groups, minlength=shortfall.numel())
    rank = torch.arange(order.numel()) - (group_counts.cumsum(0) - group_counts)[sorted_groups]
    extra = torch.zeros_like(remainders)
    extra[order] = (rank < shortfall[sorted_groups]).to(extra.dtype)
    return extra
