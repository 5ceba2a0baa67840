"""Robustness matrix: final global test accuracy per aggregation rule x malicious fraction x attack.

Each cell is one federated run on Fashion-MNIST with :class:`~lightning_fed.attacks.MaliciousClients`: ``--clients``
clients holding an IID subset of ``--samples-per-client`` training images each (the subset of
``benchmarks/speed.py``), all of them training every round for one local epoch, a 2NN (McMahan et al.'s MLP,
784-200-200-10) or LeNet-5 trained by SGD, and the accuracy of the final global model on the 10 000 test images.
The defaults (20 clients x 300 images, so one local epoch is about 10 steps of 32, 5 rounds, a 2NN) follow the
setting of the ``configs/robust`` presets; with 20 clients Bulyan can be set for up to 4 attackers.
A fraction of 0 is the clean run, the same for every attack, so it runs once per rule and seed. With several
``--seeds`` a cell is the mean over seeds (the seed draws the partition, the initial weights, the data order and
the malicious clients).

Rules are class paths, optionally with JSON keyword arguments (``CLASS_PATH={"beta": 0.2}``). Without arguments
the known robust rules are given the attack's size, as a defender who knows it would set them, with
``f = floor(fraction * clients)``: ``TrimmedMean(beta=max(f, 1) / clients)``, ``MultiKrum(num_byzantine=f,
num_selected=clients - f)`` and ``Bulyan(num_byzantine=min(f, (clients - 3) // 4))`` (Bulyan needs
``clients >= 4 f + 3``, so at 30 % it is set to the most attackers it can tolerate). A rule that does not import, or
whose constructor refuses the arguments, is skipped with a message.

Run from the repository root (about 5 s per run with the 2NN on a loaded 2-core CPU; the full default matrix is
55 runs)::

    python benchmarks/robustness.py                                        # every rule, fraction and attack
    python benchmarks/robustness.py --rules lightning_fed.aggregators.FedAvg --seeds 0 1

The table holds accuracies, which the load does not change; the per-run times printed as the runs finish record the
1-minute load average around each run (``benchmarks/load.py``): a time taken at a load above the CPU count is marked
``*`` (unreliable), and the load line follows the table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from benchmarks.speed import SubsampledIidPartitioner, benchmark_trainer
from lightning_fed.aggregation import Aggregator
from lightning_fed.attacks import ATTACKS, MaliciousClients, num_malicious
from lightning_fed.datamodules import FashionMNISTFederated
from lightning_fed.models import MLP, ClassifierModule, LeNet5

DEFAULT_RULES = (
    "lightning_fed.aggregators.FedAvg",
    "lightning_fed.aggregators.FedMedian",
    "lightning_fed.aggregators.TrimmedMean",
    "lightning_fed.aggregators.MultiKrum",
    "lightning_fed.aggregators.Bulyan",
)

# The defender's settings for f attackers among n clients, for rules given without arguments.
RULE_DEFAULTS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "TrimmedMean": lambda n, f: {"beta": max(f, 1) / n},
    "MultiKrum": lambda n, f: {"num_byzantine": f, "num_selected": n - f},
    "Bulyan": lambda n, f: {"num_byzantine": min(f, (n - 3) // 4)},
}


def parse_rule(spec: str) -> tuple[str, dict[str, Any] | None]:
    """``CLASS_PATH`` or ``CLASS_PATH=JSON`` -> (class path, keyword arguments or ``None``)."""
    path, _, kwargs = spec.partition("=")
    return path, (json.loads(kwargs) if kwargs else None)


def load_rule(path: str) -> type[Aggregator] | str:
    """The aggregator class at ``path``, or why it cannot be used."""
    module_name, _, class_name = path.rpartition(".")
    try:
        rule = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        return f"skipped {path}: it does not import ({error})"
    return rule


def make_rule(rule: type[Aggregator], kwargs: dict[str, Any] | None, num_clients: int, fraction: float) -> Aggregator:
    """An instance of ``rule``: with ``kwargs`` when given, else with the defender's defaults for the attack size."""
    if kwargs is None:
        defaults = RULE_DEFAULTS.get(rule.__name__)
        kwargs = defaults(num_clients, num_malicious(num_clients, fraction)) if defaults else {}
    return rule(**kwargs)


def make_module(model: str, seed: int, lr: float) -> ClassifierModule:
    torch.manual_seed(seed)
    backbone = LeNet5(in_channels=1, num_classes=10) if model == "lenet5" else MLP(784, 200, 10, num_hidden_layers=2)
    return ClassifierModule(backbone, 10, optimizer="sgd", lr=lr)


def make_datamodule(args: argparse.Namespace, seed: int) -> FashionMNISTFederated:
    partitioner = SubsampledIidPartitioner(args.clients, args.samples_per_client, seed=seed)
    datamodule = FashionMNISTFederated(
        partitioner,
        data_dir=args.data_dir,
        download=False,
        batch_size=args.batch_size,
        client_test_fraction=0.0,
        seed=seed,
    )
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Lightning's and the trainer's per-run lines would bury the table."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def run_one(
    args: argparse.Namespace,
    datamodule: FashionMNISTFederated,
    aggregator: Aggregator,
    fraction: float,
    attack: str,
    seed: int,
    root: str,
) -> float:
    """Final global test accuracy of one run."""
    callbacks = [MaliciousClients(fraction, attack)] if fraction > 0 else []
    trainer = benchmark_trainer(
        args.rounds,
        args.clients,
        seed,
        root,
        aggregator=aggregator,
        callbacks=callbacks,
        eval_every_n_rounds=args.rounds,  # the global model is tested after the last round only
        run_dir=str(Path(root) / f"run_{time.monotonic_ns()}"),
    )
    with quiet():
        trainer.fit(make_module(args.model, seed, args.lr), datamodule=datamodule)
    return float(trainer.federation_state.history[-1]["global/test_acc"])


def run_matrix(
    args: argparse.Namespace, root: str
) -> tuple[dict[tuple[str, float, str], list[float]], list[str], list[LoadRecord]]:
    """Every cell's accuracies (one per seed), keyed by (rule name, fraction, attack); the skip messages; and the
    load around every run."""
    results: dict[tuple[str, float, str], list[float]] = {}
    skipped: list[str] = []
    loads: list[LoadRecord] = []
    rules = []
    for spec in args.rules:
        path, kwargs = parse_rule(spec)
        rule = load_rule(path)
        if isinstance(rule, str):
            skipped.append(rule)
            print(rule, flush=True)
        else:
            rules.append((spec, rule, kwargs))
    for seed in args.seeds:
        datamodule = make_datamodule(args, seed)
        for spec, rule, kwargs in rules:
            for fraction in args.fractions:
                for attack in args.attacks if fraction > 0 else ["none"]:
                    try:  # a fresh aggregator per run: no server state carries over
                        aggregator = make_rule(rule, kwargs, args.clients, fraction)
                    except (TypeError, ValueError) as error:
                        message = f"skipped {spec} at fraction {fraction}: {error}"
                        skipped.append(message)
                        print(message, flush=True)
                        break
                    with LoadRecorder(args.threads or os.cpu_count() or 1, args.wait_quiet) as load:
                        started = time.perf_counter()
                        accuracy = run_one(args, datamodule, aggregator, fraction, attack, seed, root)
                        seconds = time.perf_counter() - started
                    loads.append(load.record)
                    results.setdefault((rule.__name__, fraction, attack), []).append(accuracy)
                    print(
                        f"{rule.__name__} fraction={fraction} attack={attack} seed={seed}: accuracy {accuracy:.4f}"
                        f" ({seconds:.1f}{mark(load.record)} s)",
                        flush=True,
                    )
    return results, skipped, loads


def markdown_table(
    results: dict[tuple[str, float, str], list[float]], fractions: Sequence[float], attacks: Sequence[str]
) -> str:
    """One row per rule, one column per (fraction, attack), the clean run first; cells are mean accuracies."""
    columns = [(f, a) for f in fractions for a in (attacks if f > 0 else ["none"])]
    header = ["rule"] + [f"{f:.0%} {a}" if f > 0 else "clean" for f, a in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rule in dict.fromkeys(name for name, _, _ in results):
        cells = []
        for fraction, attack in columns:
            values = results.get((rule, fraction, attack))
            cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rules", nargs="+", default=list(DEFAULT_RULES), help="class paths [=JSON kwargs]")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.1, 0.3])
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=ATTACKS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--samples-per-client", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--model", choices=("2nn", "lenet5"), default="2nn")
    parser.add_argument("--data-dir", default=os.environ.get("LIGHTNING_FED_DATA", "data"))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    add_wait_quiet_argument(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> str:
    """Runs the matrix, prints the markdown table and returns it."""
    args = parse_args(argv)
    # main() also runs inside a caller's process (the test suite): the thread count is the process's, given back.
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(
        f"Fashion-MNIST, {args.model}, {args.clients} clients x {args.samples_per_client} IID samples, all clients"
        f" every round, {args.rounds} rounds, 1 local epoch, SGD lr={args.lr}, batch {args.batch_size};"
        f" seeds {args.seeds}; final global test accuracy (mean over seeds)",
        flush=True,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="lightning_fed_robustness_") as root:
            results, _, loads = run_matrix(args, root)
    finally:
        torch.set_num_threads(threads)
    table = markdown_table(results, sorted(set(args.fractions)), args.attacks)
    print(f"\n{table}\n\n{footnote(loads)}\nTotal time: {time.perf_counter() - started:.0f} s", flush=True)
    return table


if __name__ == "__main__":
    # Silenced only when run as a script: main() also runs inside the test suite, whose other tests read these logs.
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    main()
