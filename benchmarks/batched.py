"""Per-round wall time of FedAvg with clients trained one after another against side by side (``client_parallelism``).

The workload: ``--clients`` clients (default 100 and 1 000) of ``--samples-per-client`` examples (default 64),
every client trained every round for one local epoch at batch size ``--batch-size`` (default 16) with SGD (lr 0.05),
aggregated by FedAvg, with McMahan et al.'s (2017, arXiv:1602.05629) 2NN (784-200-200-10 MLP) and CNN
(:class:`~lightning_fed.models.FedAvgCNN`), or LeNet-5 (``--models lenet5``: the small convolutions of ``speed.py``),
in a :class:`~lightning_fed.models.ClassifierModule`. The data are
random 28×28 images with random labels (timing does not depend on the pixels, and 1 000 × 64 examples are more than
Fashion-MNIST's 60 000 training images); the global test set is 64 examples, evaluated in the last round only.

How time is measured: from ``on_round_start`` to ``on_round_end`` of a round (every client's training,
aggregation, evaluation), of rounds 2..R of a fit of R rounds (``--rounds``, default 2), so the first round's lazy
initialisations are not timed; wall time, and in a second column the process's CPU time (``time.process_time``),
which leaves out the time the process waited for a core on a loaded machine. The ways run interleaved per
repeat (sequential, then each ``--parallelism`` setting, with a fresh trainer and module each), for ``--repeats``
repeats (default 3); the table gives the median round time of each way and the median over repeats of the
per-repeat ratio sequential / batched (> 1: batched is faster), which pairs runs that were close in time on a
shared machine. The final global models of the two ways are
compared as a check that they computed the same thing. Every fit records the 1-minute load average before and
after it (``benchmarks/load.py``): the table ends with the load line, and a figure built from a fit at a load
above the CPU count is marked ``*`` (unreliable); ``--wait-quiet SECONDS`` waits for a quieter machine first.

Device and precision: ``--device cpu`` (default, with ``--threads`` torch threads, default 1 as in
``benchmarks/speed.py``) or ``--device cuda`` with ``--precision 32-true`` or ``bf16-mixed``.

Processes: ``--processes N`` (default 1) runs both ways with ``strategy="ddp"`` on N processes (on the CPU: gloo,
each process with ``--threads`` threads), each rank training its share of the round's clients, one at a time or in
groups; rank 0 measures its rounds and prints the table (Lightning starts the other ranks by running this script
again with the same arguments).

Run from the repository root::

    python benchmarks/batched.py                                      # CPU: 2NN and CNN, 100 and 1000 clients
    python benchmarks/batched.py --models 2nn --clients 100 --parallelism auto 8 16 32
    python benchmarks/batched.py --device cuda --precision bf16-mixed --parallelism auto
    python benchmarks/batched.py --models 2nn --clients 1000 --parallelism auto --processes 2  # ddp, 2 processes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from lightning_fed import FedCallback, FederatedTrainer
from lightning_fed.datamodules import DatasetFederated, IidPartitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset
from lightning_fed.models import MLP, ClassifierModule, FedAvgCNN, LeNet5


def make_backbone(model: str) -> torch.nn.Module:
    """The network of ``--models``: the 2NN, FedAvg's CNN or LeNet-5, for 1×28×28 images and 10 classes."""
    backbones = {
        "2nn": lambda: MLP(784, 200, 10, num_hidden_layers=2),
        "cnn": lambda: FedAvgCNN(1, 10, 28),
        "lenet5": lambda: LeNet5(in_channels=1, num_classes=10),
    }
    return backbones[model]()


def make_module(model: str, seed: int) -> ClassifierModule:
    L.seed_everything(seed, verbose=False)
    return ClassifierModule(make_backbone(model), num_classes=10, lr=0.05)


def make_datamodule(clients: int, per_client: int, batch_size: int, seed: int) -> DatasetFederated:
    generator = torch.Generator().manual_seed(seed)
    total = clients * per_client
    train = TensorClassificationDataset(
        torch.randn(total, 1, 28, 28, generator=generator), torch.randint(0, 10, (total,), generator=generator)
    )
    test = TensorClassificationDataset(torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,)))
    return DatasetFederated(train, test, 10, IidPartitioner(clients, seed=seed), batch_size=batch_size)


class RoundClock(FedCallback):
    """Wall and CPU seconds from ``on_round_start`` to ``on_round_end`` of every round."""

    def __init__(self) -> None:
        self.rounds: list[tuple[float, float]] = []
        self._start = (0.0, 0.0)

    def on_round_start(self, trainer: Any, pl_module: Any, round_ctx: Any) -> None:
        self._start = (time.perf_counter(), time.process_time())

    def on_round_end(self, trainer: Any, pl_module: Any, round_ctx: Any, metrics: Any) -> None:
        self.rounds.append((time.perf_counter() - self._start[0], time.process_time() - self._start[1]))


def run(
    args: argparse.Namespace, model: str, clients: int, parallelism: int | str, root: str
) -> tuple[tuple[float, float], Any, LoadRecord]:
    """Median wall and CPU seconds of rounds 2..R, the final global state with the group size used, and the load
    around the fit."""
    clock = RoundClock()
    module = make_module(model, args.seed)
    datamodule = make_datamodule(clients, args.samples_per_client, args.batch_size, args.seed)
    trainer = FederatedTrainer(
        num_rounds=args.rounds,
        clients_per_round=clients,
        local_epochs=1,
        client_parallelism=parallelism,
        eval_every_n_rounds=0,
        client_eval="none",
        seed=args.seed,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator=args.device,
        devices=args.processes,
        strategy="ddp" if args.processes > 1 else "auto",
        precision=args.precision,
        default_root_dir=root,
        callbacks=[clock],
    )
    # On a GPU the fit keeps one host core busy; on the CPU, its torch threads.
    cores = (1 if args.device == "cuda" else args.threads or os.cpu_count() or 1) * args.processes
    with LoadRecorder(cores, args.wait_quiet) as load:
        trainer.fit(module, datamodule=datamodule)
    wall = statistics.median(w for w, _ in clock.rounds[1:])
    cpu = statistics.median(c for _, c in clock.rounds[1:])
    size = trainer.fed_runner.batched.size if trainer.fed_runner is not None else None
    return (wall, cpu), ({k: v.detach().float().cpu() for k, v in module.state_dict().items()}, size), load.record


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["2nn", "cnn"], choices=["2nn", "cnn", "lenet5"])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--parallelism", nargs="+", default=["auto", "16"], help="group sizes or 'auto'")
    parser.add_argument("--samples-per-client", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per fit (>= 2); round 1 is not timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    add_wait_quiet_argument(parser)
    parser.add_argument("--processes", type=int, default=1, help='processes (> 1: strategy="ddp")')
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the first round is not timed")
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*(does not have many workers|LeafSpec|Total length).*")
    settings = [p if p == "auto" else int(p) for p in args.parallelism]
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    # The ranks Lightning starts for ddp run this script too; rank 0 alone prints.
    say = rank_zero_only(print)
    say(
        f"device: {device}; precision {args.precision}; batch {args.batch_size}; {args.repeats} repeats;"
        f" {args.processes} process(es)"
    )
    say(
        "| model | clients | parallelism (group) | sequential s/round | batched s/round | speed-up |"
        " CPU s/round seq. / batched | CPU speed-up | max rel. diff |"
    )
    say("|---|---|---|---|---|---|---|---|---|")
    all_loads: list[LoadRecord] = []
    with tempfile.TemporaryDirectory() as root:
        for model in args.models:
            for clients in args.clients:
                times: dict[Any, list[tuple[float, float]]] = {p: [] for p in [1, *settings]}
                ratios: dict[Any, list[tuple[float, float]]] = {p: [] for p in settings}
                loads: dict[Any, list[LoadRecord]] = {p: [] for p in [1, *settings]}
                sizes: dict[Any, Any] = {}
                diffs: dict[Any, float] = {}
                for _ in range(args.repeats):
                    base, (reference, _), load = run(args, model, clients, 1, root)
                    times[1].append(base)
                    loads[1].append(load)
                    for p in settings:
                        elapsed, (state, sizes[p]), load = run(args, model, clients, p, root)
                        times[p].append(elapsed)
                        loads[p].append(load)
                        ratios[p].append((base[0] / elapsed[0], base[1] / elapsed[1]))
                        diffs[p] = max(diffs.get(p, 0.0), max_relative_difference(state, reference))

                def median(values: list[tuple[float, float]], k: int) -> float:
                    return statistics.median(v[k] for v in values)

                sequential = mark(loads[1])
                for p in settings:
                    batched, both = mark(loads[p]), mark(loads[1] + loads[p])
                    say(
                        f"| {model} | {clients} | {p} ({sizes[p]}) | {median(times[1], 0):.3f}{sequential} |"
                        f" {median(times[p], 0):.3f}{batched} | {median(ratios[p], 0):.2f}x{both} |"
                        f" {median(times[1], 1):.3f} / {median(times[p], 1):.3f} | {median(ratios[p], 1):.2f}x |"
                        f" {diffs[p]:.1e} |",
                        flush=True,
                    )
                all_loads += [load for records in loads.values() for load in records]
    say(footnote(all_loads))


if __name__ == "__main__":
    main()
