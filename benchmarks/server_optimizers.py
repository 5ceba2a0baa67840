"""FedAvg against server optimizers (FedAvgM, FedAdam, FedYogi) on Fashion-MNIST, Dirichlet(0.1).

Usage (from the repository root)::

    python benchmarks/server_optimizers.py                       # tune, then test: about 30 min on 2 loaded cores
    python benchmarks/server_optimizers.py --rounds 4 --grid 1   # the whole pipeline in a few minutes

Protocol, the same for every method: each runs its preset of ``configs/server_opt/`` with every server learning
rate of ``--grid`` on the validation split (``evaluation_split: validation``, seed ``--tune-seed``); the rate with
the best final validation accuracy is then run on the test split with each of ``--seeds``, and the final global
test accuracy is reported as mean and standard deviation over the seeds. Nothing else is tuned: the client
learning rate, the momenta and tau are the presets'. Runs go through ``lightning-fed fit``'s CLI in this process;
results are written to ``--out`` (``results.json``, ``results.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("fedavg", "fedavgm", "fedadam", "fedyogi")
PRESETS = {name: ROOT / "configs" / "server_opt" / f"{name}_dirichlet01.yaml" for name in METHODS}
METRIC = "global/test_acc"


def run(preset: Path, server_lr: float, seed: int, split: str, rounds: int | None, root: Path) -> dict[str, Any]:
    """One fit of ``preset``; returns its final accuracy on ``split``, its rejected clients and its wall time."""
    from lightning_fed.cli import FederatedCLI

    args = ["fit", "--config", str(preset), "--trainer.logger", "false", "--seed_everything", str(seed)]
    args += ["--trainer.aggregator.init_args.server_lr", str(server_lr)]
    args += ["--data.init_args.evaluation_split", split, "--trainer.default_root_dir", str(root)]
    args += ["--trainer.enable_progress_bar", "false"]
    if rounds is not None:
        args += ["--trainer.num_rounds", str(rounds)]
    start = time.perf_counter()
    cli = FederatedCLI(args=args)
    final = cli.trainer.federation_state.history[-1]
    return {
        "accuracy": float(final[METRIC]),
        "rejected": cli.trainer.federation_state.rejected_total,
        "wall_s": time.perf_counter() - start,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--grid", nargs="+", type=float, default=[0.01, 0.1, 1.0], help="server learning rates")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--tune-seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=None, help="override the presets' num_rounds")
    parser.add_argument("--out", type=Path, default=Path("runs/server_opt_bench"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"grid": args.grid, "seeds": args.seeds, "tune_seed": args.tune_seed, "methods": {}}
    for name in args.methods:
        tuning = {}
        for server_lr in args.grid:
            tuning[server_lr] = run(PRESETS[name], server_lr, args.tune_seed, "validation", args.rounds, args.out)
            print(f"[tune] {name} server_lr={server_lr}: {tuning[server_lr]}", flush=True)
        best = max(args.grid, key=lambda lr: tuning[lr]["accuracy"])
        tests = [run(PRESETS[name], best, seed, "test", args.rounds, args.out) for seed in args.seeds]
        accuracies = [t["accuracy"] for t in tests]
        results["methods"][name] = {
            "tuning": {str(lr): r for lr, r in tuning.items()},
            "server_lr": best,
            "test": tests,
            "mean": statistics.mean(accuracies),
            "std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
        }
        print(f"[test] {name} server_lr={best}: {accuracies}", flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(table(results))
    print(table(results))
    return 0


def table(results: dict[str, Any]) -> str:
    """The README's table: validation accuracy per rate, the chosen rate, and test accuracy over the seeds."""
    grid = results["grid"]
    lines = [
        "| method | " + " | ".join(f"val acc, η={lr:g}" for lr in grid) + " | chosen η | test acc (mean ± std) | s/run |",
        "|---" * (len(grid) + 4) + "|",
    ]
    for name, entry in results["methods"].items():
        tuned = [f"{entry['tuning'][str(lr)]['accuracy']:.4f}" for lr in grid]
        wall = statistics.median([t["wall_s"] for t in entry["test"]])
        test = f"{entry['mean']:.4f} ± {entry['std']:.4f}"
        lines.append(f"| {name} | " + " | ".join(tuned) + f" | {entry['server_lr']:g} | {test} | {wall:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
