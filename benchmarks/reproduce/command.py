"""``lightning-fed reproduce``, ``lightning-fed-reproduce`` and ``python benchmarks/reproduce.py``: run the papers'
claims and write the report.

``lightning-fed reproduce`` and ``lightning-fed-reproduce`` need the suite installed from the checkout
(``pip install -e benchmarks/``, which declares ``reproduce`` in the ``lightning_fed.commands`` entry-point group);
``python benchmarks/reproduce.py`` needs nothing installed beyond the library.

Examples::

    lightning-fed reproduce --profile small                       # every claim, 3 seeds each, 2 parallel runs
    lightning-fed reproduce --profile smoke --out-dir /tmp/smoke  # the whole pipeline in well under a minute
    lightning-fed reproduce --profile small --claims 3 4          # FedAMP's claims only
    lightning-fed reproduce --profile small --runs zhao_iid       # rerun one run (then --report-only for all)
    lightning-fed reproduce --profile small --resume              # after a stop: run only what did not finish
    lightning-fed reproduce --profile small --report-only         # redraw the report from finished runs
    lightning-fed reproduce --profile small --list                # the runs and their exact commands
    lightning-fed reproduce --profile small --tune                # the hyperparameter search, on validation data
    lightning-fed reproduce --protocol v2 --profile small --list  # PROTOCOL.md's runs, counted
    lightning-fed reproduce --protocol v2 --profile small --report-only  # the report from the committed records
    lightning-fed reproduce --protocol v2 --profile full --extract-records --out-dir DIR  # records of old runs
    lightning-fed reproduce --protocol v2 --exploratory claim5-e50 --list  # an exploratory set, its estimate

Every run writes its record (benchmarks/reproduce/records.py) to benchmarks/reproduce/records/<set>/ unless
--no-records; a report also copies itself and its reproduction.json there.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.reproduce.budget import apply_cuts
from benchmarks.reproduce.claims import Claim, claims_for, experiments_of
from benchmarks.reproduce.experiments import (
    DEFAULT_SEEDS,
    PROFILES,
    PROTOCOLS,
    Experiment,
    default_seeds,
    experiments_for,
    seeded,
)
from benchmarks.reproduce.exploratory import EXPLORATORY
from benchmarks.reproduce.records import (
    copy_beside_records,
    declared_commit,
    environment,
    extract_records,
    recorded_results,
    set_dir,
    set_name,
)
from benchmarks.reproduce.report import invocation_context, read_v1_verdicts, write_report
from benchmarks.reproduce.runner import (
    RunResult,
    WandbOptions,
    finished_results,
    fit_args,
    load_results,
    run_all,
    run_dir_of,
    shown_command,
)
from benchmarks.reproduce.tuning import collect, tuning_runs, write_tuned_presets, write_tuning_report

#: The repository checkout that holds this suite and its ``configs/`` (the suite runs from a checkout, or is
#: installed from one in editable mode: ``pip install -e benchmarks/``).
CHECKOUT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-fed reproduce",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="small",
        help="smoke: 1 round, tiny data; small: the YAML presets (≤ 1 h on 2 cores); full: the papers' "
        "rounds and client numbers",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="v1",
        help="v1: the reproduction as REPRODUCTION.md describes it; v2: as PROTOCOL.md pre-registers it (default v1)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="where runs, figures and REPRODUCTION.md go (default runs/reproduce/<profile>, v2: "
        "runs/reproduce/v2/<profile>)",
    )
    parser.add_argument(
        "--v1-report",
        type=Path,
        help="v2: the v1 reproduction.json whose verdicts the report prints beside v2's (default "
        "runs/reproduce/<profile>/reproduction.json, else the verdicts REPRODUCTION.md publishes: "
        "benchmarks/reproduce/v1_record/<profile>.json)",
    )
    parser.add_argument("--claims", nargs="+", help="claim keys or numbers (default: all)")
    parser.add_argument(
        "--runs",
        nargs="+",
        help="only these runs (e.g. to rerun a failed one; default: every run of the chosen claims in the profile)",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="run seeds (seed_everything) of every run; the verdicts are judged on the means over them (default: "
        + ", ".join(f"{profile} {' '.join(map(str, seeds))}" for profile, seeds in DEFAULT_SEEDS.items())
        + ")",
    )
    parser.add_argument(
        "--cut",
        type=int,
        default=0,
        metavar="N",
        help="v2, full profile: apply the first N of PROTOCOL.md's budget cuts (claims 1-2; the pathological extra "
        "baselines; practical HeurFedAMP to one seed; the paper-lr runs of 7 and 8a); the report names each cut",
    )
    parser.add_argument(
        "--exploratory",
        choices=sorted(EXPLORATORY),
        help="v2: run an exploratory set declared in REPRODUCTION.md instead of the profile's runs (never a "
        "verdict; its report says so); with --list, its runs and time estimate",
    )
    parser.add_argument(
        "--records-dir",
        type=Path,
        help="where each run's record and the report's copy go (default "
        "benchmarks/reproduce/records/<protocol>-<profile>[-tune]); --report-only reads the records of runs that "
        "--out-dir does not hold",
    )
    parser.add_argument("--no-records", action="store_true", help="write no records (the reports still read them)")
    parser.add_argument(
        "--extract-records",
        action="store_true",
        help="write the records of the runs already in --out-dir (run directories of an older runner), then exit; "
        "their tree is --commit, else the one records/RUN_SETS.json declares for the set",
    )
    parser.add_argument(
        "--commit",
        help="with --extract-records: the commit (or tree recipe id of RUN_SETS.json) of the tree that ran them",
    )
    parser.add_argument(
        "--same-machine",
        action="store_true",
        help="with --extract-records: the runs ran on this machine, in this Python environment; record it with "
        "those whose status.json does not name one (an older runner's)",
    )
    parser.add_argument("--workers", type=int, default=2, help="parallel runs, one CPU thread each (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (default 1)")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run sequentially in this process (no startup cost per run; what the tests use)",
    )
    parser.add_argument("--timeout", type=float, help="seconds after which a run is stopped and marked failed")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `lightning-fed fit` argument for every run, e.g. --override=--trainer.num_rounds=2",
    )
    parser.add_argument("--no-wandb", action="store_true", help="do not log the runs and the report to W&B")
    parser.add_argument("--wandb-project", default="lightning-fed-reproduce")
    parser.add_argument(
        "--root",
        type=Path,
        default=CHECKOUT,
        help="repository root holding configs/ (default: the checkout this command is in)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="write the report from the runs already in --out-dir"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs an earlier invocation finished with the same command and the same YAML bytes, run the "
        "rest, then write the report from all of them (--tune always resumes)",
    )
    parser.add_argument("--list", action="store_true", help="print the runs' commands and exit")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="run the hyperparameter search of the chosen claims' methods on validation data (same budget for "
        "every method) and write <out-dir>/tune/TUNING.md, instead of the claims' runs",
    )
    parser.add_argument(
        "--write-presets",
        action="store_true",
        help="with --tune: write each search's chosen setting to configs/tuned/<run>.yaml under --root",
    )
    parser.add_argument(
        "--tune-rounds",
        type=float,
        default=0.5,
        help="fraction of each preset's rounds a tuning run trains (default 0.5)",
    )
    return parser


#: v1's published verdicts (REPRODUCTION.md's tables as data), for a machine that holds no v1 runs.
V1_RECORD = Path(__file__).resolve().parent / "v1_record"


def default_v1_report(profile: str) -> Path:
    """v1's ``reproduction.json`` of ``profile``: this machine's own v1 runs where they exist, else the committed
    record of the verdicts REPRODUCTION.md publishes (``v1_record/<profile>.json``)."""
    local = Path("runs") / "reproduce" / profile / "reproduction.json"
    return local if local.is_file() else V1_RECORD / f"{profile}.json"


def _print_progress(total: int) -> Callable[[RunResult], None]:
    done = []

    def on_done(result: RunResult) -> None:
        done.append(result)
        reason = "" if result.ok else f": {(result.error or '').splitlines()[0]}"
        print(
            f"[reproduce] ({len(done)}/{total}) {result.name} {result.status}"
            f" in {result.wall_s:.0f}{result.wall_mark} s{reason}",
            flush=True,
        )

    return on_done


def _context(
    args: argparse.Namespace,
    argv: list[str],
    results: list[RunResult],
    wall_s: float,
    reused: Sequence[RunResult] = (),
) -> dict[str, str]:
    command = shlex.join(["lightning-fed", "reproduce", *argv])
    how = "sequential, in one process" if args.in_process else f"{args.workers} parallel workers"
    return invocation_context(command, results, wall_s, how, report_only=args.report_only, reused=reused)


def _tune(
    args: argparse.Namespace,
    argv: list[str],
    experiments: list[Experiment],
    out_dir: Path,
    root: Path,
    wandb: WandbOptions | None,
) -> int:
    """Runs (or, with ``--report-only``, reads) every tuning run of ``experiments`` and writes ``TUNING.md``."""
    searches = tuning_runs(experiments, root, out_dir, args.tune_rounds)
    runs = [run for group in searches.values() for run in group]
    if args.list:
        for run in runs:
            print(shown_command(fit_args(run, args.profile, run_dir_of(out_dir, run.run_name), root, wandb), root))
        return 0
    start = time.perf_counter()
    if args.report_only:
        results = load_results(out_dir, runs, recorded_results(_records_dir(args), runs))
    else:
        print(f"[reproduce] tuning: {len(runs)} runs for {len(searches)} methods -> {out_dir}", flush=True)
        results = run_all(
            runs,
            args.profile,
            out_dir,
            root,
            workers=args.workers,
            in_process=args.in_process,
            on_done=_print_progress(len(runs)),
            wandb=wandb,
            extra=args.override,
            threads=args.threads,
            timeout_s=args.timeout,
            records_dir=args.records,
        )
    outcome = [collect(name, results) for name in searches]
    context = _context(args, argv, results, time.perf_counter() - start)
    context["rounds"] = f"{args.tune_rounds:g} of each preset's rounds (at least 5)"
    path = write_tuning_report(out_dir, outcome, context)
    for search in outcome:
        chosen = "none (every run failed)" if search.chosen is None else dict(search.settings[search.chosen])
        print(f"[reproduce] {search.run}: chosen {chosen}")
    print(f"[reproduce] tuning report: {path}")
    if args.write_presets:
        for preset in write_tuned_presets(experiments, outcome, root, context):
            print(f"[reproduce] tuned preset: {preset}")
    return 1 if any(not result.ok for result in results) else 0


def _records_dir(args: argparse.Namespace) -> Path:
    """The record set this invocation writes to and reads from."""
    if args.records_dir is not None:
        return Path(args.records_dir).resolve()
    return set_dir(set_name(args.protocol, args.profile, args.tune, args.exploratory))


def _copy_report(report_path: Path, records_dir: Path) -> None:
    """The generated report and its ``reproduction.json`` beside the records they were built from, with the output
    directory (the report's own) written as ``<out-dir>``: the copies are committed, and name no machine's paths."""
    for source, name in ((report_path, "report.md"), (report_path.with_name("reproduction.json"), "reproduction.json")):
        copy_beside_records(source, records_dir, name, report_path.parent)


def _extract(args: argparse.Namespace, experiments: Sequence[Experiment], out_dir: Path, records: Path) -> int:
    """``--extract-records``: records of the runs in ``out_dir``, each with the tree that ran it."""

    def commit_of(result: RunResult) -> dict[str, object] | None:
        if args.commit:
            return {"id": args.commit, "dirty": None, "source": "given"}
        return declared_commit(records.name, result.experiment)

    try:
        vouched = environment("declared: extracted with --same-machine") if args.same_machine else None
        written = extract_records(out_dir, records, commit_of, experiments or None, vouched)
    except ValueError as error:
        raise SystemExit(f"--extract-records: {error}.") from None
    print(f"[reproduce] {len(written)} records of the runs in {out_dir} written to {records}")
    return 0 if written else 1


def _print_estimate(args: argparse.Namespace) -> None:
    run_set = EXPLORATORY[args.exploratory]
    low, high, elapsed_low, elapsed_high = run_set.estimate_minutes(args.workers)
    print(
        f"# exploratory set {run_set.name} (not a verdict): {run_set.question}; {len(run_set.seeded())} runs, about "
        f"{low:.0f}-{high:.0f} worker-min, {elapsed_low / 60:.1f}-{elapsed_high / 60:.1f} h on {args.workers} "
        "workers (estimate from v2's small-profile claim-5 runs)",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen claims' experiments and writes the report; returns 1 when a run failed, else 0."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    root = args.root.resolve()
    if not (root / "configs").is_dir():
        raise SystemExit(f"--root {root} holds no configs/ folder: run from the repository root or pass --root.")
    if args.exploratory and (args.protocol != "v2" or args.tune or args.cut or args.claims or args.runs):
        raise SystemExit(
            "--exploratory runs one declared set of `--protocol v2`: leave out --tune, --cut, --claims and --runs."
        )
    if args.exploratory:
        run_set = EXPLORATORY[args.exploratory]
        claims: tuple[Claim, ...] = run_set.claims
        chosen = list(run_set.experiments)
        experiments = seeded(chosen, tuple(args.seeds)) if args.seeds else run_set.seeded()
    else:
        claims = claims_for(args.claims, args.protocol)
        needed = experiments_of(claims)
        chosen = [run for run in experiments_for(args.profile, args.runs, args.protocol) if run.name in needed]
        if args.seeds:
            experiments = seeded(chosen, tuple(args.seeds))
        else:
            experiments = [
                run.with_seed(seed) for run in chosen for seed in default_seeds(args.protocol, args.profile, run.name)
            ]
    v1_report = (args.v1_report or default_v1_report(args.profile)).resolve() if args.protocol == "v2" else None
    cuts: list[str] = []
    if args.cut:
        if (args.protocol, args.profile) != ("v2", "full") or args.tune:
            raise SystemExit("--cut applies PROTOCOL.md's budget cuts to `--protocol v2 --profile full` runs only.")
        budget = apply_cuts(args.cut, claims, experiments, read_v1_verdicts(v1_report))
        claims, experiments, cuts = budget.claims, budget.experiments, budget.lines
    kind = f"exploratory-{args.exploratory}" if args.exploratory else args.profile
    default_dir = Path("runs") / "reproduce" / ("v2" if args.protocol == "v2" else "") / kind
    out_dir = (args.out_dir or default_dir).resolve()
    records = _records_dir(args)
    args.records = None if args.no_records else records
    wandb = None if args.no_wandb else WandbOptions(args.wandb_project, kind)
    if args.tune:
        if args.extract_records:
            return _extract(args, [], out_dir / "tune", records)
        if args.protocol == "v2":
            from benchmarks.reproduce.tune_v2_command import tune_v2

            return tune_v2(args, argv, chosen, out_dir / "tune", root, wandb)
        return _tune(args, argv, chosen, out_dir / "tune", root, wandb)
    if args.extract_records:
        return _extract(args, experiments, out_dir, records)
    if args.list:
        for run in experiments:
            print(
                shown_command(
                    fit_args(run, args.profile, run_dir_of(out_dir, run.run_name), root, wandb, args.override), root
                )
            )
        names = {run.name for run in experiments}
        print(
            f"# {len(experiments)} runs ({len(names)} experiments), protocol {args.protocol}, profile {args.profile}",
            file=sys.stderr,
        )
        if args.exploratory:
            _print_estimate(args)
        return 0
    start = time.perf_counter()
    reused: dict[str, RunResult] = {}
    if args.report_only:
        results = load_results(out_dir, experiments, recorded_results(records, experiments))
    else:
        if args.resume:
            reused = finished_results(experiments, args.profile, out_dir, root, wandb, args.override)
        how = "in this process" if args.in_process else f"{args.workers} parallel workers"
        print(
            f"[reproduce] {len(experiments) - len(reused)} runs, profile {args.profile}, {how} -> {out_dir}"
            + (f" ({len(reused)} finished earlier, read back)" if reused else ""),
            flush=True,
        )
        results = run_all(
            experiments,
            args.profile,
            out_dir,
            root,
            workers=args.workers,
            in_process=args.in_process,
            on_done=_print_progress(len(experiments) - len(reused)),
            finished=reused,
            wandb=wandb,
            extra=args.override,
            threads=args.threads,
            timeout_s=args.timeout,
            records_dir=args.records,
        )
    context = _context(args, argv, results, time.perf_counter() - start, list(reused.values()))
    if cuts:
        context["budget cuts (PROTOCOL.md)"] = "; ".join(cuts)
    if args.exploratory:
        context["exploratory (REPRODUCTION.md, declared before it ran)"] = (
            f"{EXPLORATORY[args.exploratory].question}; the rule is applied to show what it would say, and is not a "
            "verdict of the reproduction"
        )
    report = write_report(out_dir, kind, claims, results, context, args.protocol, v1_report)
    if args.records is not None:
        _copy_report(report.path, args.records)
    if wandb is not None:
        from benchmarks.reproduce.dashboard import log_report

        log_report(report, claims, wandb, out_dir)
    for claim in claims:
        verdict = report.verdicts[claim.key]
        print(f"[reproduce] claim {claim.number}: {verdict.verdict} ({verdict.ours})")
    failed = [result.name for result in results if not result.ok]
    print(
        f"[reproduce] report: {report.path}" + (f" ({len(failed)} failed runs: {', '.join(failed)})" if failed else "")
    )
    return 1 if failed else 0


def entry_point() -> None:
    """Console script ``lightning-fed-reproduce`` (``pip install -e benchmarks/``): :func:`main` on ``sys.argv``."""
    sys.exit(main(sys.argv[1:]))


__all__ = ["V1_RECORD", "default_v1_report", "entry_point", "main"]
