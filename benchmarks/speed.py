"""Per-round wall time of FedAvg three ways: plain PyTorch, lightning_fed, and one Lightning ``Trainer`` per client.

The workload is the same for all three: ``ClassifierModule(LeNet5(), 10, lr=0.01)`` (SGD, no momentum) trained by
FedAvg on Fashion-MNIST split IID among ``--clients`` clients, all of which train every round for one local epoch,
with client data from the same datamodule (``dm.client_dataloader(client_id, seed)``, same seeds, so the same
batches in the same order) and the same sample-weighted float64 average. The three final global models are compared
at the end as a check that the arithmetic really is the same.

(a) lightning_fed: ``FederatedTrainer(num_rounds=R, clients_per_round=clients, local_epochs=1, ...)`` with logging,
    checkpointing, progress bar, model summary, sanity check and all evaluation turned off.
(b) plain: a hand-written PyTorch loop (load the global weights, fresh SGD, forward / cross-entropy / zero_grad /
    backward / step per batch, then the weighted average of the client state dicts). No Lightning in the hot loop.
(c) Lightning Trainer per client: what users write without lightning_fed, a new ``lightning.pytorch.Trainer
    (max_epochs=1, ...)`` fitting the module on each client's dataloader, then the same average.

How time is measured (the "difference method"): a round's cost is everything a way does per round, loop overhead
included, but not the one-off cost of starting a run (building the trainer, Lightning's fit setup, data setup). For
lightning_fed these cannot be separated from the outside, so each repeat times ``trainer.fit`` twice, with R rounds
and with 1 round (same settings, fresh trainer and module each time), and takes (T_R - T_1) / (R - 1): setup and
teardown cancel and every round-level cost of the loop remains. (b) and (c) have no run-level setup (every round of
(c) builds its own Trainers), so one run of R rounds is timed round by round and the same estimator
(T_R - T_1) / (R - 1), i.e. the mean of rounds 2..R, is used. The ``time/round_s`` the trainer logs is not used: it
leaves out the Lightning loop around the round.

Noise: a warm-up run of every way (1 round) comes first, so lazy imports and allocator growth are not timed; then
the ways run interleaved, (a, b, c), (a, b, c), ... for ``--repeats`` repeats so that slow phases of a shared machine
hit all three alike. The table reports the median per-round time of each way over repeats and, as ratios, the median
over repeats of the per-repeat ratios (a_i / b_i, c_i / b_i), which pairs runs that were close in time. Wall time is
the measure; the CPU time of the process (``time.process_time``, all its threads) is reported in a second table
because it leaves out the time the process waited for a core on a shared machine (it still varies with cache and
core sharing).
Every timed run records the 1-minute load average before and after it (``benchmarks/load.py``); each table ends
with the load line, and a figure built from a run at a load above the CPU count is marked ``*`` (unreliable).
``--wait-quiet SECONDS`` waits up to that long for the load to fall before each timed run.

``--device cuda`` runs all three ways on one GPU (fp32; the plain loop keeps the model there and copies each batch
to it, as Lightning does for the other two; every clock reading waits for the queued kernels first). ``--scaling``
stays on CPU processes.

Threads: ``--threads 1`` by default. With torch's default (one thread per core) on a 2-core machine that other
processes also use, OpenMP's spinning worker threads wait for descheduled peers and a LeNet-5 step took 80-260 ms
instead of 3-4 ms with one thread (measured on the 2-core development VM under a load average of 2-5): the run then
takes hours and the ratios measure the scheduler, not the framework. ``--threads 0`` keeps torch's default for
quiet machines with more cores. The thread count is the same for all three ways and is printed.

Data: ``--samples-per-client`` (default 600) keeps the default run short on a 2-core CPU. Each client gets that
many examples drawn IID without replacement from the 60 000 training images (``0`` gives every client its full IID
share, 60 000 / clients). The same subset is used by all three ways, and the output states it.

Run from the repository root::

    python benchmarks/speed.py                                   # defaults: batch sizes 32 and 10
    python benchmarks/speed.py --repeats 3 --rounds 4 --samples-per-client 0 --batch-sizes 32
    python benchmarks/speed.py --profile                         # cProfile breakdown of the lightning_fed path
    python benchmarks/speed.py --scaling --repeats 3             # 1 process against 2 (strategy="ddp", gloo)

Scaling (``--scaling``): the lightning_fed run alone, on 1 process and on ``--processes`` processes (Lightning's
``strategy="ddp"`` on the CPU, gloo), each process with ``--threads`` threads, interleaved per repeat. Each run is a
fresh ``python benchmarks/speed.py --scaling-worker ...`` (Lightning's launcher re-runs that command for the other
ranks); a callback stamps the end of every round on rank 0, and the per-round time is (T_R - T_1) / (R - 1) over
those stamps, so process start-up and Lightning's setup are left out and the collectives of every round are in.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import math
import os
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as pl

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FashionMNISTFederated
from lightning_fed.datamodules.partitioners import IidPartitioner, Partitioner
from lightning_fed.models import ClassifierModule, LeNet5
from lightning_fed.utilities.seeding import derive_seed

GOALS = {32: 1.10, 10: 1.25}
"""Goal for lightning_fed / plain, per batch size."""

StateDict = dict[str, Tensor]


class SubsampledIidPartitioner(Partitioner):
    """IID partition that gives every client ``samples_per_client`` examples and leaves the rest unused.

    ``samples_per_client=0`` is the ordinary :class:`IidPartitioner` (every example used once).
    """

    def __init__(self, num_partitions: int, samples_per_client: int, seed: int = 0) -> None:
        super().__init__(num_partitions, seed)
        self.samples_per_client = samples_per_client

    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        if self.samples_per_client == 0:
            return IidPartitioner(self.num_partitions, seed=self.seed).partition(labels, natural_ids)
        needed = self.num_partitions * self.samples_per_client
        if needed > labels.numel():
            raise ValueError(
                f"{self.num_partitions} x {self.samples_per_client} samples exceed the {labels.numel()} examples."
            )
        permutation = np.random.default_rng(self.seed).permutation(labels.numel())[:needed]
        parts = np.split(permutation, self.num_partitions)
        return [torch.from_numpy(np.sort(part).astype(np.int64)) for part in parts]


# --------------------------------------------------------------------------------------------------------------------
# The three ways. Each takes (datamodule, rounds) and returns (per-round wall times or total times, final global state).


def make_module(seed: int) -> ClassifierModule:
    torch.manual_seed(seed)  # same initial weights for every way
    return ClassifierModule(LeNet5(in_channels=1, num_classes=10), 10, optimizer="sgd", lr=0.01, momentum=0.0)


class FedAvgAccumulator:
    """The sample-weighted float64 average, accumulated client by client exactly as ``lightning_fed.FedAvg`` does."""

    def __init__(self, num_samples: dict[int, int]) -> None:
        total = float(sum(num_samples.values()))
        self.weights = {cid: float(n) / total for cid, n in num_samples.items()}
        self.sum: StateDict = {}
        self.copied: StateDict = {}
        self.accepted = 0.0

    def add(self, client_id: int, state: StateDict) -> None:
        weight = self.weights[client_id]
        self.accepted += weight
        for name, tensor in state.items():
            if not (tensor.is_floating_point() or tensor.is_complex()):
                self.copied[name] = tensor.detach().clone()
            elif name in self.sum:
                self.sum[name].add_(tensor.detach().double(), alpha=weight)
            else:
                self.sum[name] = tensor.detach().double() * weight

    def result(self, old: StateDict) -> StateDict:
        renormalise = self.accepted != 1.0
        new: StateDict = {}
        for name, tensor in old.items():
            if name in self.copied:
                new[name] = self.copied[name]
            else:
                mean = self.sum[name] / self.accepted if renormalise else self.sum[name]
                new[name] = mean.to(tensor.dtype)
        return new


def now(device: str = "cpu") -> np.ndarray:
    """(wall-clock time, CPU time of this process) in seconds, once the device's queued work is done (CUDA runs
    asynchronously: without the synchronisation a round would end before its kernels do)."""
    if device == "cuda":
        torch.cuda.synchronize()
    return np.array([time.perf_counter(), time.process_time()])


def benchmark_trainer(rounds: int, num_clients: int, seed: int, root: str, **kwargs: Any) -> FederatedTrainer:
    """The speed workload's trainer: every client every round, 1 local epoch, no evaluation, logging or checkpoints;
    ``kwargs`` override (devices, strategy, callbacks for the scaling runs)."""
    settings: dict[str, Any] = dict(
        num_rounds=rounds,
        clients_per_round=num_clients,
        local_epochs=1,
        eval_every_n_rounds=0,
        client_eval="none",
        seed=seed,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
    )
    return FederatedTrainer(**{**settings, **kwargs})


def run_lightning_fed(
    dm: FashionMNISTFederated, rounds: int, seed: int, root: str, device: str = "cpu"
) -> tuple[np.ndarray, StateDict]:
    """(a): wall time of ``trainer.fit`` for ``rounds`` rounds (construction of the trainer not included)."""
    module = make_module(seed)
    trainer = benchmark_trainer(rounds, dm.num_clients, seed, root, accelerator=device)
    start = now(device)
    trainer.fit(module, datamodule=dm)
    elapsed = now(device) - start
    return elapsed, {k: v.detach().clone() for k, v in module.state_dict().items()}


def run_plain(
    dm: FashionMNISTFederated, rounds: int, seed: int, root: str, device: str = "cpu"
) -> tuple[list[np.ndarray], StateDict]:
    """(b): hand-written FedAvg; returns the wall time of every round. On a GPU the model stays there and every
    batch is copied to it, as Lightning does for the other two ways."""
    module = make_module(seed).to(device)
    clients = list(range(dm.num_clients))
    num_samples = {cid: dm.client_num_samples(cid) for cid in clients}
    lr = module.hparams.lr
    global_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    times = []
    for round_idx in range(rounds):
        start = now(device)
        average = FedAvgAccumulator(num_samples)
        for cid in clients:
            module.load_state_dict(global_state)
            torch.manual_seed(derive_seed(seed, "torch", round_idx, cid))
            loader = dm.client_dataloader(cid, seed=derive_seed(seed, "data", round_idx, cid))
            optimizer = torch.optim.SGD(module.parameters(), lr=lr)
            module.train()
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = F.cross_entropy(module(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            average.add(cid, module.state_dict())
        global_state = average.result(global_state)
        times.append(now(device) - start)
    module.load_state_dict(global_state)
    return times, global_state


def run_trainer_per_client(
    dm: FashionMNISTFederated, rounds: int, seed: int, root: str, device: str = "cpu"
) -> tuple[list[np.ndarray], StateDict]:
    """(c): a fresh ``lightning.pytorch.Trainer`` per client per round; returns the wall time of every round."""
    module = make_module(seed)
    clients = list(range(dm.num_clients))
    num_samples = {cid: dm.client_num_samples(cid) for cid in clients}
    global_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    times = []
    for round_idx in range(rounds):
        start = now(device)
        average = FedAvgAccumulator(num_samples)
        for cid in clients:
            module.load_state_dict(global_state)
            torch.manual_seed(derive_seed(seed, "torch", round_idx, cid))
            loader = dm.client_dataloader(cid, seed=derive_seed(seed, "data", round_idx, cid))
            trainer = pl.Trainer(
                max_epochs=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                accelerator=device,
                devices=1,
                default_root_dir=root,
            )
            trainer.fit(module, train_dataloaders=loader)
            average.add(cid, module.state_dict())
        global_state = average.result(global_state)
        times.append(now(device) - start)
    module.load_state_dict(global_state)
    return times, global_state


# --------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Swallows the trainers' prints (``[lightning_fed] final ...``); the same for all three ways."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def silence_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`validation_step` but have no `val_dataloader`.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*Total length of `list` across ranks is zero.*")
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*")


def max_abs_diff(a: StateDict, b: StateDict) -> float:
    return max(float((a[k].double().cpu() - b[k].double().cpu()).abs().max()) for k in a)


def make_datamodule(args: argparse.Namespace, batch_size: int) -> FashionMNISTFederated:
    partitioner = SubsampledIidPartitioner(args.clients, args.samples_per_client, seed=args.seed)
    dm = FashionMNISTFederated(
        partitioner, data_dir=args.data_dir, batch_size=batch_size, client_test_fraction=0.0, seed=args.seed
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


def measure(args: argparse.Namespace, batch_size: int, root: str) -> dict[str, Any]:
    dm = make_datamodule(args, batch_size)
    rounds = args.rounds
    device = args.device
    with quiet():  # warm-up: lazy imports, first-call allocations (and CUDA's start-up and kernel choice)
        run_lightning_fed(dm, 1, args.seed, root, device)
        run_plain(dm, 1, args.seed, root, device)
        run_trainer_per_client(dm, 1, args.seed, root, device)
    per_round: dict[str, list[np.ndarray]] = {"a": [], "b": [], "c": []}  # (wall, cpu) per repeat
    loads: dict[str, list[LoadRecord]] = {"a": [], "b": [], "c": []}  # around every timed run of each way
    finals: dict[str, StateDict] = {}
    cores = args.threads or os.cpu_count() or 1
    for repeat in range(args.repeats):
        with quiet():
            with LoadRecorder(cores, args.wait_quiet) as load:
                t1, _ = run_lightning_fed(dm, 1, args.seed, root, device)
                tr, finals["a"] = run_lightning_fed(dm, rounds, args.seed, root, device)
            per_round["a"].append((tr - t1) / (rounds - 1))
            loads["a"].append(load.record)
            with LoadRecorder(cores, args.wait_quiet) as load:
                times, finals["b"] = run_plain(dm, rounds, args.seed, root, device)
            per_round["b"].append((sum(times) - times[0]) / (rounds - 1))
            loads["b"].append(load.record)
            with LoadRecorder(cores, args.wait_quiet) as load:
                times, finals["c"] = run_trainer_per_client(dm, rounds, args.seed, root, device)
            per_round["c"].append((sum(times) - times[0]) / (rounds - 1))
            loads["c"].append(load.record)
        print(
            f"  batch {batch_size} repeat {repeat + 1}/{args.repeats}, wall (cpu) s/round: "
            + ", ".join(f"{k}={v[-1][0]:.3f}{mark(loads[k][-1])} ({v[-1][1]:.3f})" for k, v in per_round.items()),
            flush=True,
        )
    steps = sum(math.ceil(dm.client_num_samples(c) / batch_size) for c in range(dm.num_clients))
    summary: dict[str, Any] = {
        "steps": steps,
        "loads": loads,
        "diff_ab": max_abs_diff(finals["a"], finals["b"]),
        "diff_cb": max_abs_diff(finals["c"], finals["b"]),
    }
    for index, clock in enumerate(("wall", "cpu")):
        values = {k: [float(v[index]) for v in vs] for k, vs in per_round.items()}
        summary[clock] = {
            "all": values,
            "median": {k: statistics.median(v) for k, v in values.items()},
            "ratio_a": statistics.median(a / b for a, b in zip(values["a"], values["b"])),
            "ratio_c": statistics.median(c / b for c, b in zip(values["c"], values["b"])),
        }
    return summary


def profile(args: argparse.Namespace, batch_size: int, root: str) -> None:
    """cProfile of one lightning_fed fit: how much of the round loop is outside the model's own work."""
    dm = make_datamodule(args, batch_size)
    with quiet():
        run_lightning_fed(dm, 1, args.seed, root)  # warm-up
    profiler = cProfile.Profile()
    with quiet(), LoadRecorder(args.threads or os.cpu_count() or 1, args.wait_quiet) as load:
        profiler.enable()
        run_lightning_fed(dm, args.rounds, args.seed, root)
        profiler.disable()
    stats = pstats.Stats(profiler)
    cum = {}
    for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        cum.setdefault((Path(filename).name, name), 0.0)
        cum[(Path(filename).name, name)] = max(cum[(Path(filename).name, name)], ct)

    def get(file: str, name: str) -> float:
        return cum.get((file, name), 0.0)

    rounds = get("round.py", "run")
    parts = {
        "training_step (forward, loss, log)": get("classifier.py", "training_step"),
        "backward": get("local_training.py", "_backward"),
        "optimizer step, zero_grad, hooks": get("local_training.py", "_optimizer_step"),
        "next batch (client loader)": get("training_step.py", "client_batches"),
    }
    model_work = sum(parts.values())
    named_overheads = {
        "torch.manual_seed per client": get("random.py", "manual_seed"),
        "all_finite check per client": get("state_dict.py", "all_finite"),
        "FedAvg.update per client": get("fedavg.py", "update"),
        "LogBuffer.log per step": get("log_buffer.py", "log"),
    }
    fit, loop = get("trainer.py", "fit"), get("loop.py", "run")
    start, finish = get("trainer.py", "start_federation"), get("trainer.py", "finish_round")
    width = 40
    print(f"\ncProfile of lightning_fed, batch {batch_size}, {args.rounds} rounds (the profiler inflates Python code):")
    print(f"  {footnote([load.record])}")
    print(f"  {'FederatedTrainer.fit':{width}s} {fit:8.3f} s")
    print(f"  {'round loop (_RoundLoop.run, all rounds)':{width}s} {loop:8.3f} s")
    print(f"    {'start_federation (once; partition plot)':{width - 2}s} {start:8.3f} s")
    print(
        f"    {'finish_round (summary JSON, logging)':{width - 2}s} {finish:8.3f} s"
        f"  ({finish / (loop - start):6.1%} of the loop after start)"
    )
    print(f"    {'RoundRunner.run (sample, train, aggregate)':{width - 2}s} {rounds:8.3f} s")
    for label, value in parts.items():
        print(f"      {label:{width - 4}s} {value:8.3f} s  ({value / rounds:6.1%} of RoundRunner.run)")
    print(
        f"      {'everything else':{width - 4}s} {rounds - model_work:8.3f} s"
        f"  ({(rounds - model_work) / rounds:6.1%}), of which:"
    )
    for label, value in named_overheads.items():
        print(f"        {label:{width - 6}s} {value:8.3f} s  ({value / rounds:6.1%})")
    print("\nTop functions by own time:")
    stats.sort_stats("tottime").print_stats(15)


# --------------------------------------------------------------------------------------------------------------------
# Scaling out: the lightning_fed run on 1 process against N processes (strategy="ddp", gloo), each with its threads.


class RoundClock(pl.Callback):
    """Wall-clock time at the end of every round (rank 0 reports; the round ends with collectives on every rank)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.ends.append(time.perf_counter())


def scaling_worker(args: argparse.Namespace) -> None:
    """One ``--processes``-process fit; rank 0 writes its per-round wall times and final weights to
    ``args.scaling_worker``.

    Lightning's DDP launcher starts the other ranks by re-running this command line, so every rank lands here.
    """
    import json

    dm = make_datamodule(args, args.batch_sizes[0])
    clock = RoundClock()
    trainer = benchmark_trainer(
        args.rounds,
        dm.num_clients,
        args.seed,
        tempfile.mkdtemp(prefix="lightning_fed_scaling_"),
        devices=args.processes,
        strategy="ddp" if args.processes > 1 else "auto",
        callbacks=[clock],
    )
    module = make_module(args.seed)
    trainer.fit(module, datamodule=dm)
    if trainer.is_global_zero:
        torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, args.scaling_worker + ".pt")
        Path(args.scaling_worker).write_text(json.dumps({"round_ends": clock.ends}))


def run_processes(
    args: argparse.Namespace, batch_size: int, processes: int, out: str
) -> tuple[float, StateDict, LoadRecord]:
    """Per-round wall time (T_R - T_1) / (R - 1) of a ``processes``-process fit, its final global weights and the
    load around it."""
    import json
    import subprocess

    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--scaling-worker",
        out,
        "--processes",
        str(processes),
        "--batch-sizes",
        str(batch_size),
        "--rounds",
        str(args.rounds),
        "--clients",
        str(args.clients),
        "--samples-per-client",
        str(args.samples_per_client),
        "--data-dir",
        args.data_dir,
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or os.cpu_count())}
    with LoadRecorder(processes * (args.threads or os.cpu_count() or 1), args.wait_quiet) as load:
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{processes}-process run failed:\n{done.stderr[-3000:]}")
    ends = json.loads(Path(out).read_text())["round_ends"]
    return (ends[-1] - ends[0]) / (len(ends) - 1), torch.load(out + ".pt", weights_only=True), load.record


def measure_scaling(args: argparse.Namespace, root: str) -> None:
    """1 process against ``--processes`` processes, interleaved per repeat; prints medians and the speed-up."""
    counts = (1, args.processes)
    results: dict[int, dict[int, list[float]]] = {bs: {n: [] for n in counts} for bs in args.batch_sizes}
    loads: dict[int, dict[int, list[LoadRecord]]] = {bs: {n: [] for n in counts} for bs in args.batch_sizes}
    finals: dict[tuple[int, int], StateDict] = {}
    for repeat in range(args.repeats):
        for batch_size in args.batch_sizes:
            for n in counts:
                out = os.path.join(root, f"scaling_{batch_size}_{n}_{repeat}.json")
                per_round, finals[batch_size, n], load = run_processes(args, batch_size, n, out)
                results[batch_size][n].append(per_round)
                loads[batch_size][n].append(load)
            print(
                f"  repeat {repeat + 1}/{args.repeats}, batch {batch_size}: "
                + ", ".join(
                    f"{n} process(es) {results[batch_size][n][-1]:.3f}{mark(loads[batch_size][n][-1])} s/round"
                    for n in counts
                ),
                flush=True,
            )
    print(
        f"\nWall time per round, rounds 2..R, median over {args.repeats} repeats;"
        " speed-up: median of per-repeat ratios.\n"
    )
    print(
        f"| batch size | 1 process (s/round) | {args.processes} processes (s/round) | speed-up | max abs weight diff |"
    )
    print("|---:|---:|---:|---:|---:|")
    for batch_size, by_count in results.items():
        speedup = statistics.median(a / b for a, b in zip(by_count[1], by_count[args.processes]))
        diff = max_abs_diff(finals[batch_size, 1], finals[batch_size, args.processes])
        marks = {n: mark(loads[batch_size][n]) for n in counts}
        print(
            f"| {batch_size} | {statistics.median(by_count[1]):.3f}{marks[1]}"
            f" | {statistics.median(by_count[args.processes]):.3f}{marks[args.processes]} |"
            f" {speedup:.2f}x{mark(loads[batch_size][1] + loads[batch_size][args.processes])} | {diff:.1e} |"
        )
    print(footnote([load for by_count in loads.values() for records in by_count.values() for load in records]))
    print(f"\nGoal: >= 1.5x with {args.processes} processes at batch size 10.")


def mark_of(*marks: str) -> str:
    """A ratio's mark: unreliable when either figure it divides is."""
    return max(marks)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 10])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per timed run (>= 2); default 6")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10, help="registered clients, all trained every round")
    parser.add_argument("--samples-per-client", type=int, default=600, help="0: the full IID share (60000 / clients)")
    parser.add_argument("--data-dir", default=os.environ.get("LIGHTNING_FED_DATA", "data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (default 1; 0 keeps torch's default, see above)"
    )
    parser.add_argument("--profile", action="store_true", help="only print a cProfile breakdown of lightning_fed")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="only compare lightning_fed on 1 process against --processes processes (strategy='ddp', gloo, CPU)",
    )
    parser.add_argument("--processes", type=int, default=2, help="processes for --scaling (default 2)")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where all three ways train (default cpu); cuda: one GPU, fp32, batches copied from the host",
    )
    parser.add_argument("--scaling-worker", default=None, help=argparse.SUPPRESS)
    add_wait_quiet_argument(parser)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (the per-round time is (T_R - T_1) / (R - 1)).")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run with --device cpu, or on a machine with one.")
    if args.device == "cuda" and (args.scaling or args.scaling_worker):
        parser.error("--scaling compares CPU processes (ddp, gloo); leave out --device cuda.")
    if args.threads:
        torch.set_num_threads(args.threads)
    silence_lightning()
    if args.scaling_worker:
        with quiet():
            scaling_worker(args)
        return

    started = time.perf_counter()
    data = (
        f"{args.samples_per_client} samples per client (IID subset of Fashion-MNIST train)"
        if args.samples_per_client
        else f"full IID partition ({60000 // args.clients} samples per client)"
    )
    print(
        f"FedAvg, LeNet-5 on Fashion-MNIST, {args.clients} clients x {data}, all clients every round, 1 local epoch, "
        f"SGD lr=0.01; {args.rounds} rounds per timed run, {args.repeats} repeats; torch {torch.__version__}, "
        f"lightning {pl.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs"
        + (f", {torch.cuda.get_device_name(0)}" if args.device == "cuda" else ""),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="lightning_fed_bench_") as root:
        if args.profile:
            for batch_size in args.batch_sizes:
                profile(args, batch_size, root)
            return
        if args.scaling:
            measure_scaling(args, root)
            print(f"Total benchmark time: {time.perf_counter() - started:.0f} s")
            return
        results = {bs: measure(args, bs, root) for bs in args.batch_sizes}

    for clock, title in (
        ("wall", "Wall time per round"),
        ("cpu", "CPU time of the process per round (leaves out waiting for a core on a shared machine)"),
    ):
        print(
            f"\n{title}, (T_R - T_1) / (R - 1): medians over repeats; ratios: median over repeats of the per-repeat"
            " ratio to plain.\n"
        )
        print(
            "| batch size | steps/round | plain (s/round) | lightning_fed (s/round) | ratio"
            " | Lightning Trainer per client"
            " (s/round) | ratio | goal (lightning_fed) |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|:---|")
        for bs, result in results.items():
            res = result[clock]
            med, ratio_a, ratio_c = res["median"], res["ratio_a"], res["ratio_c"]
            goal = GOALS.get(bs)
            verdict = "" if goal is None else f"<= {goal:.2f}x: {'met' if ratio_a <= goal else 'NOT met'}"
            a, b, c = (mark(result["loads"][way]) for way in "abc")
            print(
                f"| {bs} | {result['steps']} | {med['b']:.3f}{b} | {med['a']:.3f}{a} | {ratio_a:.3f}x{mark_of(a, b)} |"
                f" {med['c']:.3f}{c} | {ratio_c:.2f}x{mark_of(c, b)} | {verdict} |"
            )
        print(
            "\n" + footnote([load for result in results.values() for way in result["loads"].values() for load in way])
        )
    print("\nGoals: lightning_fed <= 1.10x plain at batch size 32, <= 1.25x at batch size 10.")
    print(f"Work per round: {args.clients} clients x {data}; identical for all three ways.")
    for bs, result in results.items():
        print(
            f"Same arithmetic check, batch {bs}: max |lightning_fed - plain| = {result['diff_ab']:.2e}, "
            f"max |Trainer per client - plain| = {result['diff_cb']:.2e} (final global weights)"
        )
        for clock in ("wall", "cpu"):
            values = result[clock]["all"]
            print(
                f"  per-repeat {clock} s/round: "
                + "; ".join(f"{k}: " + " ".join(f"{t:.3f}" for t in v) for k, v in values.items())
            )
    print(f"Total benchmark time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
