"""Per-round wall time of one federated client training a reference model: the Sent140 LSTM and VGG-16 on CIFAR-10.

Each workload is a FedAvg fit with one client that trains every round for one local epoch, on random data of the
real shapes (the timing does not depend on the values, so no dataset is needed):

* ``sent140``: :class:`~lightning_fed.models.SentimentLSTM` with LEAF's sizes (10 000-token vocabulary, 300-d
  embedding, 2 × 100 LSTM units; 3.24 M parameters) on ``--sent140-samples`` tweets of 25 tokens, batch 10.
* ``vgg16``: :class:`~lightning_fed.models.VGG16` (GroupNorm, 15.25 M parameters) on ``--cifar-samples`` 3×32×32
  images, batch 50: one of 100 CIFAR-10 clients holds 500 images, 400 after its 20 % test split.

Both use SGD (lr 0.01). The time is the trainer's ``time/round_s`` (sampling, the client's local epoch, aggregation
and the round's bookkeeping; global evaluation is on an 8-sample test set, per-client evaluation is off). Round 1 is
a warm-up (oneDNN's first LSTM call alone takes seconds on a CPU); the median of rounds 2..``--rounds`` is reported.

Threads: ``--threads 1`` by default, as in ``benchmarks/speed.py``: on a shared 2-core machine torch's default of one
OpenMP thread per core spends its time waiting for descheduled peers. ``--threads 0`` keeps torch's default.

Each fit records the 1-minute load average before and after it (``benchmarks/load.py``): a median taken at a load
above the CPU count is marked ``*`` (unreliable), and the load line follows the table.

Usage::

    python benchmarks/reference_models.py                      # both workloads, CPU
    python benchmarks/reference_models.py --accelerator gpu    # on a GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import DatasetFederated, IidPartitioner, TensorClassificationDataset
from lightning_fed.models import VGG16, ClassifierModule, SentimentLSTM


def workload(name: str, samples: int) -> tuple[ClassifierModule, DatasetFederated]:
    """The module and the one-client datamodule of a workload."""
    generator = torch.Generator().manual_seed(0)
    if name == "sent140":
        backbone: torch.nn.Module = SentimentLSTM()
        inputs = torch.randint(1, 10000, (samples + 8, 25), generator=generator)
        classes, batch = 2, 10
    else:
        backbone = VGG16(norm="group")
        inputs = torch.randn(samples + 8, 3, 32, 32, generator=generator)
        classes, batch = 10, 50
    labels = torch.randint(0, classes, (samples + 8,), generator=generator)
    train = TensorClassificationDataset(inputs[:samples], labels[:samples])
    test = TensorClassificationDataset(inputs[samples:], labels[samples:])
    data = DatasetFederated(train, test, classes, IidPartitioner(1), batch_size=batch, client_test_fraction=0.0)
    return ClassifierModule(backbone, num_classes=classes, lr=0.01), data


def time_rounds(
    name: str, samples: int, rounds: int, accelerator: str, cores: int = 1, wait_quiet_s: float = 0.0
) -> tuple[list[float], LoadRecord]:
    """``time/round_s`` of every round of a ``rounds``-round fit, and the load around the fit (``cores`` in use)."""
    module, data = workload(name, samples)
    with tempfile.TemporaryDirectory() as root:
        trainer = FederatedTrainer(
            num_rounds=rounds,
            clients_per_round=1,
            local_epochs=1,
            client_eval="none",
            eval_every_n_rounds=rounds,
            default_root_dir=root,
            run_dir=root,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            accelerator=accelerator,
            devices=1,
        )
        with LoadRecorder(cores, wait_quiet_s) as load:
            trainer.fit(module, datamodule=data)
        return [row["time/round_s"] for row in trainer.federation_state.history], load.record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["sent140", "vgg16"], choices=["sent140", "vgg16"])
    parser.add_argument("--sent140-samples", type=int, default=100)
    parser.add_argument("--cifar-samples", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4, help="round 1 is a warm-up; the median of the rest is shown")
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's default")
    parser.add_argument("--accelerator", default="cpu")
    add_wait_quiet_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), accelerator {args.accelerator}")
    print("| workload | samples | batch | steps/round | rounds timed (s) | median s/round |")
    print("|---|---:|---:|---:|---|---:|")
    # On the CPU the fit keeps its torch threads busy; on an accelerator, the one host process that drives it.
    cores = (args.threads or os.cpu_count() or 1) if args.accelerator == "cpu" else 1
    loads: list[LoadRecord] = []
    for name in args.workloads:
        samples = args.sent140_samples if name == "sent140" else args.cifar_samples
        batch = 10 if name == "sent140" else 50
        all_times, load = time_rounds(name, samples, args.rounds, args.accelerator, cores, args.wait_quiet)
        times = all_times[1:]
        loads.append(load)
        shown = ", ".join(f"{t:.2f}" for t in times)
        steps = -(-samples // batch)
        print(
            f"| {name} | {samples} | {batch} | {steps} | {shown} | {statistics.median(times):.2f}{mark(load)} |",
            flush=True,
        )
    print(footnote(loads))


if __name__ == "__main__":
    main()
