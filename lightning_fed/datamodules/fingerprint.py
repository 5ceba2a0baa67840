"""The partition fingerprint: a digest of the labels and of every split, saved with checkpoints and checked on resume,
so that a resumed run never silently trains on a different split of its data."""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from lightning_fed.datamodules._splits import RaggedIndex
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.sharing import DataSharing


def fingerprint(*tensors: Tensor) -> str:
    """A hex digest of the tensors' values and shapes: equal for equal index sets, different otherwise."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()


def layout_fingerprint(
    labels: Tensor,
    clients: RaggedIndex,
    client_tests: RaggedIndex,
    val: Tensor,
    sharing: DataSharing | None,
    shared: Tensor | None,
    shares: RaggedIndex | None,
    drop_last: bool = False,
) -> str:
    """The fingerprint of a datamodule's splits: labels, client train and test splits, validation set, sharing, and
    ``drop_last`` (which changes what trains); the other loader options change no data order and stay out."""
    extra: tuple[Tensor, ...] = ()
    if sharing is not None and shared is not None and shares is not None:
        extra = (sharing.encode(), shared, shares.flat, shares.offsets)
    if drop_last:
        # Only when set, so that the fingerprints of runs from before the option stay valid.
        extra = (*extra, torch.tensor([1]))
    # The labels join the indices so that the same split of a different dataset is told apart too.
    return fingerprint(labels, clients.flat, clients.offsets, client_tests.flat, client_tests.offsets, val, *extra)


def check_fingerprint(
    current: str, expected: str | None, partitioner: Partitioner, sharing: DataSharing | None
) -> None:
    """Raises a ``ValueError`` when a checkpoint's fingerprint ``expected`` differs from ``current``.

    Args:
        current: This run's fingerprint.
        expected: The checkpoint's; ``None`` checks nothing.
        partitioner: This run's partitioner, shown so that the user can compare it with the checkpoint's config.
        sharing: This run's data-sharing settings, shown likewise.
    """
    if expected is not None and expected != current:
        raise ValueError(
            f"The checkpoint was saved with a different data split (fingerprint {expected}, now {current}): "
            f"resume with the same dataset, partitioner ({partitioner!r}), `seed`, `val_fraction`, client test "
            f"settings, `sharing` ({sharing!r}) and `drop_last`, or start a new run."
        )


__all__ = ["check_fingerprint", "fingerprint", "layout_fingerprint"]
