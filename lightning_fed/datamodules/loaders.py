"""DataLoaders over a subset of a dataset's indices: one gather per batch for in-memory tensors, else a ``Subset``."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset, tensor_dataloader


def index_loader(
    dataset: Dataset,
    indices: Tensor | None,
    batch_size: int,
    generator: torch.Generator | None,
    num_workers: int,
    batched: bool,
) -> DataLoader:
    """A loader over ``dataset[indices]`` (all of it for ``None``), shuffled each pass when given a generator.

    Args:
        dataset: The dataset.
        indices: The examples to serve.
        batch_size: Examples per batch.
        generator: Shuffles each pass when given; ``None`` keeps the order of ``indices``.
        num_workers: DataLoader worker processes.
        batched: Whether a :class:`TensorClassificationDataset` may use the batched fast path, whose sampler yields
            index tensors. Lightning's ``DistributedSampler`` only replaces per-example samplers, so loaders that
            Lightning distributes must not.
    """
    if batched and isinstance(dataset, TensorClassificationDataset):
        return tensor_dataloader(dataset, indices, batch_size, generator, num_workers)
    subset = dataset if indices is None else Subset(dataset, indices.tolist())
    return DataLoader(
        subset,
        batch_size=batch_size,
        shuffle=generator is not None,
        generator=generator,
        num_workers=num_workers,
    )


__all__ = ["index_loader"]
