"""Saving figures without ever leaving a half-written file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lightning_fed.checks import InvalidArgumentError, check_int


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Writes ``fig`` to ``path`` atomically and returns the path.

    The image is rendered into a temporary file in the destination directory and moved into place with
    ``os.replace``, so a reader (a dashboard, a logger uploading artifacts, a concurrent run) sees either the old file
    or the complete new one, and a crash mid-render leaves no partial file.

    Args:
        fig: The figure; it needs no pyplot backend.
        path: Destination; its suffix (``.png``, ``.pdf``, ``.svg``, ...) chooses the format. Missing parent
            directories are created.
        dpi: Resolution of raster formats.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: If ``path`` has no suffix or one matplotlib cannot write, or ``dpi`` is not positive.
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    # Agg's list covers the vector formats too; querying the class leaves the figure's own canvas untouched.
    supported = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in supported:
        raise InvalidArgumentError("path", str(path), f"a file name ending in one of {sorted(supported)}")
    check_int("dpi", dpi, minimum=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            fig.savefig(stream, format=fmt, dpi=dpi)
        # mkstemp creates the file private (0600); give the result the permissions an ordinary write would.
        os.chmod(tmp_name, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
