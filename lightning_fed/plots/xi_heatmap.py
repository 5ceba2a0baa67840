r"""FedAMP's collaboration weights :math:`\xi` as a heatmap, as in the paper's Fig. 3 (Huang et al., AAAI 2021,
arXiv:2007.03797): on the practical non-IID split its blocks show which clients collaborate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_xi_heatmap(xi: torch.Tensor | Sequence[Sequence[float]], title: str | None = None) -> Figure:
    r"""Draws :math:`\xi` twice: whole, and without its diagonal on a colour scale of its own.

    FedAMP's self-weights :math:`\xi_{ii}` are often close to 1 and would wash out the off-diagonal weights on a
    shared colour scale; the second panel masks the diagonal so that the block structure between clients stays
    visible.

    Args:
        xi: ``(m, m)`` weights, row ``i`` being client ``i``'s combination of the models.
        title: Figure title; none when ``None``.

    Returns:
        A figure with two heatmap axes (plus their colour bars); x is the sender ``j``, y the receiver ``i``.

    Raises:
        ValueError: If ``xi`` is not a non-empty square matrix of finite values.
    """
    weights = torch.as_tensor(xi, dtype=torch.float64).cpu().numpy()
    if weights.ndim != 2 or weights.shape[0] != weights.shape[1] or weights.shape[0] == 0:
        raise ValueError(f"`xi` must be a non-empty square matrix; got shape {list(weights.shape)}.")
    if not np.isfinite(weights).all():
        raise ValueError("`xi` must hold finite values; got NaN or Inf: plot the weights of a finite round.")
    off_diagonal = np.ma.masked_array(weights, mask=np.eye(weights.shape[0], dtype=bool))
    fig = Figure(figsize=(11, 4.8))
    FigureCanvasAgg(fig)
    for ax, data, label in zip(fig.subplots(1, 2), (weights, off_diagonal), (r"$\xi_{ij}$", r"$\xi_{ij},\ j \neq i$")):
        image = ax.imshow(data, cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=ax, label=label)
        # Client ids are integers: no tick between two clients.
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("client j (sender)")
        ax.set_ylabel("client i (receiver)")
        ax.set_title(label)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


__all__ = ["plot_xi_heatmap"]
