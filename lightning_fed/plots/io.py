"""Saving figures without ever leaving a half-written file behind."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lightning_fed.checks import InvalidArgumentError, check_int
from lightning_fed.utilities.atomic import atomic_write


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
        DiskFullError: If the disk is full; a previous file at ``path`` is left intact.
        ValueError: If ``path`` has no suffix or one matplotlib cannot write, or ``dpi`` is not positive.
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    # Agg's list covers the vector formats too; querying the class leaves the figure's own canvas untouched.
    supported = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in supported:
        raise InvalidArgumentError("path", str(path), f"a file name ending in one of {sorted(supported)}")
    check_int("dpi", dpi, minimum=1)
    return atomic_write(path, lambda stream: fig.savefig(stream, format=fmt, dpi=dpi))
