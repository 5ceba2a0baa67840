"""Dict batches: the Hugging Face style (``batch["image"]``, ``batch["label"]``) that a datamodule's
``batch_format="dict"`` turns every batch into."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor
from torch.utils.data._utils.collate import default_collate

from lightning_fed.checks import InvalidArgumentError


def check_batch_keys(keys: Sequence[str]) -> tuple[str, ...]:
    """``batch_keys`` is a non-empty sequence of distinct non-empty strings; returns it as a tuple."""
    if (
        isinstance(keys, str)
        or not isinstance(keys, Sequence)
        or not keys
        or not all(isinstance(key, str) and key for key in keys)
        or len(set(keys)) != len(keys)
    ):
        raise InvalidArgumentError("batch_keys", keys, 'a list of distinct key names, e.g. ["image", "label"]')
    return tuple(keys)


def as_dict_batch(batch: Any, keys: tuple[str, ...]) -> Any:
    """``batch`` as a dict keyed by ``keys``: a tuple's parts in order, a tensor under the first key; a dict (items
    that were dicts already) is kept.

    Raises:
        ValueError: If a tuple batch has more parts than ``keys`` names.
    """
    if isinstance(batch, Mapping):
        return batch
    if isinstance(batch, Tensor):
        return {keys[0]: batch}
    if isinstance(batch, (tuple, list)):
        if len(batch) > len(keys):
            raise ValueError(
                f"A batch has {len(batch)} parts but `batch_keys` names {len(keys)} ({list(keys)}): give one key per"
                " part of an item."
            )
        return dict(zip(keys, batch))
    return {keys[0]: batch}


class KeyedCollate:
    """Collates with ``collate`` and keys the result with :func:`as_dict_batch` (a class: workers pickle it)."""

    def __init__(self, keys: tuple[str, ...], collate: Callable[[Any], Any] = default_collate) -> None:
        self.keys = keys
        self.collate = collate

    def __call__(self, items: Any) -> Any:
        return as_dict_batch(self.collate(items), self.keys)


__all__ = ["KeyedCollate", "as_dict_batch", "check_batch_keys"]
