"""Metric curves over communication rounds, e.g. the accuracy-vs-rounds plots of Zhao et al. (2018, arXiv:1806.00582)
and Wang et al. ("Distribution-Regularized Federated Learning on Non-IID Data", ICDE 2023)."""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lightning_fed.checks import InvalidArgumentError

# Markers help read sparse curves but clutter dense ones.
_MAX_MARKED_POINTS = 50


def _points(history: list[dict[str, Any]], key: str, x_key: str) -> tuple[list[float], list[float]]:
    """The (x, y) pairs of the entries that hold ``key``; an entry without ``x_key`` uses its index."""
    xs, ys = [], []
    for index, entry in enumerate(history):
        value = entry.get(key)
        if value is None:
            continue
        xs.append(float(entry.get(x_key, index)))
        ys.append(float(value))
    return xs, ys


def _curves(history: list[dict[str, Any]], keys: list[str], x_key: str) -> dict[str, tuple[list[float], list[float]]]:
    if not keys:
        raise InvalidArgumentError("keys", keys, "a list naming at least one metric")
    curves = {key: _points(history, key, x_key) for key in keys}
    missing = [key for key, (xs, _) in curves.items() if not xs]
    if missing:
        raise ValueError(f"`keys` must name metrics that `history` holds; got {missing}, which occur in no entry.")
    return curves


def plot_round_curves(
    history: list[dict[str, Any]],
    keys: list[str],
    x_key: str = "round",
    title: str | None = None,
) -> Figure:
    """Draws one line per metric over rounds.

    Args:
        history: One dict per round, e.g. ``{"round": 3, "val_acc": 0.81}``; values may be anything ``float()``
            accepts, such as 0-d tensors.
        keys: Metrics to draw, one line each, in legend order. A round that lacks a key (or holds ``None``) is
            skipped for that line only, so metrics evaluated every few rounds still draw as connected lines.
        x_key: The entry holding the x value; entries without it use their position in ``history``.
        title: Axes title; none when ``None``.

    Returns:
        The figure; its single axes holds exactly ``len(keys)`` lines, in the order of ``keys``.

    Raises:
        ValueError: If ``keys`` is empty or a key occurs in no entry (usually a typo in the metric name).
    """
    curves = _curves(history, keys, x_key)
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for key, (xs, ys) in curves.items():
        marker = "o" if len(xs) <= _MAX_MARKED_POINTS else None
        ax.plot(xs, ys, marker=marker, markersize=3, label=key)
    ax.set_xlabel(x_key)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    if title is not None:
        ax.set_title(title)
    return fig
