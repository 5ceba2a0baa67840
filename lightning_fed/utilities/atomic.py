"""Writing a file so that a reader never sees it half-written: a temporary file in the same directory, moved into place.

Every file a run leaves behind (``config.yaml``, ``summary.json``, plots, checkpoints) goes through
:func:`atomic_write`. A crash, a kill or a full disk during the write leaves the previous version of the file intact
(and no temporary file); a reader (a dashboard, a resume, a concurrent run) sees either the old file or the complete
new one.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


class DiskFullError(OSError):
    """A write failed because the file system is full (``ENOSPC``) or the user's quota is spent (``EDQUOT``)."""


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Writes a file atomically: ``write(stream)`` fills a temporary file beside ``path``, which then replaces it.

    The data is flushed to disk (``fsync``) before the rename, so that after a power cut the new name never points
    at missing data. The result gets the permissions of the file it replaces, or those of an ordinary new file.

    Args:
        path: Destination. Missing parent directories are created.
        write: Writes the content to the binary stream it is given.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        DiskFullError: The disk (or quota) is full; ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        # mkstemp creates the file private (0600): give it the permissions the replaced or an ordinary file has.
        os.chmod(tmp_name, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp_name, path)
    except BaseException as error:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            raise DiskFullError(
                error.errno,
                f"The disk is full: writing {path.name} in {path.parent} failed ({os.strerror(error.errno)}); the"
                " previous version of the file is intact. Free some space, then resume the run.",
            ) from error
        raise
    return path


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Writes ``text`` to ``path`` atomically (see :func:`atomic_write`)."""
    data = text.encode(encoding)

    def write(stream: IO[bytes]) -> None:
        stream.write(data)

    return atomic_write(path, write)


__all__ = ["DiskFullError", "atomic_write", "write_text_atomic"]
