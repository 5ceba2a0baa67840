"""Peak memory and server time per round of FedAvg against the robust aggregators, with 100 clients per round.

The model is FedAvg's CNN (``FedAvgCNN``, McMahan et al. 2017: 1 663 370 float32 parameters) on Fashion-MNIST-sized
inputs (1 x 28 x 28). No client trains: each round, every client's update is the global model plus Gaussian noise
(one client at a time, as the round loop hands them over), so what is measured is the aggregator alone: holding the
updates and applying the rule.

Every aggregator runs in a fresh Python subprocess, which reports

* ``peak RSS``: ``ru_maxrss`` at the end, the resident-set high-water mark of the whole process (imports included);
* ``rounds over start``: on Linux the high-water mark is reset (``/proc/self/clear_refs``) once the model is built,
  and this is the peak during the rounds minus the resident set at their start: what the aggregator adds;
* ``update s`` and ``compute s``: the medians over the rounds of the time spent in the 100 ``update`` calls and in
  ``compute`` (the rule itself), with the fake updates' generation excluded.

Run from the repository root::

    python benchmarks/robust_memory.py                 # 100 clients per round, 3 rounds, every aggregator
    python benchmarks/robust_memory.py --clients 20 --rounds 2 --only fedavg fedmedian

Every timed run records the 1-minute load average before and after it (``benchmarks/load.py``); the output ends
with the load line, and a time taken at a load above the CPU count is marked ``*`` (unreliable).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from benchmarks.memory import current_rss_mib, maxrss_mib, reset_peak

AGGREGATORS = ("fedavg", "normbound+fedavg", "fedmedian", "trimmed_mean", "krum", "multikrum", "bulyan")


def build(name: str, clients: int) -> object:
    """The aggregator ``name`` for ``clients`` per round: Krum and Multi-Krum assume f = 10 % of them Byzantine,
    Bulyan the largest f its n >= 4f + 3 allows."""
    from lightning_fed.aggregators import Bulyan, FedAvg, FedMedian, Krum, MultiKrum, NormBound, TrimmedMean

    f, f_bulyan = clients // 10, (clients - 3) // 4
    builders = {
        "fedavg": lambda: FedAvg(weighting="uniform"),
        "normbound+fedavg": lambda: NormBound(FedAvg(weighting="uniform"), max_norm=1.0),
        "fedmedian": FedMedian,
        "trimmed_mean": lambda: TrimmedMean(beta=0.1),
        "krum": lambda: Krum(num_byzantine=f),
        "multikrum": lambda: MultiKrum(num_byzantine=f),
        "bulyan": lambda: Bulyan(num_byzantine=f_bulyan),
    }
    return builders[name]()


def child(name: str, args: argparse.Namespace) -> dict:
    """One aggregator's rounds, in this (fresh) process."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lightning_fed.client_store import ClientStateStore
    from lightning_fed.context import ClientUpdate, RoundContext
    from lightning_fed.models import FedAvgCNN

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    aggregator: Any = build(name, args.clients)
    global_params = {k: v.detach().clone() for k, v in FedAvgCNN(in_channels=1, num_classes=10).state_dict().items()}
    client_ids = list(range(args.clients))
    local = {k: torch.empty_like(v) for k, v in global_params.items()}
    result: dict = {"aggregator": repr(aggregator), "parameters": sum(v.numel() for v in global_params.values())}
    result["start_rss"] = current_rss_mib()
    result["peak_reset"] = reset_peak()
    update_times, compute_times = [], []
    for round_idx in range(args.rounds):
        ctx = RoundContext(round_idx, client_ids, global_params, dict.fromkeys(client_ids, 600), ClientStateStore())
        aggregator.reset(global_params, ctx)
        spent = 0.0
        for cid in client_ids:
            for key, tensor in local.items():
                tensor.copy_(global_params[key]).add_(torch.randn_like(tensor), alpha=0.01)
            start = time.perf_counter()
            aggregator.update(ClientUpdate(cid, 600, 1, local))
            spent += time.perf_counter() - start
        start = time.perf_counter()
        global_params = aggregator.compute(global_params)
        compute_times.append(time.perf_counter() - start)
        update_times.append(spent)
    result["update_s"] = statistics.median(update_times)
    result["compute_s"] = statistics.median(compute_times)
    result["peak_rss"] = maxrss_mib()
    if result["peak_reset"] and result["start_rss"] is not None:
        result["rounds_over_start"] = result["peak_rss"] - result["start_rss"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=100, help="clients per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the children")
    parser.add_argument("--only", nargs="+", choices=list(AGGREGATORS), default=list(AGGREGATORS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_wait_quiet_argument(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    common = ["--clients", str(args.clients), "--rounds", str(args.rounds), "--threads", str(args.threads)]
    header = f"{'aggregator':<44} {'peak RSS MiB':>12} {'rounds over start MiB':>22} {'update s':>9} {'compute s':>10}"
    print(f"{args.clients} clients per round, {args.rounds} rounds, {args.threads} torch thread(s)")
    print(header)
    print("-" * len(header))
    loads: list[LoadRecord] = []
    for name in args.only:
        command = [sys.executable, __file__, "--child", name, *common]
        with LoadRecorder(args.threads or os.cpu_count() or 1, args.wait_quiet) as load:
            completed = subprocess.run(command, capture_output=True, text=True)
        loads.append(load.record)
        if completed.returncode != 0:
            sys.stderr.write(completed.stdout + completed.stderr)
            raise SystemExit(f"The child for {name!r} failed with exit code {completed.returncode}.")
        row = json.loads(completed.stdout.strip().splitlines()[-1])
        over = row.get("rounds_over_start")
        unreliable = mark(load.record)  # the times only: memory does not depend on the load
        update, compute = f"{row['update_s']:.2f}{unreliable}", f"{row['compute_s']:.2f}{unreliable}"
        print(
            f"{row['aggregator']:<44} {row['peak_rss']:>12.0f} {'n/a' if over is None else f'{over:.0f}':>22}"
            f" {update:>9} {compute:>10}",
            flush=True,
        )
    print(footnote(loads))


if __name__ == "__main__":
    main()
