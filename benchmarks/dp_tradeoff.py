"""DP-FedAvg's privacy-utility trade-off: final global accuracy against ε for several noise multipliers.

Runs the preset ``configs/privacy/dp_fedavg_z1.0.yaml`` (or ``--config``) once per noise multiplier z, one
``lightning-fed fit`` after another, with only ``noise_multiplier`` changed (``z = 0`` clips without noise and
without accounting, ``delta=None``), and prints a Markdown table read from each run's ``summary.json``::

    python benchmarks/dp_tradeoff.py                          # z in {0, 0.3, 0.7, 1.0}, the preset's 20 rounds
    python benchmarks/dp_tradeoff.py --noise 0 1.0 --rounds 5 # a quick look

Run it from the repository root; the runs go under ``--root`` (default ``runs/dp_tradeoff``). Each run records the
1-minute load average before and after it (``benchmarks/load.py``): the load line follows the table, and a wall
time taken at a load above the CPU count is marked ``*`` (unreliable).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark

PRESET = Path("configs/privacy/dp_fedavg_z1.0.yaml")


def run_one(config: Path, noise: float, rounds: int | None, root: Path, wait_quiet_s: float = 0.0) -> dict[str, Any]:
    """Fits the preset with noise multiplier ``noise``; returns its final metrics, wall time and the load around it."""
    run_root = root / f"z{noise:g}"
    args = [
        "fit",
        "--config",
        str(config),
        "--trainer.aggregator.init_args.noise_multiplier",
        str(noise),
        "--trainer.default_root_dir",
        str(run_root),
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
    ]
    if noise == 0:
        args += ["--trainer.aggregator.init_args.delta", "null"]
    if rounds is not None:
        args += ["--trainer.num_rounds", str(rounds)]
    run_root.mkdir(parents=True, exist_ok=True)
    # One fit process; torch may use more threads, so a load within the CPU count is the test that matters.
    with open(run_root / "run.log", "w") as log, LoadRecorder(1, wait_quiet_s) as load:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "lightning_fed.cli.main", *args], stdout=log, stderr=subprocess.STDOUT, check=True
        )
        wall = time.perf_counter() - start
    summary = max(run_root.glob("runs/*/summary.json"), key=lambda path: path.stat().st_mtime)
    final = json.loads(summary.read_text())["final"]
    return {"z": noise, "wall_s": wall, "load": load.record, **final}


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the runs, one row per noise multiplier."""
    lines = [
        "| z | ε (δ = 1e-5) | final global test acc | clipped (last round) | noise std per coordinate | wall |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        epsilon = row.get("privacy/epsilon")
        lines.append(
            f"| {row['z']:g} | {'∞ (no noise)' if epsilon is None else f'{epsilon:.1f}'}"
            f" | {row['global/test_acc']:.4f} | {row.get('privacy/clipped_fraction', float('nan')):.2f}"
            f" | {row['privacy/noise_std']:.4f} | {row['wall_s'] / 60:.1f} min{load_mark(row)} |"
        )
    loads = [row["load"] for row in rows if isinstance(row.get("load"), LoadRecord)]
    if loads:
        lines += ["", footnote(loads)]  # the blank line ends the Markdown table
    return "\n".join(lines)


def load_mark(row: dict[str, Any]) -> str:
    """The wall time's mark; a row without a load record (built by hand) has none."""
    load = row.get("load")
    return mark(load) if isinstance(load, LoadRecord) else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=PRESET)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.3, 0.7, 1.0])
    parser.add_argument("--rounds", type=int, default=None, help="override the preset's num_rounds")
    parser.add_argument("--root", type=Path, default=Path("runs/dp_tradeoff"))
    add_wait_quiet_argument(parser)
    args = parser.parse_args()
    rows = [run_one(args.config, noise, args.rounds, args.root, args.wait_quiet) for noise in args.noise]
    print(table(rows))


if __name__ == "__main__":
    main()
