"""Per-round time of pfl-research's CIFAR-10 benchmark configuration in pfl's simulator and in lightning_fed.

pfl-research (Granqvist et al., NeurIPS 2024 Datasets and Benchmarks, arXiv:2404.06430) times its simulator against
Flower, FedML, FedScale, FLUTE and TFF on CIFAR-10 and reports 7-72x over them. Its configuration, run here on both
sides with the same work:

* 1 000 users x 50 images, IID (user ``u`` owns rows ``50u .. 50u + 49``), 50 users per round;
* one local epoch at batch size 10 (5 local steps), client SGD at learning rate 0.1, server SGD at learning rate
  1.0 on the averaged update (FedAvg: with equal users, the plain mean of the users' models);
* pfl's benchmark CNN, 1.63 M parameters (:class:`~lightning_fed.models.PflCifarCNN`, written from its description),
  the same initial weights on both sides;
* central evaluation on a 10 000-image test set after every ``--eval-every`` (10) rounds;
* random CIFAR-shaped tensors (3 x 32 x 32, 10 classes) instead of the images: the time does not depend on the
  pixels, and nothing is downloaded.

Both sides train the same users in every round (lightning_fed's sampler draws them; pfl's user sampler is given the
same sequence) on the same rows with the same number of steps; the order of a user's batches differs (pfl iterates
a user's data in stored order, lightning_fed shuffles it), which changes no cost. ``--parallelism`` adds
lightning_fed with batched clients (``client_parallelism``) as further sides.

How it measures, as the repository's other benchmarks do: every side runs in this process with ``--threads`` torch
threads (default 1), a fresh model each run; the end of every round is stamped (pfl: a callback after its central
iteration, after the evaluation callback; lightning_fed: ``on_train_epoch_end``, after validation), and the per-round
time is (T_R - T_1) / (R - 1), which leaves out the set-up and the first round. ``--rounds`` must be a multiple of
``--eval-every`` so that every side's timed window holds the same number of evaluations (both evaluate after rounds
10, 20, ...; pfl's evaluation before the first round is outside the window). The sides alternate within each repeat,
their order rotating every repeat; the table gives the median s/round over repeats and the median of the per-repeat
pfl / lightning_fed ratios (> 1: lightning_fed is faster), with the load of every run (``benchmarks/load.py``).

pfl is optional (``pip install pfl``, then ``pip install "dp-accounting>=0.6"`` again: see the ``bench`` extra in
pyproject.toml); without it the script says so and times lightning_fed
alone. Run from the repository root::

    python benchmarks/vs_pfl.py                                  # 10 rounds, 3 repeats, CPU, 1 thread
    python benchmarks/vs_pfl.py --rounds 20 --repeats 3 --parallelism auto
    python benchmarks/vs_pfl.py --device cuda --rounds 1500 --repeats 1 --parallelism auto   # pfl's full run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import DatasetFederated
from lightning_fed.datamodules.partitioners import Partitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset
from lightning_fed.engine.sampling import UniformClientSampler
from lightning_fed.models import ClassifierModule, PflCifarCNN

PFL_MISSING = "pfl is not installed (`import pfl` failed): the pfl side is skipped. Install it with `pip install pfl`."


class UserRows(Partitioner):
    """User ``u`` owns rows ``n·u .. n·u + n - 1``: the rows pfl's side gives the same user."""

    def __init__(self, num_users: int, per_user: int) -> None:
        super().__init__(num_users)
        self.per_user = per_user

    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        n = self.per_user
        return [torch.arange(u * n, (u + 1) * n) for u in range(self.num_partitions)]


class Work:
    """The benchmark's data and settings, shared by every side."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        generator = torch.Generator().manual_seed(args.seed)
        total = args.users * args.examples_per_user
        self.images = torch.randn(total, 3, 32, 32, generator=generator)
        self.labels = torch.randint(0, 10, (total,), generator=generator)
        self.test_images = torch.randn(args.test_examples, 3, 32, 32, generator=generator)
        self.test_labels = torch.randint(0, 10, (args.test_examples,), generator=generator)
        torch.manual_seed(args.seed)
        self.initial = {k: v.clone() for k, v in PflCifarCNN().state_dict().items()}

    def network(self) -> PflCifarCNN:
        network = PflCifarCNN()
        network.load_state_dict(self.initial)
        return network

    def datamodule(self) -> DatasetFederated:
        args = self.args
        return DatasetFederated(
            TensorClassificationDataset(self.images, self.labels),
            TensorClassificationDataset(self.test_images, self.test_labels),
            10,
            UserRows(args.users, args.examples_per_user),
            batch_size=args.batch_size,
            eval_batch_size=args.eval_batch_size,
            client_test_fraction=0.0,
            seed=args.seed,
        )

    def sampled_users(self) -> list[list[int]]:
        """The users of every round, as lightning_fed's sampler draws them for this seed (the trainer's run seed)."""
        sampler = UniformClientSampler(self.args.cohort, seed=self.args.seed)
        return [sampler.sample(r, self.args.users) for r in range(self.args.rounds)]

    def trainer(self, root: str | None, rounds: int, parallelism: int | str, callbacks: Any = ()) -> FederatedTrainer:
        args = self.args
        return FederatedTrainer(
            num_rounds=rounds,
            clients_per_round=args.cohort,
            local_epochs=1,
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
            callbacks=list(callbacks),
        )


class RoundEnds(L.Callback):
    """Wall-clock time at the end of every round (after its evaluation, when it has one)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.ends: list[float] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ends.append(now(self.device))


def now(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def per_round(ends: list[float]) -> float:
    """(T_R - T_1) / (R - 1) from the end times of rounds 1..R."""
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def run_lightning_fed(work: Work, parallelism: int | str, root: str) -> float:
    clock = RoundEnds(work.args.device)
    module = ClassifierModule(work.network(), num_classes=10, optimizer="sgd", lr=work.args.local_lr)
    trainer = work.trainer(root, work.args.rounds, parallelism, callbacks=[clock])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(module, datamodule=work.datamodule())
    return per_round(clock.ends)


class PflClassifier(nn.Module):
    """The network with the ``loss`` and ``metrics`` methods pfl's ``PyTorchModel`` calls (cross-entropy; loss and
    accuracy, as lightning_fed's ``ClassifierModule`` evaluates)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def loss(self, x: Tensor, y: Tensor, eval: bool = False) -> Tensor:
        self.train(not eval)
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: Tensor, y: Tensor, eval: bool = True) -> dict[str, Any]:
        from pfl.metrics import Weighted

        self.train(not eval)
        logits = self(x)
        count = len(y)
        loss = F.cross_entropy(logits, y, reduction="sum").item()
        return {"loss": Weighted(loss, count), "accuracy": Weighted((logits.argmax(1) == y).sum().item(), count)}


def run_pfl(work: Work, users: list[list[int]]) -> float:
    """pfl's ``FederatedAveraging`` in its ``SimulatedBackend``, on the same users, rows and settings."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.model.pytorch import PyTorchModel

    args = work.args
    device = torch.device(args.device)
    n = args.examples_per_user
    images, labels = work.images.to(device), work.labels.to(device)

    def user_dataset(user: int) -> Dataset:
        return Dataset(raw_data=[images[user * n : (user + 1) * n], labels[user * n : (user + 1) * n]], user_id=user)

    sequence: Iterator[int] = iter([u for round_users in users for u in round_users])
    training = FederatedDataset(user_dataset, lambda: next(sequence))
    central = Dataset(raw_data=[work.test_images.to(device), work.test_labels.to(device)])

    class Evaluation(CentralEvaluationCallback):  # type: ignore[misc]
        """pfl's central evaluation after rounds 10, 20, ... (1-based), where lightning_fed evaluates."""

        def after_central_iteration(self, aggregate_metrics: Any, model: Any, *, central_iteration: int) -> Any:
            return super().after_central_iteration(aggregate_metrics, model, central_iteration=central_iteration + 1)

    ends: list[float] = []

    class RoundEnd(TrainingProcessCallback):  # type: ignore[misc]
        def after_central_iteration(self, aggregate_metrics: Any, model: Any, *, central_iteration: int) -> Any:
            from pfl.metrics import Metrics

            ends.append(now(args.device))
            return False, Metrics()

    network = PflClassifier(work.network())
    model = PyTorchModel(
        network,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(network.parameters(), lr=args.central_lr),
    )
    eval_params = NNEvalHyperParams(local_batch_size=args.eval_batch_size)
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=args.eval_every,
            train_cohort_size=args.cohort,
            val_cohort_size=0,
        ),
        backend=SimulatedBackend(training_data=training, val_data=training),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=1, local_learning_rate=args.local_lr, local_batch_size=args.batch_size
        ),
        model_eval_params=eval_params,
        callbacks=[Evaluation(central, eval_params, frequency=args.eval_every), RoundEnd()],
        send_metrics_to_platform=False,
    )
    return per_round(ends)


def pfl_available() -> bool:
    try:
        import pfl  # noqa: F401
    except ImportError:
        return False
    return True


def machine() -> str:
    """The machine as the other benchmarks record it: the CPU model (or the GPU) and the core count."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} CPUs{gpu}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per timed run (a multiple of --eval-every)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--examples-per-user", type=int, default=50)
    parser.add_argument("--cohort", type=int, default=50, help="users per round")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--local-lr", type=float, default=0.1)
    parser.add_argument("--central-lr", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--test-examples", type=int, default=10_000)
    parser.add_argument("--eval-batch-size", type=int, default=1000)
    parser.add_argument("--parallelism", nargs="*", default=[], help="lightning_fed sides with batched clients")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    add_wait_quiet_argument(parser)
    args = parser.parse_args()
    if args.rounds < 2 or args.rounds % args.eval_every:
        parser.error("--rounds must be at least 2 and a multiple of --eval-every (the same evaluations per side)")
    if args.central_lr != 1.0:
        parser.error("--central-lr: lightning_fed's FedAvg side runs server SGD at 1.0 (the mean of the models)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run with --device cpu.")
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "pfl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.device == "cpu":
        # pfl puts its model on the default device it detects; the CPU side must stay on the CPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    work = Work(args)
    users = work.sampled_users()
    steps = args.cohort * -(-args.examples_per_user // args.batch_size)
    sides: dict[str, Callable[[str], float]] = {}
    have_pfl = pfl_available()
    if have_pfl:
        sides["pfl"] = lambda root: run_pfl(work, users)
    else:
        print(PFL_MISSING)
    sides["lightning_fed"] = lambda root: run_lightning_fed(work, 1, root)
    for setting in args.parallelism:
        parallelism = setting if setting == "auto" else int(setting)
        sides[f"lightning_fed, client_parallelism={setting}"] = (
            lambda root, p=parallelism: run_lightning_fed(work, p, root)  # type: ignore[misc]
        )
    print(
        f"pfl-research's CIFAR-10 configuration: {args.users} users x {args.examples_per_user} random 3x32x32 images,"
        f" {args.cohort} users per round, 1 local epoch at batch {args.batch_size} ({steps} steps per round), client"
        f" SGD lr {args.local_lr}, server SGD lr {args.central_lr}, PflCifarCNN"
        f" ({sum(p.numel() for p in PflCifarCNN().parameters()):,} parameters), evaluation on"
        f" {args.test_examples} images every {args.eval_every} rounds; {args.rounds} rounds per run, {args.repeats}"
        f" repeats; {machine()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)",
        flush=True,
    )
    times: dict[str, list[float]] = {name: [] for name in sides}
    loads: dict[str, list[LoadRecord]] = {name: [] for name in sides}
    names = list(sides)
    cores = 1 if args.device == "cuda" else args.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                with LoadRecorder(cores, args.wait_quiet) as load:
                    times[name].append(sides[name](root))
                loads[name].append(load.record)
            print(
                f"  repeat {repeat + 1}/{args.repeats}: "
                + ", ".join(f"{n} {times[n][-1]:.3f}{mark(loads[n][-1])} s/round" for n in names),
                flush=True,
            )
    print("\n| side | s/round (median) | pfl / side (median of per-repeat ratios) |")
    print("|:---|---:|---:|")
    for name in names:
        ratio = (
            f"{statistics.median(p / t for p, t in zip(times['pfl'], times[name])):.2f}x"
            f"{mark(loads['pfl'] + loads[name])}"
            if have_pfl
            else "skipped"
        )
        print(f"| {name} | {statistics.median(times[name]):.3f}{mark(loads[name])} | {ratio} |")
    print(footnote([record for records in loads.values() for record in records]))


if __name__ == "__main__":
    main()
