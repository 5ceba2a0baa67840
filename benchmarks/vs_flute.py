"""FLUTE's CNN_FEMNIST benchmark configuration timed end to end in lightning_fed, beside FLUTE's and FedML's times.

FLUTE (Hipolito Garcia et al., "FLUTE: A Scalable, Extensible Framework for High-Performance Federated Learning
Simulations", arXiv:2203.13789) times itself against FedML in its README (public repository microsoft/msrflute,
``README.md``, section "Benchmarking"; the same table in ``experiments/cv_cnn_femnist/README.md``). What those
files state, read for this script (no code of theirs is used here):

* The task table (``README.md``): CV, Federated EMNIST, "CNN (2 Conv + 2 FC)", FedAvg, 3 400 clients, 10 clients per
  round, batch size 20, client optimizer SGD, lr 0.1, 1 epoch, 1 500 rounds, test frequency 50.
* The times ("FedML Comparison", ``README.md``): CNN_FEMNIST in **FLUTE (NCCL), 00:08:22**, ~1 770 MB of GPU
  memory, accuracy ~83; **FedML (MPI), 05:49:52**, ~5 180 MB, ~83; FedML 0.7.303 ("Parrot", its simulator) at commit
  8f7f261f. The hardware they state is no more than that: both ran on GPUs (the table's "GPU Mem" columns), FLUTE over
  NCCL, FedML over MPI. No GPU model, GPU count or CPU is named. The experiment's README runs FLUTE with
  ``torch.distributed.run --nproc_per_node=4 ... -backend nccl`` (4 processes: FLUTE's server and 3 client workers)
  and gives FedML's configuration with ``worker_num: 10``, ``using_gpu: true`` and a GPU mapping ``[3, 3, 3, 2]``
  (10 processes on 4 GPUs). The times are wall-clock times of whole runs.
* The configuration file ``experiments/cv_cnn_femnist/config.yaml``: FedAvg; server optimizer SGD at lr 1.0 on the
  clients' sample-weighted pseudo-gradients (``core/strategies/fedavg.py`` weights each client by its sample count:
  FedAvg's weighted mean, which is lightning_fed's :class:`~lightning_fed.aggregators.FedAvg` with its default
  ``weighting="num_samples"``); client SGD at lr 0.1 (``initial_lr_client``), batch 20, one pass over the client's
  data (``desired_max_samples: 5000`` caps it, above every FEMNIST writer's count); 10 clients per round; testing
  on the test set every 50 rounds (``rec_freq: 50``, the rounds whose number is a multiple of 50; ``val_freq:
  50000``: no validation; no evaluation before the first round), test batch size 20. Its ``max_iteration`` is 800,
  and so is the ``comm_round`` of the FedML configuration in the experiment's README; the README's task table says
  1 500 rounds. ``--rounds`` defaults to the table's 1 500, the configuration the published times are given for.
* The model (``experiments/cv_cnn_femnist/model.py``, FedML's ``CNN_DropOut`` with 62 outputs, the EMNIST CNN of
  Reddi et al., "Adaptive Federated Optimization", arXiv:2003.00295): 3×3 convolution (32) → ReLU → 3×3
  convolution (64) → ReLU → 2×2 max pooling → dropout 0.25 → linear (9 216 → 128) → ReLU → dropout 0.5 → linear
  (62), unpadded, on 1×28×28 images. Its docstring's summary gives 1 199 882 parameters with 10 outputs, so
  1 206 590 with FEMNIST's 62. That is :class:`~lightning_fed.models.PflCifarCNN` (``in_channels=1``,
  ``num_classes=62``, ``image_size=28``): the same layers and the same 1 206 590 parameters; only the initial
  weights' distribution differs (Glorot there, PyTorch's default in FLUTE), which no timing depends on.
* The data (``experiments/cv_cnn_femnist/dataloaders/``): FedML's copy of TensorFlow Federated's Federated EMNIST
  (``fed_emnist_train.h5`` / ``fed_emnist_test.h5``), which TFF's documentation
  (``tff.simulation.datasets.emnist.load_data``) sizes at 3 400 writers, 671 585 training and 77 483 test images,
  62 classes; every writer has at least one training image. FLUTE tests on the test images of all writers pooled.

Here, on random data of that shape (nothing is downloaded; the time does not depend on the pixels): 3 400 clients
whose training sizes are drawn from a seeded log-normal distribution, FEMNIST's long right tail, with the
coefficient of variation of LEAF's FEMNIST writers (226.83 ± 88.94 images per writer, 3 550 writers, in LEAF's
Table 1, Caldas et al., arXiv:1812.01097; taken as stated, not re-derived from the data here), rescaled to TFF's
671 585 images in all (mean 197.5); uniform [0, 1) 1×28×28 images, uniform labels over 62 classes, and a pooled
test set of 77 483 such images. ``--clients`` scales the totals (``round(671 585 × clients / 3 400)`` training
images, likewise the test images unless ``--test-examples`` is given).

lightning_fed trains it with :class:`~lightning_fed.FederatedTrainer`: FedAvg, 10 clients a round drawn uniformly,
one local epoch at batch 20, client SGD lr 0.1 (:class:`~lightning_fed.models.ClassifierModule`), the global model
evaluated on the pooled test set at batch 20 every 50 rounds (``eval_every_n_rounds``; lightning_fed also evaluates
the last round, which with 1 500 rounds is one of them: 30 evaluations, as FLUTE's), no per-client evaluation, no
logging or checkpoints, ``--threads`` torch threads (default 1). ``--parallelism`` lists the ``client_parallelism``
settings to time, one run each (default ``1 auto``: "auto" groups 3 clients of this 4.8 MB model on a CPU).

What it reports, per run: the end-to-end wall time, from before the random data are generated to the end of
``fit`` (data, datamodule, model, Lightning's set-up, every round and every evaluation; the interpreter's start and
the imports, about 7 s on the 2-core development machine, come once before the runs and are outside), the time of
the rounds (start of the first to the end of the last), the evaluations' time within it, and the rounds' time less
the evaluations ("training only"); the optimizer steps taken (``global_step``) against the steps the configuration
implies (the sum over every round's sampled clients of ceil(size / 20) per local epoch: a mismatch stops the run);
and, when ``--rounds`` is not FLUTE's 1 500, an estimate for 1 500 rounds (the measured set-up, plus the measured
training time per round and evaluation time per evaluation times FLUTE's counts). Every run records the load
(``benchmarks/load.py``); the header names the date, the commit, the machine, torch and the threads, and the
published figures are printed beside the measured ones with the hardware they state.

Run from the repository root (on the 2-core development machine, about 55 minutes per run of 1 500 rounds at
client_parallelism 1 and 65 at auto; see docs/performance.md)::

    python benchmarks/vs_flute.py                                   # 1 500 rounds, client_parallelism 1 and auto
    python benchmarks/vs_flute.py --rounds 50 --parallelism 1       # one evaluation period, and the estimate
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import io
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from benchmarks.vs_pfl import machine
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import DatasetFederated
from lightning_fed.datamodules.partitioners import Partitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset
from lightning_fed.engine.sampling import UniformClientSampler
from lightning_fed.models import ClassifierModule, PflCifarCNN

FLUTE_CLIENTS = 3400
"""Writers of TFF's Federated EMNIST (62 classes), FLUTE's CNN_FEMNIST clients."""

FLUTE_TRAIN_EXAMPLES = 671_585
"""Training images of TFF's Federated EMNIST (62 classes)."""

FLUTE_TEST_EXAMPLES = 77_483
"""Test images of TFF's Federated EMNIST (62 classes), pooled for FLUTE's test."""

FLUTE_ROUNDS = 1500
"""Rounds of CNN_FEMNIST in FLUTE's README task table."""

NUM_CLASSES = 62

LEAF_SIZE_CV = 88.94 / 226.83
"""Coefficient of variation of the images per writer of LEAF's FEMNIST (Caldas et al., Table 1)."""

FLUTE_PARAMETERS = 1_199_882 - (128 * 10 + 10) + (128 * NUM_CLASSES + NUM_CLASSES)
"""FLUTE's CNN with 62 outputs: its docstring's 10-output total with the output layer resized (1 206 590)."""


@dataclass(frozen=True)
class Published:
    """A published CNN_FEMNIST time and the hardware its source states."""

    system: str
    seconds: int
    hardware: str


PUBLISHED = (
    Published(
        "FLUTE (NCCL)",
        8 * 60 + 22,
        "GPUs over NCCL; model and count not stated (the experiment runs 4 processes); ~1 770 MB GPU memory",
    ),
    Published(
        "FedML 0.7.303 (MPI)",
        5 * 3600 + 49 * 60 + 52,
        "GPUs over MPI, 10 workers mapped [3, 3, 3, 2] on 4 GPUs; model not stated; ~5 180 MB GPU memory",
    ),
)
"""FLUTE's README, "FedML Comparison" (microsoft/msrflute), 1 500 rounds per its task table."""


def client_sizes(num_clients: int, total: int, cv: float = LEAF_SIZE_CV, seed: int = 0) -> Tensor:
    """Training-set sizes of ``num_clients`` writers: seeded log-normal draws with coefficient of variation ``cv``,
    rescaled and rounded to integers of at least 1 that sum to ``total``.

    A log-normal with :math:`\\sigma^2 = \\ln(1 + cv^2)` has that coefficient of variation whatever its scale; the
    rounding error is taken from or given to the largest clients, so the few images moved change the spread by
    nothing measurable.
    """
    if total < num_clients:
        raise ValueError(f"{total} images cannot give each of {num_clients} clients one; give more images.")
    sigma = math.sqrt(math.log1p(cv * cv))
    raw = np.random.default_rng(seed).lognormal(mean=0.0, sigma=sigma, size=num_clients)
    sizes = np.maximum(1, np.rint(raw * (total / raw.sum()))).astype(np.int64)
    order = np.argsort(-sizes, kind="stable")
    short = total - int(sizes.sum())
    # The largest clients absorb the rounding error, one image each: they are far above 1 image.
    while short:
        count = min(abs(short), num_clients)
        sizes[order[:count]] += 1 if short > 0 else -1
        short -= count if short > 0 else -count
    return torch.from_numpy(sizes)


class ConsecutiveRows(Partitioner):
    """Client ``c`` owns the next ``sizes[c]`` rows: rows ``sum(sizes[:c]) .. sum(sizes[:c + 1]) - 1``."""

    uses_labels = False

    def __init__(self, sizes: Tensor) -> None:
        super().__init__(len(sizes))
        self.sizes = sizes

    @override
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        if int(self.sizes.sum()) != labels.numel():
            raise ValueError(f"the sizes add up to {int(self.sizes.sum())} rows, the dataset has {labels.numel()}.")
        return list(torch.arange(labels.numel()).split(self.sizes.tolist()))


class TimedClassifier(ClassifierModule):
    """:class:`~lightning_fed.models.ClassifierModule` that stamps every evaluation pass and counts its images."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eval_passes: list[list[float]] = []
        self.eval_examples = 0

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        if batch_idx == 0:
            start = time.perf_counter()
            self.eval_passes.append([start, start])
        super().test_step(batch, batch_idx)
        self.eval_passes[-1][1] = time.perf_counter()
        self.eval_examples += batch[1].shape[0]


class RoundClock(L.Callback):
    """The start of the first round and the end of every round (after its evaluation, when it has one)."""

    def __init__(self) -> None:
        self.first_start: float | None = None
        self.ends: list[float] = []

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.first_start is None:
            self.first_start = time.perf_counter()

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ends.append(time.perf_counter())


@dataclass
class RunResult:
    """One timed run of the configuration."""

    name: str
    end_to_end_s: float
    data_s: float
    rounds_s: float
    eval_s: float
    evaluations: int
    eval_examples: int
    steps: int
    rounds: int
    load: LoadRecord

    @property
    def training_s(self) -> float:
        """The rounds' time less the evaluations'."""
        return self.rounds_s - self.eval_s

    def estimate(self, rounds: int, evaluations: int) -> float:
        """End-to-end seconds for ``rounds`` rounds with ``evaluations`` evaluations, from this run's rates."""
        setup = self.end_to_end_s - self.rounds_s
        per_eval = self.eval_s / self.evaluations if self.evaluations else 0.0
        return setup + self.training_s / self.rounds * rounds + per_eval * evaluations


def evaluation_count(rounds: int, every: int) -> int:
    """Global evaluations lightning_fed runs: every ``every``-th round, and the last round in any case."""
    return rounds // every + (1 if rounds % every else 0)


def configured_steps(sizes: Tensor, cohort: int, rounds: int, batch_size: int, epochs: int, seed: int) -> int:
    """Optimizer steps the configuration implies: per round, per sampled client, ceil(size / batch) per epoch."""
    sampler = UniformClientSampler(cohort, seed=seed)
    batches = [-(-int(n) // batch_size) for n in sizes]
    return sum(batches[c] * epochs for r in range(rounds) for c in sampler.sample(r, len(sizes)))


def run(args: argparse.Namespace, parallelism: int | Literal["auto"], root: str) -> RunResult:
    """Generates the data and trains the configuration once, timing it end to end."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(args.seed)
    sizes = client_sizes(args.clients, args.train_examples, seed=args.seed)
    train_images = torch.rand(args.train_examples, 1, 28, 28, generator=generator)
    train_labels = torch.randint(0, NUM_CLASSES, (args.train_examples,), generator=generator)
    test_images = torch.rand(args.test_examples, 1, 28, 28, generator=generator)
    test_labels = torch.randint(0, NUM_CLASSES, (args.test_examples,), generator=generator)
    data_s = time.perf_counter() - start
    datamodule = DatasetFederated(
        TensorClassificationDataset(train_images, train_labels),
        TensorClassificationDataset(test_images, test_labels),
        NUM_CLASSES,
        ConsecutiveRows(sizes),
        batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size,
        client_test_fraction=0.0,
        seed=args.seed,
    )
    torch.manual_seed(args.seed)
    network = PflCifarCNN(in_channels=1, num_classes=NUM_CLASSES, image_size=28)
    module = TimedClassifier(network, num_classes=NUM_CLASSES, optimizer="sgd", lr=args.lr)
    clock = RoundClock()
    trainer = FederatedTrainer(
        num_rounds=args.rounds,
        clients_per_round=args.cohort,
        local_epochs=args.local_epochs,
        client_parallelism=parallelism,
        eval_every_n_rounds=args.eval_every,
        client_eval="none",
        seed=args.seed,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator=args.device,
        devices=1,
        default_root_dir=root,
        callbacks=[clock],
    )
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(module, datamodule=datamodule)
    end = time.perf_counter()
    assert clock.first_start is not None, "fit ran no round"
    return RunResult(
        name=f"lightning_fed, client_parallelism={parallelism}",
        end_to_end_s=end - start,
        data_s=data_s,
        rounds_s=clock.ends[-1] - clock.first_start,
        eval_s=sum(stop - begin for begin, stop in module.eval_passes),
        evaluations=len(module.eval_passes),
        eval_examples=module.eval_examples,
        steps=trainer.global_step,
        rounds=len(clock.ends),
        load=LoadRecord(None, None, None),
    )


def clock_text(seconds: float) -> str:
    """``h:mm:ss`` as FLUTE's table writes times."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def commit() -> str:
    """The checkout's short commit, with ``+`` when it has uncommitted changes; ``unknown`` outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty.strip() else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=FLUTE_ROUNDS)
    parser.add_argument("--clients", type=int, default=FLUTE_CLIENTS)
    parser.add_argument("--cohort", type=int, default=10, help="clients per round")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1, help="client SGD learning rate")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=50, help="rounds between evaluations of the global model")
    parser.add_argument("--eval-batch-size", type=int, default=20, help="FLUTE's test batch size")
    parser.add_argument(
        "--test-examples", type=int, default=None, help="pooled test images (default: 77 483 x clients / 3 400)"
    )
    parser.add_argument("--parallelism", nargs="+", default=["1", "auto"], help="client_parallelism settings to time")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    add_wait_quiet_argument(parser)
    args = parser.parse_args(argv)
    for name in ("rounds", "clients", "cohort", "batch_size", "local_epochs", "eval_every", "eval_batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    if args.cohort > args.clients:
        parser.error(f"--cohort {args.cohort} is more than the {args.clients} clients; lower it.")
    for setting in args.parallelism:
        if setting != "auto" and not (setting.isdigit() and int(setting) >= 1):
            parser.error(f"--parallelism takes integers >= 1 or 'auto'; got {setting!r}.")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run with --device cpu.")
    args.train_examples = round(FLUTE_TRAIN_EXAMPLES * args.clients / FLUTE_CLIENTS)
    if args.test_examples is None:
        args.test_examples = max(1, round(FLUTE_TEST_EXAMPLES * args.clients / FLUTE_CLIENTS))
    return args


def main(argv: list[str] | None = None) -> list[RunResult]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    sizes = client_sizes(args.clients, args.train_examples, seed=args.seed)
    expected_steps = configured_steps(sizes, args.cohort, args.rounds, args.batch_size, args.local_epochs, args.seed)
    evaluations = evaluation_count(args.rounds, args.eval_every)
    parameters = sum(p.numel() for p in PflCifarCNN(1, NUM_CLASSES, 28).parameters())
    print(
        f"FLUTE's CNN_FEMNIST configuration, {datetime.date.today().isoformat()}, commit {commit()}: {args.clients}"
        f" clients, {args.train_examples} random 1x28x28 training images ({sizes.float().mean():.1f} ±"
        f" {sizes.float().std():.1f} per client, {int(sizes.min())}..{int(sizes.max())}), {args.cohort} per round,"
        f" {args.local_epochs} local epoch(s) at batch {args.batch_size}, client SGD lr {args.lr}, FedAvg; the CNN"
        f" ({parameters:,} parameters; FLUTE's {FLUTE_PARAMETERS:,}); {args.test_examples} test images at batch"
        f" {args.eval_batch_size} every {args.eval_every} rounds ({evaluations} evaluations); {args.rounds} rounds,"
        f" {expected_steps} optimizer steps; {machine()}; torch {torch.__version__}, {torch.get_num_threads()}"
        f" thread(s)",
        flush=True,
    )
    results: list[RunResult] = []
    cores = 1 if args.device == "cuda" else args.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as root:
        for setting in args.parallelism:
            parallelism: int | Literal["auto"] = "auto" if setting == "auto" else int(setting)
            with LoadRecorder(cores, args.wait_quiet) as load:
                result = run(args, parallelism, root)
            result.load = load.record
            # The trainer's reference cycles hold the run's data: free them before the next run builds its own.
            gc.collect()
            if result.steps != expected_steps or result.rounds != args.rounds:
                raise RuntimeError(
                    f"{result.name}: {result.steps} optimizer steps in {result.rounds} rounds, where the"
                    f" configuration implies {expected_steps} in {args.rounds}."
                )
            results.append(result)
            print(
                f"  {result.name}: {clock_text(result.end_to_end_s)} end to end{mark(result.load)}"
                f" ({result.end_to_end_s:.1f} s), {result.training_s / result.rounds:.3f} s/round training",
                flush=True,
            )
    print_table(args, results)
    return results


def print_table(args: argparse.Namespace, results: list[RunResult]) -> None:
    full_evaluations = evaluation_count(FLUTE_ROUNDS, args.eval_every)
    estimating = args.rounds != FLUTE_ROUNDS
    print(
        f"\n| system | hardware | rounds | end to end | data | rounds (all) | evaluations | training only |"
        f" s/round (training) |{' estimate for 1 500 rounds |' if estimating else ''}"
    )
    print(f"|:---|:---|---:|---:|---:|---:|---:|---:|---:|{'---:|' if estimating else ''}")
    for r in results:
        star = mark(r.load)
        estimate = f" {clock_text(r.estimate(FLUTE_ROUNDS, full_evaluations))}{star} |" if estimating else ""
        print(
            f"| {r.name} | {machine()}, {torch.get_num_threads()} thread(s) | {r.rounds} |"
            f" {clock_text(r.end_to_end_s)}{star} | {r.data_s:.1f} s | {r.rounds_s:.1f} s |"
            f" {r.eval_s:.1f} s ({r.evaluations}) | {r.training_s:.1f} s | {r.training_s / r.rounds:.3f}{star} |"
            f"{estimate}"
        )
    for published in PUBLISHED:
        blank = " – |" if estimating else ""
        print(
            f"| {published.system}, published | {published.hardware} | {FLUTE_ROUNDS} |"
            f" {clock_text(published.seconds)} | – | – | – | – | {published.seconds / FLUTE_ROUNDS:.3f} (all) |{blank}"
        )
    print(footnote([r.load for r in results]))


if __name__ == "__main__":
    main()
