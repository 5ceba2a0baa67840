"""Per-client label histograms of a federated partition, with each client's earth mover's distance (EMD).

Zhao et al. (2018, arXiv:1806.00582) show that FedAvg's accuracy loss on non-IID data grows with the EMD between a
client's label distribution and the population's; this chart shows both side by side.
"""

from __future__ import annotations

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from torch import Tensor

from lightning_fed.checks import check_int

# Beyond this many classes a legend would cover the chart; colours alone then distinguish classes.
_MAX_LEGEND_CLASSES = 20


def _class_colors(num_classes: int) -> list[tuple[float, float, float, float]]:
    """Qualitative colours for up to 20 classes, a continuous map beyond."""
    if num_classes <= 10:
        return [matplotlib.colormaps["tab10"](c) for c in range(num_classes)]
    if num_classes <= 20:
        return [matplotlib.colormaps["tab20"](c) for c in range(num_classes)]
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(c / (num_classes - 1)) for c in range(num_classes)]


def _validate(histogram: Tensor, emd: Tensor | None, class_names: list[str] | None, max_clients: int) -> None:
    if not isinstance(histogram, Tensor) or histogram.dim() != 2 or histogram.numel() == 0:
        shape = "a non-empty [num_clients, num_classes] tensor"
        raise ValueError(f"`histogram` must be {shape}; got {_describe(histogram)}.")
    if bool((histogram < 0).any()):
        raise ValueError(f"`histogram` must hold non-negative counts; got minimum {histogram.min().item()}.")
    num_clients, num_classes = histogram.shape
    if emd is not None and (not isinstance(emd, Tensor) or emd.shape != (num_clients,)):
        raise ValueError(f"`emd` must be a tensor of shape [{num_clients}] (one per client); got {_describe(emd)}.")
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"`class_names` must have {num_classes} entries (one per class); got {len(class_names)}.")
    check_int("max_clients", max_clients, minimum=1)


def _describe(value: object) -> str:
    """A tensor's shape, or any other value's type: what a shape error should show instead of the data."""
    return f"shape {list(value.shape)}" if isinstance(value, Tensor) else f"a {type(value).__name__}"


def _title(histogram: Tensor, emd: Tensor | None, shown: int) -> str:
    num_clients = histogram.shape[0]
    title = f"Label histogram of {num_clients} clients"
    if shown < num_clients:
        title += f" (first {shown} shown)"
    if emd is not None:
        # Population-weighted over every client, shown or not, so the figure's summary never depends on max_clients.
        # Empty clients have an undefined (NaN) EMD and weigh nothing, as in functional.partition_stats.mean_emd.
        sizes = histogram.sum(dim=1).double()
        weighted = (sizes * emd.double().nan_to_num(0.0)).sum()
        mean_emd = float(weighted / sizes.sum()) if float(sizes.sum()) > 0 else float("nan")
        title += f"; weighted mean EMD = {mean_emd:.3f}"
    return title


def plot_label_histogram(
    histogram: Tensor,
    emd: Tensor | None = None,
    class_names: list[str] | None = None,
    max_clients: int = 100,
) -> Figure:
    """Draws one stacked bar per client, one colour per class, and optionally each client's EMD.

    Args:
        histogram: ``[N, C]`` label counts, row k for client k.
        emd: ``[N]`` per-client EMD to the population distribution, drawn as a line with markers on a secondary
            y axis; the title then also reports its mean weighted by client size.
        class_names: ``C`` legend labels; defaults to ``"class c"``. The legend is omitted beyond 20 classes.
        max_clients: Only the first ``max_clients`` clients are drawn (the title says so) to keep bars legible.

    Returns:
        The figure, whose first axes holds the ``min(N, max_clients) * C`` bar patches and whose second axes, when
        ``emd`` is given, holds the EMD line.

    Raises:
        ValueError: If an argument has the wrong shape or value; the message names it.
    """
    _validate(histogram, emd, class_names, max_clients)
    num_clients, num_classes = histogram.shape
    shown = min(num_clients, max_clients)
    names = class_names if class_names is not None else [f"class {c}" for c in range(num_classes)]
    fig = Figure(figsize=(min(max(6.5, 4.0 + 0.12 * shown), 16.0), 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _draw_bars(ax, histogram[:shown].detach().double().cpu(), names)
    handles, labels = ax.get_legend_handles_labels()
    if emd is not None:
        handles.append(_draw_emd(ax, emd[:shown].detach().double().cpu().tolist()))
        labels.append("EMD")
    if num_classes <= _MAX_LEGEND_CLASSES:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    ax.set_title(_title(histogram, emd, shown))
    return fig


def _draw_bars(ax: Axes, counts: Tensor, names: list[str]) -> None:
    """Stacks one bar segment per class on each client's bar."""
    shown, num_classes = counts.shape
    clients = list(range(shown))
    bottom = [0.0] * shown
    for c, color in enumerate(_class_colors(num_classes)):
        heights = counts[:, c].tolist()
        ax.bar(clients, heights, bottom=bottom, width=0.85, color=color, label=names[c], linewidth=0)
        bottom = [b + h for b, h in zip(bottom, heights)]
    # Autoscaling misses the tops of stacked bars once a twin axis is added, so the limit is set from the totals.
    ax.set_ylim(0.0, max(max(bottom, default=0.0), 1.0) * 1.05)
    ax.set_xlabel("client id")
    ax.set_ylabel("examples")
    ax.set_xlim(-0.6, shown - 0.4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_emd(ax: Axes, values: list[float]) -> Line2D:
    """Draws the per-client EMD on a secondary y axis that starts at 0 (EMD is non-negative)."""
    emd_ax = ax.twinx()
    (line,) = emd_ax.plot(range(len(values)), values, "k-o", markersize=3, label="EMD")
    emd_ax.set_ylabel("EMD")
    emd_ax.set_ylim(bottom=0.0)
    return line
