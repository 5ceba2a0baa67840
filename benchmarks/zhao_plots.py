"""Test accuracy against EMD and against the shared fraction β, from runs' ``summary.json`` files.

Zhao, Li, Lai, Suda, Civin, Chandra, "Federated Learning with Non-IID Data", arXiv:1806.00582: Fig. 5(a) (test
accuracy vs EMD, mean and standard deviation over 5 distributions per EMD) and Fig. 6/7 (test accuracy vs β, the
globally shared fraction |G| / |D|, one curve per α).

Usage (from the repository root)::

    python benchmarks/zhao_plots.py 'runs/zhao_emd/*/summary.json' --out-dir plots/zhao
    python benchmarks/zhao_plots.py runs/zhao_sharing/beta0.05_alpha0.5 runs/zhao_sharing/beta0.1_alpha0.5

Arguments are summary files, run directories (``<dir>/summary.json``) or globs of either. Each summary gives
``mean_emd`` (the x of the EMD plot, grouped after rounding to ``--emd-decimals``) and the accuracy ``--metric``
from ``final`` (else its last value in ``history``). Points are the mean over runs with the same x, error bars the
sample standard deviation (ddof 1; 0 for a single run).

β and α of a run, first found wins:
    1. ``--label PATTERN=beta=0.05`` (repeatable; PATTERN is an ``fnmatch`` glob on the summary path, and the
       value may be ``beta`` or ``alpha``), for runs whose β is known only to the person running them;
    2. the summary's ``final`` or first ``history`` entry under ``--beta-key`` / ``--alpha-key`` (default
       ``sharing/beta`` and ``sharing/alpha``, as logged by data sharing);
    3. ``beta<value>`` / ``alpha<value>`` in the summary's path, e.g. ``runs/beta0.05_alpha0.5/summary.json``;
    4. ``data.init_args.sharing.beta`` / ``.alpha`` in a LightningCLI ``config.yaml`` beside the summary or in
       ``run_dir``; a run with no sharing config has β = 0.
Runs without β are left out of the β plot. Writes ``accuracy_vs_emd.png``, ``accuracy_vs_beta.png`` (when some run
has β) and ``zhao_points.json`` (the plotted points) into ``--out-dir`` and prints the points as a table.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:[eE]-?[0-9]+)?)"


@dataclass
class Run:
    path: Path
    emd: float
    accuracy: float
    labels: dict[str, float] = field(default_factory=dict)


def find_summaries(patterns: list[str]) -> list[Path]:
    """Summary files named by paths, run directories or globs; raises if a pattern matches nothing."""
    found: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) or ([pattern] if Path(pattern).exists() else [])
        paths = [Path(m) / "summary.json" if Path(m).is_dir() else Path(m) for m in matches]
        paths = [p for p in paths if p.is_file()]
        if not paths:
            raise FileNotFoundError(f"{pattern!r} matches no summary.json: pass summary files, run dirs or globs.")
        found += [p for p in paths if p not in found]
    return found


def _metric(summary: dict[str, Any], key: str) -> float | None:
    if summary.get("final", {}).get(key) is not None:
        return float(summary["final"][key])
    values = [entry[key] for entry in summary.get("history", []) if entry.get(key) is not None]
    return float(values[-1]) if values else None


def _config_value(summary_path: Path, summary: dict[str, Any], name: str) -> float | None:
    import yaml

    for folder in (summary_path.parent, Path(summary.get("run_dir", summary_path.parent))):
        config_path = folder / "config.yaml"
        if config_path.is_file():
            config = yaml.safe_load(config_path.read_text()) or {}
            sharing = ((config.get("data") or {}).get("init_args") or {}).get("sharing")
            if isinstance(sharing, dict) and name in sharing:
                return float(sharing[name])
            # A saved config without sharing is a run without shared data: beta = 0 (alpha is then meaningless).
            return 0.0 if name == "beta" else None
    return None


Override = tuple[str, str, float]


def run_label(path: Path, summary: dict[str, Any], name: str, key: str, overrides: list[Override]) -> float | None:
    """β or α (``name``) of one run, from the sources in the module docstring, in that order."""
    for pattern, label, value in overrides:
        if label == name and fnmatch.fnmatch(str(path), pattern):
            return value
    first = summary.get("history", [{}])[0] if summary.get("history") else {}
    for entry in (summary.get("final", {}), first):
        if entry.get(key) is not None:
            return float(entry[key])
    match = re.search(rf"{name}[_=-]?{_NUMBER}", str(path))
    if match:
        return float(match.group(1))
    return _config_value(path, summary, name)


def load_runs(paths: list[Path], metric: str, beta_key: str, alpha_key: str, overrides: list[Override]) -> list[Run]:
    """Reads every summary; raises naming the file when it lacks the accuracy or the EMD."""
    runs = []
    for path in paths:
        summary = json.loads(path.read_text())
        accuracy = _metric(summary, metric)
        if accuracy is None or summary.get("mean_emd") is None:
            raise ValueError(f"{path} holds no {metric!r} or no 'mean_emd': pick the accuracy key with --metric.")
        labels = {
            name: run_label(path, summary, name, key, overrides)
            for name, key in (("beta", beta_key), ("alpha", alpha_key))
        }
        known = {k: v for k, v in labels.items() if v is not None}
        runs.append(Run(path, float(summary["mean_emd"]), accuracy, known))
    return runs


def group(values: list[tuple[float, float]]) -> list[tuple[float, float, float, int]]:
    """(x, y) pairs -> sorted (x, mean y, sample std of y, count)."""
    by_x: dict[float, list[float]] = {}
    for x, y in values:
        by_x.setdefault(x, []).append(y)
    return [
        (x, statistics.fmean(ys), statistics.stdev(ys) if len(ys) > 1 else 0.0, len(ys))
        for x, ys in sorted(by_x.items())
    ]


Points = list[tuple[float, float, float, int]]


def plot_series(series: dict[str, Points], xlabel: str, ylabel: str, title: str) -> Figure:
    """One error-bar line per series (mean ± std); the axes hold one line per series with one point per x."""
    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, points in series.items():
        xs, means, stds, _ = zip(*points)
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=name or None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if any(series):
        ax.legend(fontsize="small")
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """Writes the PNG atomically, like ``lightning_fed.plots.save_figure``, without importing torch and Lightning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, suffix=".png")
    os.close(handle)
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _parse_label(text: str) -> tuple[str, str, float]:
    parts = text.rsplit("=", 2)
    if len(parts) != 3 or parts[1] not in ("beta", "alpha") or not parts[0]:
        raise argparse.ArgumentTypeError(f"--label {text!r}: write PATTERN=beta=VALUE or PATTERN=alpha=VALUE.")
    try:
        return parts[0], parts[1], float(parts[2])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--label {text!r}: VALUE must be a number.") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", help="summary.json files, run directories, or globs of them")
    parser.add_argument("--out-dir", default=".", help="where the PNGs and zhao_points.json go")
    parser.add_argument("--metric", default="global/test_acc", help="accuracy key in the summary's 'final'")
    parser.add_argument("--emd-decimals", type=int, default=2, help="EMD levels are grouped after rounding")
    parser.add_argument("--beta-key", default="sharing/beta")
    parser.add_argument("--alpha-key", default="sharing/alpha")
    parser.add_argument("--label", action="append", type=_parse_label, default=[], help="PATTERN=beta|alpha=VALUE")
    return parser


def beta_series(runs: list[Run]) -> dict[str, Points]:
    """Accuracy against beta, one series per alpha (``"alpha=0.5"``; ``""`` for runs with no alpha)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        if "beta" not in run.labels:
            continue
        alpha = run.labels.get("alpha")
        name = "" if alpha is None else f"alpha={alpha:g}"
        series.setdefault(name, []).append((run.labels["beta"], run.accuracy))
    return {name: group(values) for name, values in sorted(series.items())}


def _print_table(emd: Points, beta: dict[str, Points]) -> None:
    print("| series | x | mean | std | runs |\n|:--|--:|--:|--:|--:|")
    for name, rows in [("EMD", emd), *((f"beta {k}".strip(), v) for k, v in beta.items())]:
        for x, mean, std, count in rows:
            print(f"| {name} | {x:g} | {mean:.4f} | {std:.4f} | {count} |")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Draws the plots; returns the plotted points ``{"emd": [...], "beta": {series: [...]}}``."""
    args = _parser().parse_args(argv)
    runs = load_runs(find_summaries(args.summaries), args.metric, args.beta_key, args.alpha_key, args.label)
    out = Path(args.out_dir)
    emd = group([(round(run.emd, args.emd_decimals), run.accuracy) for run in runs])
    figure = plot_series({"": emd}, "mean EMD", args.metric, "Test accuracy vs EMD")
    save_figure(figure, out / "accuracy_vs_emd.png")
    beta = beta_series(runs)
    if beta:
        figure = plot_series(beta, "beta = |G| / |D|", args.metric, "Test accuracy vs shared fraction")
        save_figure(figure, out / "accuracy_vs_beta.png")
    points = {"emd": emd, "beta": beta}
    (out / "zhao_points.json").write_text(json.dumps(points, indent=2))
    _print_table(emd, beta)
    return points


if __name__ == "__main__":
    main(sys.argv[1:])
