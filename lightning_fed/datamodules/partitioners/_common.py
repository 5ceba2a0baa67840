"""Label validation and index conversion shared by the partitioners (private)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def labels_to_numpy(labels: Tensor | Sequence[int] | np.ndarray) -> np.ndarray:
    """Returns ``labels`` as a 1-D int64 numpy array of non-negative class ids.

    Raises:
        ValueError: If ``labels`` is not 1-D, not integral, or holds negative values.
    """
    tensor = torch.as_tensor(labels)
    if tensor.ndim != 1:
        raise ValueError(f"`labels` must be a 1-D tensor; got shape {tuple(tensor.shape)}.")
    if tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(f"`labels` must hold integer class ids; got dtype {tensor.dtype}.")
    array = tensor.detach().cpu().to(torch.int64).numpy()
    if array.size and array.min() < 0:
        raise ValueError(f"`labels` must be non-negative class ids; got minimum {int(array.min())}.")
    return array


def sort_with_random_ties(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Returns indices that sort ``labels``, with equal labels in a random (seeded) order."""
    shuffled = rng.permutation(labels.size)
    # A stable sort of a shuffled order keeps the shuffle within each class.
    return shuffled[np.argsort(labels[shuffled], kind="stable")]


def to_index_tensors(parts: Sequence[np.ndarray]) -> list[Tensor]:
    """Returns each client's indices as a sorted int64 tensor, so that outputs compare exactly across runs."""
    return [torch.from_numpy(np.sort(np.asarray(part, dtype=np.int64))) for part in parts]
