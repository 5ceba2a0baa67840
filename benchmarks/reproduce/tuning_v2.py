"""``lightning-fed reproduce --protocol v2 --tune``: PROTOCOL.md's searches, their tuning runs and their report.

The comparisons (:data:`COMPARISONS`) follow PROTOCOL.md. Each round of the search runs what the current ladders
hold and has not run yet; :func:`benchmarks.reproduce.fair_search.assess` then says which ladders grow. Claim 5's
λ search (:data:`FEDCURV_RUN`) runs at the paper's η = 0.01 and is chosen by the fewest rounds to FedAvg's validation
accuracy at half its rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from benchmarks.reproduce import measures
from benchmarks.reproduce.claims import GLOBAL_ACC
from benchmarks.reproduce.experiments import Experiment
from benchmarks.reproduce.fair_search import (
    FEDCURV_LAMBDA_BOUNDS,
    Assessment,
    Comparison,
    Ladder,
    best_suffix,
    fewest_rounds_choice,
    ladder_cells,
    own_grid_edges,
    search_settings,
    setting_suffix,
)
from benchmarks.reproduce.measures import MissingMetricError
from benchmarks.reproduce.runner import NOT_RUN, RunResult
from benchmarks.reproduce.tuning import Setting, _tuning_args, compose, selection_metric, setting_overrides

_M = 20  # clients on the FedAMP splits


def _fedamp_own() -> tuple[Setting, ...]:
    return tuple(
        {
            "FedAMP.sigma": sigma,
            "FedAMP.alpha_k": round(sigma / (_M - 1), 6),
            "FedAMP.lam": round(0.1 * sigma / (_M - 1), 6),
        }
        for sigma in (0.1, 0.3, 1.0, 3.0)
    )


def _heurfedamp_own() -> tuple[Setting, ...]:
    return tuple(
        {"HeurFedAMP.sigma": sigma, "HeurFedAMP.self_weight": xi, "HeurFedAMP.lam": 0.01414}
        for sigma in (100.0, 1000.0)
        for xi in (0.3, 0.6)
    )


def _personalized(split: str, methods: Sequence[str]) -> Comparison:
    own: dict[str, tuple[Setting, ...] | None] = {
        "fedamp": _fedamp_own(),
        "heurfedamp": _heurfedamp_own(),
        "separate": None,
        "fedavg": None,
        "apfl": tuple({"APFL.alpha": alpha} for alpha in (0.1, 0.25, 0.5, 0.75)),
        "fedavg_ft": tuple({"FineTune.epochs": epochs} for epochs in (1, 2, 5, 10)),
        "fedprox_ft": tuple({"FedProx.mu": mu} for mu in (0.001, 0.01, 0.1, 1.0)),
    }
    return Comparison(split, (0.03, 0.1, 0.3), 4, {f"{split}_{method}": own[method] for method in methods})


def _mus(name: str, values: Sequence[float]) -> tuple[Setting, ...]:
    return tuple({name: value} for value in values)


#: PROTOCOL.md's comparisons: the methods, their own settings and the initial learning-rate cells.
COMPARISONS: tuple[Comparison, ...] = (
    _personalized("pathological", ("fedamp", "heurfedamp", "separate", "fedavg")),
    _personalized("practical", ("fedamp", "heurfedamp", "separate", "fedavg", "apfl", "fedavg_ft", "fedprox_ft")),
    Comparison(
        "similarity 0 %",
        (0.03, 0.1, 0.3),
        3,
        {
            "rfedavg_paper_sim0": _mus("RFedAvg.lam", (1e-5, 1e-4, 1e-3)),
            "fedavg_rfedavg_sim0": None,
            "fedprox_rfedavg_sim0": _mus("FedProx.mu", (0.01, 0.1, 1.0)),
            "scaffold_rfedavg_sim0": None,
            "qfedavg_rfedavg_sim0": _mus("aggregator.q", (0.1, 1.0, 5.0)),
        },
    ),
    Comparison(
        "Dirichlet 0.1",
        (0.003, 0.01, 0.03),
        4,
        {
            "fedgg_fmnist_beta01": _mus("FedGG.mu", (0.001, 0.01, 0.1, 1.0)),
            "fedavg_fmnist_beta01": None,
            "fedprox_fmnist_beta01": _mus("FedProx.mu", (0.001, 0.01, 0.1, 1.0)),
            "scaffold_fmnist_beta01": None,
        },
    ),
)

#: Claim 5: FedCurv's λ search and the FedAvg run that sets its validation target (both at η = 0.01).
FEDCURV_RUN, FEDCURV_REFERENCE = "fedcurv_paper", "fedavg_fedcurv"


def comparisons_for(names: Sequence[str]) -> list[Comparison]:
    """The comparisons with at least one method among ``names``, restricted to those methods."""
    chosen = []
    for comparison in COMPARISONS:
        methods = {run: own for run, own in comparison.methods.items() if run in names}
        if methods:
            chosen.append(replace(comparison, methods=methods))
    return chosen


def tuning_run(
    experiment: Experiment, suffix: str, setting: Setting, root: Path, out_dir: Path, fraction: float
) -> Experiment:
    """``experiment`` with ``setting`` applied, on validation data, for ``fraction`` of its rounds, seed 0."""
    composed = compose(root, experiment.configs)
    settings_dir = out_dir / "settings"
    settings_dir.mkdir(parents=True, exist_ok=True)
    path = settings_dir / f"{experiment.name}__{suffix}.yaml"
    path.write_text(yaml.safe_dump(setting_overrides(composed, setting, experiment.name), sort_keys=False))
    return replace(
        experiment,
        name=f"{experiment.name}__{suffix}",
        configs=(*experiment.configs, str(path)),
        args=(*experiment.args, *_tuning_args(composed, fraction)),
        seed=0,
    )


def ladder_runs(
    comparison: Comparison,
    ladder: Ladder,
    experiments: Mapping[str, Experiment],
    root: Path,
    out_dir: Path,
    fraction: float,
) -> list[Experiment]:
    """Every tuning run of ``comparison`` over ``ladder``."""
    return [
        tuning_run(experiments[run], suffix, setting, root, out_dir, fraction)
        for run in comparison.methods
        for suffix, setting in search_settings(comparison, run, ladder).items()
    ]


def scores_of(
    comparison: Comparison, ladder: Ladder, results: Mapping[str, RunResult]
) -> dict[str, dict[str, float | None]]:
    """Run -> suffix -> validation score (``None``: the run failed); a setting that has not run has no entry."""
    scores: dict[str, dict[str, float | None]] = {}
    for run in comparison.methods:
        metric = selection_metric(run)
        scores[run] = {}
        for suffix in search_settings(comparison, run, ladder):
            result = results.get(f"{run}__{suffix}")
            if result is None or result.error == NOT_RUN:
                continue
            try:
                scores[run][suffix] = metric(result.summary()) if result is not None and result.ok else None
            except MissingMetricError:
                scores[run][suffix] = None
    return scores


def _fedcurv_reference(results: Mapping[str, RunResult]) -> measures.Summary | None:
    """The summary of claim 5's FedAvg reference tuning run, ``None`` unless it succeeded."""
    reference = results.get(f"{FEDCURV_REFERENCE}__ref")
    return reference.summary() if reference is not None and reference.ok else None


def fedcurv_target(reference: measures.Summary) -> float:
    """Claim 5's validation target (PROTOCOL.md): the FedAvg reference's accuracy at half its rounds."""
    return measures.at_fraction(reference, GLOBAL_ACC, 0.5)


def fedcurv_results(
    results: Mapping[str, RunResult], lambdas: Sequence[float]
) -> dict[float, tuple[float | None, float]]:
    """λ -> (rounds to FedAvg's validation accuracy at half its rounds, last-5 validation accuracy), for the λ runs
    that succeeded; empty when the FedAvg reference run did not."""
    reference = _fedcurv_reference(results)
    if reference is None:
        return {}
    target = fedcurv_target(reference)
    table: dict[float, tuple[float | None, float]] = {}
    for lam in lambdas:
        result = results.get(f"{FEDCURV_RUN}__lam{lam:g}")
        if result is not None and result.ok:
            summary = result.summary()
            table[lam] = (
                measures.rounds_to_reach(summary, GLOBAL_ACC, target),
                measures.tail_mean(summary, GLOBAL_ACC),
            )
    return table


def fedcurv_reference_line(results: Mapping[str, RunResult]) -> str | None:
    """What claim 5's λ search aims at: the FedAvg reference run's validation accuracy at half its rounds (the
    target), and its last-5 accuracy; ``None`` when that run did not succeed."""
    summary = _fedcurv_reference(results)
    if summary is None:
        return None
    rounds, target = measures.series(summary, GLOBAL_ACC)[-1][0], fedcurv_target(summary)
    return (
        f"Target: FedAvg's validation accuracy at round {rounds / 2:g} of {rounds:g}, {100 * target:.2f} % "
        f"(the reference run `{FEDCURV_REFERENCE}__ref`, η = 0.01; its last-5 accuracy "
        f"{100 * measures.tail_mean(summary, GLOBAL_ACC):.2f} %)."
    )


def fedcurv_choice_status(fedcurv: Mapping[float, tuple[float | None, float]]) -> str:
    """The λ choice and where it sits: *bounded* at PROTOCOL.md's bounds, *edge* at an end of the λ values run
    (the search extends it), else *interior*; or that no λ reached the target."""
    choice = fewest_rounds_choice(fedcurv)
    if choice is None:
        return "Choice: none (no λ reached the target)."
    run = sorted(fedcurv)
    if choice in FEDCURV_LAMBDA_BOUNDS:
        where = f"bounded (λ ∈ [{FEDCURV_LAMBDA_BOUNDS[0]:g}, {FEDCURV_LAMBDA_BOUNDS[1]:g}])"
    elif choice in (run[0], run[-1]):
        where = "edge (the λ values run so far)"
    else:
        where = "interior"
    return f"Choice: λ = {choice:g}, {where}."


def write_report(
    out_dir: Path,
    outcomes: Sequence[tuple[Comparison, Ladder, Assessment, Mapping[str, Mapping[str, float | None]]]],
    fedcurv: Mapping[float, tuple[float | None, float]],
    context: Mapping[str, str],
    fedcurv_reference: str | None = None,
) -> Path:
    """``TUNING.md``: per comparison, each method's budget, choice and status (interior / edge / bounded by the
    learning-rate rule, plus *edge (own grid)* where the choice sits at an end of the method's own grid), then the
    search table with every setting's validation score; claim 5's λ table."""
    lines = ["# Hyperparameter search, protocol v2 (validation data only; PROTOCOL.md)", ""]
    lines += [f"- {key}: {value}" for key, value in context.items()] + [""]
    for comparison, ladder, outcome, scores in outcomes:
        lines += [
            f"## {comparison.name}",
            "",
            "| run | settings | choice | validation score, % | status |",
            "|---|---|---|---|---|",
        ]
        for run in comparison.methods:
            run_scores = scores.get(run, {})
            settings = search_settings(comparison, run, ladder)
            # The same choice as the preset written from it (ties: the lower cell, then the first setting).
            best = best_suffix(run_scores)
            choice = "–" if best is None else ", ".join(f"{k}={v:g}" for k, v in settings[best].items())
            best_score = None if best is None else run_scores[best]
            score = "–" if best_score is None else f"{100 * best_score:.2f}"
            status = outcome.status.get(run, "–")
            edges = [] if best is None else own_grid_edges(comparison, run, best)
            if edges:
                status += "; edge (own grid): " + ", ".join(edges)
            lines.append(f"| {run} | {len(settings)} | {choice} | {score} | {status} |")
        lines += ["", *_search_table(comparison, ladder, scores), ""]
    if fedcurv:
        choice = fewest_rounds_choice(fedcurv)
        lines += [
            "## FedCurv λ (claim 5, η = 0.01)",
            "",
            "| λ | rounds to target | last-5 accuracy, % |",
            "|---|---|---|",
        ]
        for lam, (rounds, accuracy) in sorted(fedcurv.items()):
            cells = [f"{lam:g}", "never" if rounds is None else f"{rounds:g}", f"{100 * accuracy:.2f}"]
            if lam == choice:
                cells = [f"**{cell}**" for cell in cells]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", *([fedcurv_reference] if fedcurv_reference else []), fedcurv_choice_status(fedcurv)]
    path = out_dir / "TUNING.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _search_table(
    comparison: Comparison, ladder: Ladder, scores: Mapping[str, Mapping[str, float | None]]
) -> list[str]:
    """Every setting's validation score (%): a row per method and own setting (or per rate j of a method without
    own settings, whose rate is given in its cell), a column per learning-rate cell; "–" not run yet, "failed"."""
    cells = ladder_cells(comparison, ladder)
    lines = [
        f"Search table, {comparison.name} (validation score, %; columns: the learning-rate cells):",
        "",
        "| run | setting | " + " | ".join(f"lr {lr:g}" for lr in cells.values()) + " |",
        "|---|---|" + "---:|" * len(cells),
    ]
    for run in comparison.methods:
        settings = search_settings(comparison, run, ladder)
        run_scores = scores.get(run, {})
        own = comparison.methods[run]
        for j in range(comparison.k):
            label = (
                f"rate {j + 1} of {comparison.k}" if own is None else ", ".join(f"{k}={v:g}" for k, v in own[j].items())
            )
            row = []
            for index in cells:
                suffix = setting_suffix(index, j)
                score = run_scores.get(suffix)
                text = "–" if suffix not in run_scores else "failed" if score is None else f"{100 * score:.2f}"
                row.append(f"{text} (lr {settings[suffix]['lr']:g})" if own is None else text)
            lines.append(f"| {run} | {label} | " + " | ".join(row) + " |")
    return lines


__all__ = [
    "COMPARISONS",
    "FEDCURV_REFERENCE",
    "FEDCURV_RUN",
    "comparisons_for",
    "fedcurv_choice_status",
    "fedcurv_reference_line",
    "fedcurv_results",
    "fedcurv_target",
    "ladder_runs",
    "scores_of",
    "tuning_run",
    "write_report",
]
