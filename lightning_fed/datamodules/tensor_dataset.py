"""An in-memory classification dataset whose DataLoader gathers each batch with one indexing operation.

Federated clients hold a few hundred examples and train with batches of 10 to 32, so the per-batch overhead of
a DataLoader (one ``__getitem__`` per example, then stacking) dominates local training on small models. Here the
sampler yields a whole batch of indices and the dataset answers it with one gather per tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler
from typing_extensions import override

from lightning_fed.checks import check_instance, check_int
from lightning_fed.datamodules.batch_format import KeyedCollate


class TensorClassificationDataset(Dataset[tuple[Tensor, Tensor]]):
    """Inputs and integer class targets held as two tensors.

    ``dataset[i]`` gives one ``(input, target)`` pair, and ``dataset[index_tensor]`` the batch
    ``(inputs[index_tensor], targets[index_tensor])``, which :func:`tensor_dataloader` relies on.

    Args:
        inputs: ``[N, ...]`` tensor of inputs (e.g. normalised float images ``[N, C, H, W]``).
        targets: ``[N]`` integer class labels; stored as int64.

    Example:
        >>> dataset = TensorClassificationDataset(torch.zeros(4, 1, 2), torch.tensor([0, 1, 0, 1]))
        >>> dataset[torch.tensor([1, 3])][1]
        tensor([1, 1])
    """

    def __init__(self, inputs: Tensor, targets: Tensor) -> None:
        check_instance("inputs", inputs, Tensor, "a tensor")
        check_instance("targets", targets, Tensor, "a tensor")
        if targets.ndim != 1 or targets.is_floating_point() or targets.is_complex():
            raise ValueError(f"`targets` must be a 1-D integer tensor; got {targets.dtype} {list(targets.shape)}.")
        if inputs.ndim == 0 or inputs.shape[0] != targets.shape[0]:
            raise ValueError(
                f"`inputs` must have one row per target ({targets.shape[0]}); got shape {list(inputs.shape)}."
            )
        self.inputs = inputs
        self.targets = targets.to(torch.int64)

    def __len__(self) -> int:
        return self.targets.shape[0]

    @override
    def __getitem__(self, index: int | Tensor) -> tuple[Tensor, Tensor]:
        if isinstance(index, Tensor) and index.ndim == 1:
            # index_select skips advanced indexing's generic path: about half the time for a small batch.
            return self.inputs.index_select(0, index), self.targets.index_select(0, index)
        return self.inputs[index], self.targets[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[Tensor, Tensor]]:
        """The samples at ``indices``, gathered at once (what a batched DataLoader over a ``Subset`` calls)."""
        inputs, targets = self[torch.as_tensor(indices, dtype=torch.int64)]
        return list(zip(inputs.unbind(0), targets.unbind(0)))


class IndexBatchSampler(Sampler[Tensor]):
    """Yields batches of ``indices`` as int64 tensors, reshuffled on every pass when given a generator.

    Args:
        indices: The dataset indices to draw from.
        batch_size: Examples per batch; the last batch may be smaller.
        generator: Shuffles the order when given; each ``iter`` draws a new order from it, so a seeded generator
            makes every epoch's order reproducible. ``None`` keeps the order of ``indices``.
        drop_last: Drop the last batch of a pass when it is smaller than ``batch_size``.
    """

    def __init__(
        self, indices: Tensor, batch_size: int, generator: torch.Generator | None = None, drop_last: bool = False
    ) -> None:
        check_instance("indices", indices, Tensor, "a tensor of dataset indices")
        self.indices = indices.to(torch.int64)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.generator = generator
        self.drop_last = drop_last

    @override
    def __iter__(self) -> Iterator[Tensor]:
        indices = self.indices
        if self.generator is not None:
            indices = indices[torch.randperm(indices.numel(), generator=self.generator)]
        if self.drop_last:
            indices = indices[: len(self) * self.batch_size]
        return iter(indices.split(self.batch_size))

    def __len__(self) -> int:
        if self.drop_last:
            return self.indices.numel() // self.batch_size
        return (self.indices.numel() + self.batch_size - 1) // self.batch_size


class BatchedTensorDataLoader(DataLoader):
    """A DataLoader whose dataset returns whole batches for the index tensors its sampler yields.

    Without worker processes it iterates as ``dataset[indices] for indices in sampler``: the generic iterator's
    per-batch bookkeeping (profiler scopes, fetcher, collate) costs more than gathering a small batch. With workers
    or pinned memory it is an ordinary DataLoader.
    """

    @override
    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:  # type: ignore[override]  # any iterator of batches will do
        if self.num_workers > 0 or self.pin_memory or self.batch_size is not None:
            return super().__iter__()
        if self.collate_fn is _whole_batch:
            return (self.dataset[indices] for indices in self.sampler)
        return (self.collate_fn(self.dataset[indices]) for indices in self.sampler)


def _whole_batch(batch: Any) -> Any:
    # The dataset already returned a collated batch; a module-level function keeps worker processes picklable.
    return batch


def tensor_dataloader(
    dataset: TensorClassificationDataset,
    indices: Tensor | None,
    batch_size: int,
    generator: torch.Generator | None = None,
    num_workers: int = 0,
    drop_last: bool = False,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    batch_keys: tuple[str, ...] | None = None,
) -> DataLoader:
    """A DataLoader over ``dataset[indices]`` that costs one gather per tensor per batch.

    Automatic batching is off (``batch_size=None``): the sampler yields index tensors and ``dataset[index_tensor]``
    is already the batch. ``len(loader)`` is the number of batches; the last one may be smaller.

    Args:
        dataset: The in-memory dataset.
        indices: The examples to serve; ``None`` serves all of them.
        batch_size: Examples per batch.
        generator: Shuffles each pass when given (see :class:`IndexBatchSampler`).
        num_workers: DataLoader worker processes; 0 gathers in the main process, the fastest for in-memory data.
        drop_last: Drop the last batch of a pass when it is smaller than ``batch_size``.
        pin_memory: DataLoader ``pin_memory``.
        persistent_workers: DataLoader ``persistent_workers`` (only with ``num_workers`` > 0).
        batch_keys: Yield ``{batch_keys[0]: inputs, batch_keys[1]: targets}`` dicts instead of tuples.
    """
    if indices is None:
        indices = torch.arange(len(dataset))
    sampler = IndexBatchSampler(indices, batch_size, generator, drop_last)
    collate: Callable[[Any], Any] = _whole_batch
    if batch_keys is not None:
        collate = KeyedCollate(batch_keys, _whole_batch)
    return BatchedTensorDataLoader(
        dataset,
        batch_size=None,
        sampler=sampler,
        collate_fn=collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
    )
