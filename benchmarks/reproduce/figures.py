"""The report's figures, drawn with :mod:`lightning_fed.plots` from the runs' summaries: accuracy against rounds per
method, against EMD and against β, the per-client accuracy distributions, and FedAMP's ξ heatmaps (copied from the
run directories, where the FedAMP callback draws them)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from matplotlib.ticker import AutoLocator

from benchmarks.reproduce import measures
from benchmarks.reproduce.claims import Claim
from benchmarks.reproduce.measures import Summary
from lightning_fed.plots import plot_client_accuracy, plot_round_curves, save_figure


def _merged_history(curves: Mapping[str, tuple[Summary, str]]) -> list[dict[str, float]]:
    """One entry per round holding each curve's value under its label, for :func:`plot_round_curves`."""
    by_round: dict[float, dict[str, float]] = {}
    for label, (summary, key) in curves.items():
        for round_, value in measures.series(summary, key):
            by_round.setdefault(round_, {"round": round_})[label] = value
    return [by_round[round_] for round_ in sorted(by_round)]


def round_curves(claim: Claim, summaries: Mapping[str, Summary], path: Path) -> Path | None:
    """Accuracy against rounds, one line per method of the claim that ran; ``None`` when none did."""
    curves = {}
    for label, name in claim.curves:
        if name in summaries:
            summary = summaries[name]
            key = claim.curve_metric or measures.mean_client_accuracy_key(summary)
            curves[label] = (summary, key)
    if not curves:
        return None
    figure = plot_round_curves(_merged_history(curves), list(curves), title=f"Claim {claim.number}: {claim.key}")
    figure.axes[0].set_ylabel(claim.curve_metric or "mean client accuracy (BMTA's per-round value)")
    return save_figure(figure, path)


def accuracy_vs(points: Mapping[float, float], x_label: str, title: str, path: Path) -> Path | None:
    """Final accuracy against a sweep variable (EMD, β); ``None`` without points."""
    if not points:
        return None
    history = [{x_label: x, "final global test accuracy": y} for x, y in sorted(points.items())]
    figure = plot_round_curves(history, ["final global test accuracy"], x_key=x_label, title=title)
    # The sweep variable is continuous; plot_round_curves' integer ticks are meant for rounds.
    figure.axes[0].xaxis.set_major_locator(AutoLocator())
    figure.axes[0].set_ylabel("final global test accuracy")
    return save_figure(figure, path)


def client_distribution(
    curves: tuple[tuple[str, str], ...], summaries: Mapping[str, Summary], title: str, path: Path
) -> Path | None:
    """Each method's per-client accuracies in its last evaluation (FedAMP's Fig. 2); ``None`` without data."""
    accuracies = {}
    for label, name in curves:
        if name in summaries:
            try:
                accuracies[label] = measures.client_accuracies(summaries[name])
            except measures.MissingMetricError:
                continue
    if not accuracies:
        return None
    return save_figure(plot_client_accuracy(accuracies, title=title), path)


def copy_xi_heatmaps(run_dirs: Mapping[str, Path], out_dir: Path) -> list[Path]:
    """Copies each run's latest ξ heatmap (a PNG with "xi" in its path inside the run directory, outside W&B's own
    folder; the names sort by round, as FedAMP's ``xi/round_NNNN.png``) to ``out_dir/xi_<run>.png``."""
    copied = []
    for name, run_dir in sorted(run_dirs.items()):
        heatmaps = sorted(
            path
            for path in run_dir.rglob("*.png")
            if "xi" in path.relative_to(run_dir).as_posix() and "wandb" not in path.relative_to(run_dir).parts
        )
        if heatmaps:
            target = out_dir / f"xi_{name}.png"
            shutil.copyfile(heatmaps[-1], target)
            copied.append(target)
    return copied


__all__ = ["accuracy_vs", "client_distribution", "copy_xi_heatmaps", "round_curves"]
