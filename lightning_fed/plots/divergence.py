"""Weight divergence per layer over rounds (Zhao et al. 2018, arXiv:1806.00582, Fig. 2)."""

from __future__ import annotations

from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure

from lightning_fed.plots.curves import plot_round_curves


def plot_weight_divergence(history: list[dict[str, Any]], keys: list[str], title: str | None = None) -> Figure:
    r"""One line per layer of :math:`\lVert w^{\text{FedAvg}} - w^{\text{SGD}} \rVert / \lVert w^{\text{SGD}}
    \rVert` over rounds, on a log scale (divergences span orders of magnitude between layers and splits).

    Args:
        history: Round entries as in ``summary.json``'s ``"history"``, holding ``divergence/<name>`` values logged
            by :class:`~lightning_fed.callbacks.weight_divergence.WeightDivergence`.
        keys: The ``divergence/...`` keys to draw, in legend order.
        title: Axes title; defaults to "Weight divergence from centralised SGD".

    Returns:
        The figure; its single axes holds ``len(keys)`` lines.

    Raises:
        ValueError: If ``keys`` is empty or a key occurs in no entry.
    """
    fig = plot_round_curves(history, keys, title=title or "Weight divergence from centralised SGD")
    ax = fig.axes[0]
    values = [float(entry[key]) for entry in history for key in keys if entry.get(key) is not None]
    # A log axis cannot show zeros (exact agreement with the twin): keep it linear then.
    if values and min(values) > 0:
        ax.set_yscale("log")
    ax.set_ylabel(r"$\|w_{FedAvg} - w_{SGD}\| \,/\, \|w_{SGD}\|$")
    _style(ax, keys)
    return fig


def _style(ax: Any, keys: list[str]) -> None:
    """Distinct colours for up to 20 layers, the whole-model total in bold black, labels without the prefix."""
    palette = [colormaps["tab20"](index) for index in range(20)]
    layers = [line for line, key in zip(ax.get_lines(), keys) if key != "divergence/total"]
    for index, line in enumerate(layers):
        line.set_color(palette[index % len(palette)])
    for line, key in zip(ax.get_lines(), keys):
        line.set_label(key.removeprefix("divergence/"))
        if key == "divergence/total":
            line.set_color("black")
            line.set_linewidth(2.5)
            line.set_zorder(3)
    ax.legend(fontsize="x-small", ncol=2)


__all__ = ["plot_weight_divergence"]
