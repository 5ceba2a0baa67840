"""Whether a checkpoint file is whole, and a folder's checkpoints from the newest to the oldest.

torch's zip format stores a CRC32 for every entry, but ``torch.load`` does not check them: a flipped bit in the
weights loads, and resumes, silently. :func:`read_checkpoint` checks every entry's CRC (``ZipFile.testzip``, one read
of the file) and that the file loads under ``weights_only=True`` as a checkpoint with the keys Lightning restores
from, before anything resumes from it. A truncated file is no zip archive at all (its directory is at the end).
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

# What Lightning reads from every checkpoint it restores (the version for its migrations, then the state and counts).
REQUIRED_KEYS = ("pytorch-lightning_version", "state_dict", "epoch", "global_step")


class CorruptCheckpointError(ValueError):
    """A checkpoint file that is damaged, truncated or no Lightning checkpoint.

    Attributes:
        path: The file.
        reason: What is wrong with it, in a few words.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{describe(path)}: {reason}")
        self.path = path
        self.reason = reason


def describe(path: Path) -> str:
    """``path``, and the file it links to (``last.ckpt`` links to the newest round's)."""
    return f"{path} (a link to {path.resolve().name})" if path.is_symlink() else str(path)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else type(error).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def verify_crcs(path: Path) -> None:
    """Checks the CRC32 of every entry of a zip checkpoint.

    Raises:
        CorruptCheckpointError: When the archive or one of its entries is damaged.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as error:
        raise CorruptCheckpointError(path, f"its zip archive is damaged ({_first_line(error)})") from error
    if bad is not None:
        raise CorruptCheckpointError(path, f"its entry {bad} fails its CRC check (the file is corrupt)")


def read_checkpoint(path: Path, verify: bool = True) -> dict[str, Any]:
    """Loads a checkpoint under ``weights_only=True`` (a zip checkpoint's tensors memory-mapped, so that reading it
    costs no memory), after checking its CRCs when ``verify``.

    Raises:
        CorruptCheckpointError: When the file is damaged, truncated or no Lightning checkpoint.
    """
    is_zip = zipfile.is_zipfile(path)
    if is_zip and verify:
        verify_crcs(path)
    try:
        # The legacy (non-zip) format cannot be mapped; a truncated zip fails here as well.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as error:
        what = "it cannot be read as a checkpoint (truncated, or not a checkpoint"
        raise CorruptCheckpointError(path, f"{what}: {_first_line(error)})") from error
    if not isinstance(checkpoint, dict):
        raise CorruptCheckpointError(path, f"it holds a {type(checkpoint).__name__}, not a Lightning checkpoint")
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint]
    if missing:
        raise CorruptCheckpointError(path, f"it is no Lightning checkpoint (no {', '.join(missing)})")
    return checkpoint


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, newest first by the modification time of the file they resolve to (``last.ckpt``
    first among equals); a dangling link is no checkpoint, and a file and the links to it count once."""
    if not folder.is_dir():
        return []
    found: dict[Path, tuple[float, bool, Path]] = {}
    for path in folder.glob(f"*{ModelCheckpoint.FILE_EXTENSION}"):
        if not path.is_file():
            continue
        real = path.resolve()
        is_last = path.name.startswith(ModelCheckpoint.CHECKPOINT_NAME_LAST)
        key = (real.stat().st_mtime, is_last, path)
        if real not in found or key[:2] > found[real][:2]:
            found[real] = key
    return [path for _, _, path in sorted(found.values(), key=lambda entry: entry[:2], reverse=True)]


__all__ = ["REQUIRED_KEYS", "CorruptCheckpointError", "checkpoint_files", "describe", "read_checkpoint", "verify_crcs"]
