"""``lightning-fed reproduce --protocol v2 --tune``: PROTOCOL.md's search, round after round.

Each round runs the tuning runs the current ladders hold and that have not succeeded yet (a rerun picks up where
the last one stopped), applies the edge-extension rule, and goes on while a ladder grows. Claim 5's λ search runs
its stages the same way. ``--report-only`` replays the rule on the finished runs; ``--list`` prints the first
round's commands and counts them. ``--write-presets`` writes each choice to ``configs/tuned_v2/<run>.yaml``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from benchmarks.reproduce.experiments import TUNED_DIR_V2, Experiment, without_tuned
from benchmarks.reproduce.fair_search import (
    Comparison,
    Ladder,
    assess,
    best_suffix,
    fedcurv_lambda_grid,
    fewest_rounds_choice,
    search_settings,
)
from benchmarks.reproduce.records import copy_beside_records, recorded_results, set_dir, set_name
from benchmarks.reproduce.report import invocation_context
from benchmarks.reproduce.runner import (
    RunResult,
    WandbOptions,
    fit_args,
    load_results,
    run_all,
    run_dir_of,
    shown_command,
)
from benchmarks.reproduce.tuning import compose, setting_overrides
from benchmarks.reproduce.tuning_v2 import (
    FEDCURV_REFERENCE,
    FEDCURV_RUN,
    comparisons_for,
    fedcurv_reference_line,
    fedcurv_results,
    ladder_runs,
    scores_of,
    tuning_run,
    write_report,
)


def _fedcurv_runs(
    experiments: dict[str, Experiment], lambdas: Sequence[float], root: Path, out_dir: Path
) -> list[Experiment]:
    """The FedAvg reference and one run per λ, each the small profile's full rounds (the criterion needs mid-curve)."""
    runs = [tuning_run(experiments[FEDCURV_REFERENCE], "ref", {}, root, out_dir, 1.0)]
    runs += [
        tuning_run(experiments[FEDCURV_RUN], f"lam{lam:g}", {"FedCurv.lam": lam}, root, out_dir, 1.0) for lam in lambdas
    ]
    return runs


def tune_v2(
    args: argparse.Namespace,
    argv: list[str],
    experiments: list[Experiment],
    out_dir: Path,
    root: Path,
    wandb: WandbOptions | None,
) -> int:
    # The search composes the presets alone, also where configs/tuned_v2 already holds a choice.
    by_name = {experiment.name: without_tuned(experiment, TUNED_DIR_V2) for experiment in experiments}
    comparisons = comparisons_for(list(by_name))
    ladders: dict[str, Ladder] = {comparison.name: Ladder() for comparison in comparisons}
    fedcurv = FEDCURV_RUN in by_name and FEDCURV_REFERENCE in by_name
    lambdas: list[float] = list(fedcurv_lambda_grid()[0]) if fedcurv else []
    results: dict[str, RunResult] = {}
    reused: list[RunResult] = []  # finished before this invocation (a search resumed after a stop)
    start = time.perf_counter()
    failed = False
    records_dir = getattr(args, "records_dir", None) or set_dir(set_name("v2", args.profile, tune=True))
    recorded = recorded_results(Path(records_dir)) if args.report_only else {}
    for round_ in range(1, 100):
        pending = [
            run
            for comparison in comparisons
            for run in ladder_runs(comparison, ladders[comparison.name], by_name, root, out_dir, args.tune_rounds)
        ]
        if fedcurv:
            pending += _fedcurv_runs(by_name, lambdas, root, out_dir)
        pending = [run for run in pending if not (run.name in results and results[run.name].ok)]
        if args.list:
            for run in pending:
                print(shown_command(fit_args(run, args.profile, run_dir_of(out_dir, run.run_name), root, wandb), root))
            print(f"# {len(pending)} tuning runs in the first round (before any edge extension)", file=sys.stderr)
            return 0
        if args.report_only:
            # A search replayed from its committed records where this machine holds no runs.
            done = load_results(out_dir, pending, recorded)
        else:
            done = [r for r in load_results(out_dir, pending) if r.ok]
            reused += done
            finished = {r.experiment for r in done}
            todo = [run for run in pending if run.name not in finished]
            if todo:
                print(f"[reproduce] v2 tuning round {round_}: {len(todo)} runs -> {out_dir}", flush=True)
                done += run_all(
                    todo,
                    args.profile,
                    out_dir,
                    root,
                    workers=args.workers,
                    in_process=args.in_process,
                    wandb=wandb,
                    extra=args.override,
                    threads=args.threads,
                    timeout_s=args.timeout,
                    records_dir=getattr(args, "records", None),
                )
        results.update({result.experiment: result for result in done})
        failed |= any(not result.ok for result in done)
        grew = False
        for comparison in comparisons:
            ladder = ladders[comparison.name]
            outcome = assess(comparison, ladder, scores_of(comparison, ladder, results))
            if outcome.next_ladder is not None:
                ladders[comparison.name], grew = outcome.next_ladder, True
        if fedcurv:
            more, _stage = fedcurv_lambda_grid(fedcurv_results(results, lambdas))
            if more:
                lambdas += list(more)
                grew = True
        if not grew or args.report_only and not all(r.ok for r in done):
            break
    outcomes = []
    for comparison in comparisons:
        ladder = ladders[comparison.name]
        scores = scores_of(comparison, ladder, results)
        outcomes.append((comparison, ladder, assess(comparison, ladder, scores), scores))
    table = fedcurv_results(results, lambdas) if fedcurv else {}
    command = " ".join(["lightning-fed", "reproduce", *argv])
    how = f"{args.workers} parallel workers"
    ran = list(results.values())
    context = invocation_context(
        command, ran, time.perf_counter() - start, how, report_only=args.report_only, reused=reused
    )
    context["search rounds"] = str(round_)
    context["rounds"] = f"{args.tune_rounds:g} of each preset's rounds (claim 5: all of them)"
    reference = fedcurv_reference_line(results) if fedcurv else None
    path = write_report(out_dir, outcomes, table, context, reference)
    print(f"[reproduce] v2 tuning report: {path}")
    if getattr(args, "records", None) is not None:  # the report beside the records it was built from
        copy_beside_records(path, args.records, "TUNING.md", out_dir.parent)  # out_dir is ``--out-dir``'s tune/
    if args.write_presets:
        _write_presets(root, by_name, outcomes, table, context)
    return 1 if failed else 0


def _write_presets(
    root: Path,
    by_name: dict[str, Experiment],
    outcomes: Sequence[tuple[Comparison, Ladder, object, dict[str, dict[str, float | None]]]],
    fedcurv: dict[float, tuple[float | None, float]],
    context: dict[str, str],
) -> None:
    target = root / TUNED_DIR_V2
    target.mkdir(parents=True, exist_ok=True)
    chosen: dict[str, dict[str, object]] = {}
    for comparison, ladder, _outcome, scores in outcomes:
        for run in comparison.methods:
            best = best_suffix(scores.get(run, {}))
            if best is not None:
                chosen[run] = dict(search_settings(comparison, run, ladder)[best])
    lam = fewest_rounds_choice(fedcurv)
    if lam is not None:
        chosen[FEDCURV_RUN] = {"FedCurv.lam": lam}
    for run, setting in chosen.items():
        experiment = by_name[run]
        base = experiment.configs
        overrides = setting_overrides(compose(root, base), setting, run)
        header = [
            f"{run}: chosen by protocol v2's search on validation data (PROTOCOL.md; see tune/TUNING.md).",
            f"Compose after {' '.join(base)}.",
            "Chosen: " + ", ".join(f"{key}={value}" for key, value in setting.items()) + ".",
            f"Written {context.get('date', '')} by `lightning-fed reproduce --protocol v2 --tune --write-presets`.",
        ]
        body = yaml.safe_dump(overrides, sort_keys=False)
        (target / f"{run}.yaml").write_text("".join(f"# {line}\n" for line in header) + body)
        print(f"[reproduce] tuned preset: {target / f'{run}.yaml'}")


__all__ = ["tune_v2"]
