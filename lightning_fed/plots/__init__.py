"""Figures for partitions and training curves, built on ``matplotlib.figure.Figure`` with the Agg canvas so that
importing this package never selects or changes a pyplot backend."""

from __future__ import annotations

from lightning_fed.plots.client_accuracy import plot_client_accuracy
from lightning_fed.plots.curves import plot_round_curves
from lightning_fed.plots.divergence import plot_weight_divergence
from lightning_fed.plots.io import save_figure
from lightning_fed.plots.partition import plot_label_histogram
from lightning_fed.plots.xi_heatmap import plot_xi_heatmap

__all__ = [
    "plot_client_accuracy",
    "plot_label_histogram",
    "plot_round_curves",
    "plot_weight_divergence",
    "plot_xi_heatmap",
    "save_figure",
]
