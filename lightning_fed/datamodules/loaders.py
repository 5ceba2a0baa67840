"""DataLoaders over a subset of a dataset's indices: one gather per batch for in-memory tensors, else a ``Subset``;
batches as the dataset's items collate, or as dicts keyed by ``batch_keys``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_fed.datamodules.batch_format import KeyedCollate
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset, tensor_dataloader


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoader settings a datamodule passes to every loader it builds.

    Attributes:
        num_workers: Worker processes.
        pin_memory: DataLoader ``pin_memory``.
        persistent_workers: DataLoader ``persistent_workers`` (only with workers).
        drop_last: Drop the last batch of a pass when it is smaller than the batch size (training loaders only).
        batch_keys: Turn every batch into a dict with these keys; ``None`` keeps batches as they collate.
    """

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    drop_last: bool = False
    batch_keys: tuple[str, ...] | None = None


def index_loader(
    dataset: Dataset,
    indices: Tensor | None,
    batch_size: int,
    generator: torch.Generator | None,
    options: LoaderOptions,
    batched: bool,
) -> DataLoader:
    """A loader over ``dataset[indices]`` (all of it for ``None``), shuffled each pass when given a generator.

    Args:
        dataset: The dataset.
        indices: The examples to serve.
        batch_size: Examples per batch.
        generator: Shuffles each pass when given; ``None`` keeps the order of ``indices``.
        options: Workers, pinned memory, ``drop_last`` and the batch keys.
        batched: Whether a :class:`TensorClassificationDataset` may use the batched fast path, whose sampler yields
            index tensors. Lightning's ``DistributedSampler`` only replaces per-example samplers, so loaders that
            Lightning distributes must not.
    """
    if batched and isinstance(dataset, TensorClassificationDataset):
        return tensor_dataloader(
            dataset,
            indices,
            batch_size,
            generator,
            options.num_workers,
            drop_last=options.drop_last,
            pin_memory=options.pin_memory,
            persistent_workers=options.persistent_workers,
            batch_keys=options.batch_keys,
        )
    subset = dataset if indices is None else Subset(dataset, indices.tolist())
    return DataLoader(
        subset,
        batch_size=batch_size,
        shuffle=generator is not None,
        generator=generator,
        num_workers=options.num_workers,
        pin_memory=options.pin_memory,
        persistent_workers=options.persistent_workers,
        drop_last=options.drop_last,
        collate_fn=None if options.batch_keys is None else KeyedCollate(options.batch_keys),
    )


__all__ = ["LoaderOptions", "index_loader"]
