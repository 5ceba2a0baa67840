"""FedAvg against server optimizers (FedAvgM, FedAdam, FedYogi) on Fashion-MNIST, Dirichlet(0.1).

Usage (from the repository root)::

    python benchmarks/server_optimizers.py --jobs 2                 # 12 runs of 30 rounds
    python benchmarks/server_optimizers.py --seeds 0 1 --jobs 2     # mean over two seeds
    python benchmarks/server_optimizers.py --rounds 2 --grid 1      # the whole pipeline in a few minutes

Protocol, the same for every method: its preset of ``configs/server_opt/`` runs with every server learning rate
of ``--grid`` and every seed of ``--seeds``. Each run measures its final global model on the global validation
set (10% of the training data, held out before partitioning: ``val_acc``) and on the test set
(``global/test_acc``). Per method, the rate with the best mean validation accuracy over the seeds is chosen, and
its mean test accuracy is reported: the test set plays no part in the choice. Nothing else is tuned (client
learning rate, momenta, tau: the presets'). Each run is a ``lightning-fed fit`` subprocess that evaluates only at
its last round; results go to ``--out`` (``runs.json``, ``results.json``, ``results.md``). Runs already in
``--out``'s ``runs.json`` are not run again, so an interrupted benchmark continues where it stopped.

Each run records the 1-minute load average before and after it (``benchmarks/load.py``; ``"load"`` in
``runs.json``, counting ``--jobs`` runs at a time as the cores in use): the load line follows the table, and a
method's s/run taken at a load above the CPU count is marked ``*`` (unreliable).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark  # noqa: E402

METHODS = ("fedavg", "fedavgm", "fedadam", "fedyogi")
PRESETS = {name: ROOT / "configs" / "server_opt" / f"{name}_dirichlet01.yaml" for name in METHODS}


def run(
    method: str, server_lr: float, seed: int, rounds: int, out: Path, jobs: int = 1, wait_quiet_s: float = 0.0
) -> dict[str, Any]:
    """One fit; returns its final validation and test accuracy, rejected updates, wall time and the load around it
    (``jobs`` fits run at once, so the cores in use are ``jobs``)."""
    run_dir = out / f"{method}_lr{server_lr:g}_seed{seed}"
    args = ["--config", str(PRESETS[method]), "--trainer.logger", "false", "--seed_everything", str(seed)]
    args += ["--trainer.aggregator.init_args.server_lr", str(server_lr), "--trainer.run_dir", str(run_dir)]
    args += ["--trainer.default_root_dir", str(out), "--trainer.enable_progress_bar", "false"]
    # Evaluate (test set and Lightning's validation loop) at the last round only: nothing else is read.
    args += ["--trainer.num_rounds", str(rounds), "--trainer.eval_every_n_rounds", str(rounds)]
    args += ["--trainer.check_val_every_n_epoch", str(rounds), "--trainer.enable_checkpointing", "false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    with LoadRecorder(jobs, wait_quiet_s) as load:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "lightning_fed.cli.main", "fit", *args], capture_output=True, text=True, env=env
        )
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{method} server_lr={server_lr} seed={seed} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    final = summary["final"]
    return {
        "method": method,
        "server_lr": server_lr,
        "seed": seed,
        "rounds": rounds,
        "val_acc": float(final["val_acc"]),
        "test_acc": float(final["global/test_acc"]),
        "rejected": summary["rejected_clients_total"],
        "wall_s": wall,
        "load": load.record.to_dict(),
    }


def run_loads(runs: list[dict[str, Any]]) -> list[LoadRecord]:
    """The load records of ``runs``; runs saved before loads were recorded have none."""
    return [LoadRecord.from_dict(r["load"]) for r in runs if r.get("load")]


def wall_mark(runs: list[dict[str, Any]]) -> str:
    """The s/run figure's mark: unreliable when any run behind it was (no mark where no run has a record)."""
    loads = run_loads(runs)
    return mark(loads) if loads else ""


def summarise(runs: list[dict[str, Any]], grid: list[float]) -> dict[str, Any]:
    """Per method: mean validation accuracy per rate, the chosen rate and its test accuracies."""
    methods: dict[str, Any] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        val = {lr: statistics.mean(r["val_acc"] for r in mine if r["server_lr"] == lr) for lr in grid}
        best = max(grid, key=val.__getitem__)
        tests = [r["test_acc"] for r in mine if r["server_lr"] == best]
        methods[method] = {
            "val_acc": {str(lr): acc for lr, acc in val.items()},
            "server_lr": best,
            "test_acc": tests,
            "mean": statistics.mean(tests),
            "std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
            "median_wall_s": statistics.median(r["wall_s"] for r in mine),
            "wall_mark": wall_mark(mine),
        }
    return methods


def table(methods: dict[str, Any], grid: list[float]) -> str:
    """The table of the docs' "Server optimizers" page."""
    lines = [
        "| method | " + " | ".join(f"val acc, η={lr:g}" for lr in grid) + " | chosen η | test acc | s/run |",
        "|---" * (len(grid) + 4) + "|",
    ]
    for name, entry in methods.items():
        tuned = [f"{entry['val_acc'][str(lr)]:.4f}" for lr in grid]
        test = f"{entry['mean']:.4f}" + (f" ± {entry['std']:.4f}" if len(entry["test_acc"]) > 1 else "")
        wall = entry["median_wall_s"]
        wall_text = f"{wall:.0f}{entry.get('wall_mark', '')}"
        lines.append(f"| {name} | " + " | ".join(tuned) + f" | {entry['server_lr']:g} | {test} | {wall_text} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--grid", nargs="+", type=float, default=[0.01, 0.1, 1.0], help="server learning rates")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--out", type=Path, default=Path("runs/server_opt_bench"))
    add_wait_quiet_argument(parser)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = [(m, lr, s) for s in args.seeds for m in args.methods for lr in args.grid]
    # Runs already in OUT/runs.json with these rounds are kept, so an interrupted benchmark continues.
    done_file = args.out / "runs.json"
    runs = [r for r in json.loads(done_file.read_text()) if r["rounds"] == args.rounds] if done_file.exists() else []
    done = {(r["method"], r["server_lr"], r["seed"]) for r in runs}
    settings = [setting for setting in settings if setting not in done]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(lambda s: run(*s, args.rounds, args.out, args.jobs, args.wait_quiet), settings):
            print(json.dumps(result), flush=True)
            runs.append(result)
            done_file.write_text(json.dumps(runs, indent=2))
    runs = [r for r in runs if r["method"] in args.methods and r["seed"] in args.seeds and r["server_lr"] in args.grid]
    methods = summarise(runs, args.grid)
    results = {"grid": args.grid, "seeds": args.seeds, "rounds": args.rounds, "runs": runs, "methods": methods}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    loads = run_loads(runs)
    text = table(methods, args.grid) + ("\n" + footnote(loads) + "\n" if loads else "")
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
