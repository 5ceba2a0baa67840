"""Peak memory of a short lightning_fed run with 10 000 registered clients versus 10, on the same data.

Both configurations train ``ClassifierModule(LeNet5(), 10)`` with FedAvg on all 60 000 Fashion-MNIST training images,
split IID, and hold out one example per client as its test split (``client_test_size=1``):

* ``10 clients``: 10 registered, 10 per round, ``local_steps=10`` (5 999 training examples per client);
* ``10000 clients``: 10 000 registered, 100 per round, ``local_epochs=1`` (5 training examples per client).

With ``batch_size=5`` both do the same work per round: 100 optimizer steps on 500 examples, then the global test set
(10 000 images) is evaluated every round, and the clients' test splits per ``--client-eval`` (default ``sampled``:
the round's clients). What differs is only what scales with the number of registered clients: the partition and
the per-client index bookkeeping, the sampler, per-client loaders and results, the summary and plots.

Measurement: every configuration runs in a fresh Python subprocess, so no allocation of one run is still held (or
freed into the allocator's cache) when the next starts. The child reports

* ``peak RSS (process)``: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the end, the high-water mark of the
  resident set over the whole run (imports, data loading, setup and fit). This is the figure the goal is checked on.
* ``rounds' peak over their start``: the run follows the usual flow (``trainer.fit`` runs ``prepare_data`` and
  ``setup``); a callback's ``on_train_start``, after data loading and setup and just before the first round,
  records the RSS and, on Linux, resets the high-water mark (``/proc/self/clear_refs``); ``ru_maxrss`` read after
  ``fit`` minus that RSS is what the federated rounds themselves add on top of the loaded data and libraries. This
  is far more sensitive than the whole-process peak, which the libraries (about 800 MiB for torch, torchvision and
  Lightning) and the dataset (about 220 MiB of float32 images) dominate.
* with ``--tracemalloc`` (another fresh subprocess per configuration, since tracing slows Python down), the peak of
  Python-level allocations (``tracemalloc``: Python objects and NumPy arrays, not torch tensor storage) from the
  datamodule's creation to the first round, and during the rounds over their start: where per-client Python
  objects would show up.

Run from the repository root::

    python benchmarks/memory.py                      # 10 vs 10 000 clients, 5 rounds, sampled client eval
    python benchmarks/memory.py --client-eval all --tracemalloc

Every timed run records the 1-minute load average before and after it (``benchmarks/load.py``); the output ends
with the load line, and a time taken at a load above the CPU count is marked ``*`` (unreliable).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Standard library only: importing it adds nothing to the children's memory figures.
from benchmarks.load import LoadRecorder, add_wait_quiet_argument, footnote, mark

GOAL = 1.2
"""Goal: peak RSS with 10 000 clients <= GOAL x peak RSS with 10 clients."""

CONFIGS = [
    {"name": "10 clients, 10 per round", "clients": 10, "per_round": 10, "local_steps": 10},
    {"name": "10000 clients, 100 per round", "clients": 10000, "per_round": 100, "local_steps": None},
]


def kib_to_mib(kib: float) -> float:
    return kib / 1024


def maxrss_mib() -> float:
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value / 2**20 if sys.platform == "darwin" else kib_to_mib(value)  # bytes on macOS, KiB on Linux


def current_rss_mib() -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return kib_to_mib(float(line.split()[1]))
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Resets the resident-set high-water mark (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def child(config: dict, args: argparse.Namespace) -> dict:
    """One configuration, in this (fresh) process."""
    import logging
    import tracemalloc

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lightning.pytorch import Callback

    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FashionMNISTFederated
    from lightning_fed.datamodules.partitioners import IidPartitioner
    from lightning_fed.models import ClassifierModule, LeNet5

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    result: dict = {"after_imports_rss": current_rss_mib()}

    class TrainingStart(Callback):
        """Marks the start of the federated rounds: after data loading, ``setup`` and optimizer configuration."""

        def on_train_start(self, trainer, pl_module) -> None:
            result["peak_before_rounds"] = maxrss_mib()
            result["rounds_start_rss"] = current_rss_mib()
            if args.tracemalloc:
                result["setup_py_peak"] = tracemalloc.get_traced_memory()[1] / 2**20
                result["_traced_at_start"] = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
            result["peak_reset"] = reset_peak()
            result["_rounds_start_time"] = time.perf_counter()

    if args.tracemalloc:
        tracemalloc.start()
    dm = FashionMNISTFederated(
        IidPartitioner(config["clients"], seed=0),
        data_dir=args.data_dir,
        batch_size=5,
        client_test_fraction=0.0,
        client_test_size=1,
        seed=0,
    )
    torch.manual_seed(0)
    module = ClassifierModule(LeNet5(in_channels=1, num_classes=10), 10, lr=0.01)
    with tempfile.TemporaryDirectory(prefix="lightning_fed_mem_") as root:
        trainer = FederatedTrainer(
            num_rounds=args.rounds,
            clients_per_round=config["per_round"],
            local_epochs=None if config["local_steps"] else 1,
            local_steps=config["local_steps"],
            eval_every_n_rounds=1,
            client_eval=args.client_eval,
            seed=0,
            callbacks=[TrainingStart()],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            accelerator="cpu",
            devices=1,
            default_root_dir=root,
        )
        trainer.fit(module, datamodule=dm)  # the usual flow: fit runs prepare_data and setup
        result["rounds_s"] = time.perf_counter() - result.pop("_rounds_start_time")
        result["rounds_phase_peak"] = maxrss_mib()
        if args.tracemalloc:
            result["rounds_py_peak_over_start"] = (
                tracemalloc.get_traced_memory()[1] - result.pop("_traced_at_start")
            ) / 2**20
            tracemalloc.stop()
        history = trainer.federation_state.history
        result["steps_per_round"] = int(trainer.global_step) / max(1, len(history))
        result["rounds"] = len(history)
    result["peak_rss"] = max(result["peak_before_rounds"], result["rounds_phase_peak"])
    if result["peak_reset"] and result["rounds_start_rss"] is not None:
        result["rounds_peak_over_start"] = result["rounds_phase_peak"] - result["rounds_start_rss"]
    return result


def run_child(config: dict, args: argparse.Namespace, tracemalloc: bool) -> dict:
    """Runs one configuration in a fresh subprocess; its result carries the load around it under ``"load"``."""
    command = [
        sys.executable, __file__, "--child", json.dumps(config), "--rounds", str(args.rounds), "--data-dir",
        args.data_dir, "--client-eval", args.client_eval, "--threads", str(args.threads),
    ]  # fmt: skip
    if tracemalloc:
        command.append("--tracemalloc")
    with LoadRecorder(args.threads or os.cpu_count() or 1, args.wait_quiet) as load:
        completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stdout + completed.stderr)
        raise SystemExit(f"The child for {config['name']!r} failed with exit code {completed.returncode}.")
    return {**json.loads(completed.stdout.strip().splitlines()[-1]), "load": load.record}


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--client-eval", choices=["none", "sampled", "all"], default="sampled")
    parser.add_argument("--data-dir", default=os.environ.get("LIGHTNING_FED_DATA", "data"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the children (0: torch's default)")
    parser.add_argument("--tracemalloc", action="store_true", help="also measure Python-level allocation peaks")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_wait_quiet_argument(parser)
    args = parser.parse_args()

    if args.child:
        result = child(json.loads(args.child), args)
        print(json.dumps(result))
        return

    print(
        f"lightning_fed peak memory: LeNet-5 FedAvg on Fashion-MNIST (60 000 training images, IID, 1 test example per "
        f"client), batch size 5, 100 optimizer steps on 500 examples per round, {args.rounds} rounds, global test "
        f"every round, client_eval={args.client_eval!r}; one fresh subprocess per configuration.",
        flush=True,
    )
    rows = []
    for config in CONFIGS:
        result = run_child(config, args, tracemalloc=False)
        if args.tracemalloc:
            result.update({k: v for k, v in run_child(config, args, tracemalloc=True).items() if "py_peak" in k})
        rows.append((config, result))
        print(f"  {config['name']}: rounds took {result['rounds_s']:.1f}{mark(result['load'])} s", flush=True)

    header = (
        "| configuration | steps/round | RSS after imports (MiB) | peak RSS, whole process (MiB) |"
        " RSS when the rounds start (MiB) | rounds' peak over their start (MiB) |"
    )
    if args.tracemalloc:
        header += " Python peak, imports to rounds start (MiB) | Python peak in the rounds over their start (MiB) |"
    print("\n" + header)
    print("|:---|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.tracemalloc else ""))
    for config, r in rows:
        line = (
            f"| {config['name']} | {r['steps_per_round']:.0f} | {_fmt(r['after_imports_rss'])} | {r['peak_rss']:.0f} | "
            f"{_fmt(r['rounds_start_rss'])} | {_fmt(r.get('rounds_peak_over_start'), '.1f')} |"
        )
        if args.tracemalloc:
            line += f" {r['setup_py_peak']:.1f} | {r['rounds_py_peak_over_start']:.1f} |"
        print(line)
    print(footnote([r["load"] for _, r in rows]))
    small, large = rows[0][1], rows[1][1]
    ratio = large["peak_rss"] / small["peak_rss"]
    print(
        f"\nPeak RSS ratio (10000 clients / 10 clients): {ratio:.3f}x; goal <= {GOAL:.1f}x: "
        f"{'met' if ratio <= GOAL else 'NOT met'}."
    )
    if small.get("rounds_peak_over_start") is not None and large.get("rounds_peak_over_start") is not None:
        print(
            f"Memory the federated rounds add on top of the loaded data and libraries: "
            f"{small['rounds_peak_over_start']:.1f} MiB (10 clients) vs {large['rounds_peak_over_start']:.1f} MiB "
            "(10000 clients)."
        )
    else:
        print("The rounds' own peak could not be isolated here (no /proc/self/clear_refs); only whole-process peaks.")


if __name__ == "__main__":
    main()
