"""The distribution of per-client accuracy, as in FedAMP's Fig. 2 (Huang et al., AAAI 2021, arXiv:2007.03797): a mean
hides the clients a personalised method leaves behind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lightning_fed.checks import InvalidArgumentError, check_int


def plot_client_accuracy(
    accuracies: Mapping[str, Sequence[float]],
    title: str | None = None,
    bins: int = 20,
) -> Figure:
    """Draws, per method (or per round), a violin of the clients' accuracies beside their overlaid histograms.

    Args:
        accuracies: Label (e.g. method name) to the accuracy of each client, in [0, 1]; at least one label, and no
            empty list.
        title: Figure title; none when ``None``.
        bins: Histogram bins over [0, 1].

    Returns:
        A figure with two axes: violins (one per label, mean marked) and the histograms.

    Raises:
        ValueError: If ``accuracies`` is empty, a label has no values, or ``bins`` is not a positive integer.
    """
    if not accuracies:
        raise InvalidArgumentError("accuracies", accuracies, "a mapping of at least one label to per-client accuracies")
    empty = [label for label, values in accuracies.items() if len(values) == 0]
    if empty:
        raise ValueError(
            f"`accuracies` must hold values for every label; got none for {empty}: evaluate the clients first."
        )
    check_int("bins", bins, minimum=1)
    labels = list(accuracies)
    data = [[float(v) for v in accuracies[label]] for label in labels]
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    violin_ax, hist_ax = fig.subplots(1, 2)
    # A violin needs spread: a single client (or identical accuracies) is drawn as points instead.
    positions = list(range(1, len(labels) + 1))
    drawable = [i for i, values in enumerate(data) if len(set(values)) > 1]
    if drawable:
        violin_ax.violinplot([data[i] for i in drawable], positions=[positions[i] for i in drawable], showmeans=True)
    for position, values in zip(positions, data):
        violin_ax.scatter([position] * len(values), values, s=6, alpha=0.4, color="black")
    violin_ax.set_xticks(positions, labels, rotation=30, ha="right")
    violin_ax.set_ylabel("client test accuracy")
    violin_ax.set_ylim(-0.02, 1.02)
    for label, values in zip(labels, data):
        mean = sum(values) / len(values)
        hist_ax.hist(values, bins=bins, range=(0.0, 1.0), alpha=0.5, label=f"{label} (mean {mean:.3f})")
    hist_ax.set_xlabel("client test accuracy")
    hist_ax.set_ylabel("clients")
    hist_ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


__all__ = ["plot_client_accuracy"]
