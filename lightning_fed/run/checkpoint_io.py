"""Round checkpoints written atomically: a full disk or a kill mid-write leaves the previous checkpoint resumable."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from lightning_fed.utilities.atomic import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` that streams each checkpoint to a temporary file beside its destination,
    ``fsync``\\ s it and moves it into place with ``os.replace``.

    Lightning's own writer serialises the whole checkpoint into memory first (one extra copy of the model, the
    optimizer and the client store) and does not ``fsync``. This one writes straight to disk, and a failed write
    (full disk, kill, crash) leaves no partial file: the previous round's checkpoint, which ``ModelCheckpoint``
    removes only after the new one is saved, stays as it was, and ``--ckpt_path last`` resumes from it. A full disk
    raises :class:`~lightning_fed.utilities.atomic.DiskFullError`, whose message says so and names the directory.

    Remote paths (``s3://``, ...) are left to Lightning's writer.

    Example:
        >>> from lightning_fed.run.checkpoint_io import AtomicCheckpointIO
        >>> plugins = [AtomicCheckpointIO()]  # FederatedTrainer(..., plugins=plugins)
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        protocol = get_filesystem(path).protocol
        local = "file" in ((protocol,) if isinstance(protocol, str) else protocol)
        if storage_options is not None or not local:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_write(path, lambda stream: torch.save(checkpoint, stream))


__all__ = ["AtomicCheckpointIO"]
