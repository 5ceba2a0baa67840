"""The batch transform that makes a malicious client train on flipped labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_fed.functional.attacks import flip_labels


class LabelFlip:
    r"""Replaces the labels of a ``(inputs, labels, ...)`` batch with :math:`C - 1 - y` (see
    :func:`~lightning_fed.functional.attacks.flip_labels`).

    Installed in a malicious client's ``ClientContext.batch_transforms``: the batch is rebuilt with a new label
    tensor, so the dataset behind the loader is never edited and honest clients sharing it are unaffected.

    Args:
        num_classes: :math:`C`.
        label_index: Position of the labels in the batch.
    """

    def __init__(self, num_classes: int, label_index: int = 1) -> None:
        self.num_classes = num_classes
        self.label_index = label_index

    def __call__(self, batch: Any) -> Any:
        if not isinstance(batch, Sequence) or isinstance(batch, str) or len(batch) <= self.label_index:
            raise TypeError(
                f"Label flipping needs batches of the form (inputs, labels, ...); got {type(batch).__name__}."
                " Use an update-space attack for other batch formats."
            )
        items = list(batch)
        items[self.label_index] = flip_labels(items[self.label_index], self.num_classes)
        return tuple(items) if isinstance(batch, tuple) else items


__all__ = ["LabelFlip"]
