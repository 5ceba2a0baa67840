"""Per-round time of the same FedAvg work in Flower's simulation engine and in lightning_fed, side by side.

The work (``benchmarks/vs_flower_work.py``): LeNet-5 on Fashion-MNIST, SGD (lr 0.01, no momentum), one local
epoch, the same batch size, the same clients per round, the same initial weights; every client trains the same
batches in the same order on both sides, read from one data file written here once. Three federations:
cross-silo (10 clients x 6 000 images, all train every round) and cross-device (100 x 60, all train; 1 000 x 60,
100 sampled per round).

Workers: 1 and 2. Flower: the Ray backend with ``num_cpus`` = workers and one CPU per client, so that many clients
train at once (``benchmarks/flower_app.py``). lightning_fed: one process, or ``strategy="ddp"`` with that many CPU
processes (gloo). One torch thread per process on both sides.

How it measures: every run is a fresh process; the end of every round is stamped (Flower: the strategy's
``evaluate_fn``, called right after aggregation; lightning_fed: ``on_train_epoch_end`` on rank 0), and the per-round
time is (T_R - T_1) / (R - 1), which leaves out start-up and the first round (Ray's actors, imports, reading the
data). The two sides alternate within each repeat (their order flips every repeat, so drift on a shared machine hits
both alike); the table gives median s/round over repeats and the median of the per-repeat Flower / lightning_fed
ratios. Where every client trains every round, both sides compute the same FedAvg, so the final global models are
compared as a check (they differ by float32 versus float64 averaging only).

Flower is optional (the ``bench`` extra). Keep it out of the project's environment if you like and point
``--flower-python`` at another interpreter that has ``flwr[simulation]`` and can import torch and lightning_fed::

    python benchmarks/vs_flower.py --rounds 4 --repeats 3
    python benchmarks/vs_flower.py --cases cross-device-100 --workers 1 --repeats 1 --flower-python /path/to/python
    python benchmarks/vs_flower.py --dry-run            # the plan and the work per round, nothing run

Without Flower the lightning_fed side still runs and the Flower columns read "skipped".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from benchmarks.vs_flower_work import (
    CASES,
    LEARNING_RATE,
    Case,
    ContiguousPartitioner,
    load_case_data,
    per_round_time,
    write_case_data,
)
from lightning_fed.checks import InvalidArgumentError, check_int
from lightning_fed.datamodules import DatasetFederated, FashionMNISTFederated
from lightning_fed.datamodules.partitioners import IidPartitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset

FLOWER_MISSING = (
    "Flower is not installed for {python} (`import flwr, ray` failed): the Flower side is skipped. Install "
    "`flwr[simulation]` (the project's `bench` extra) there, or pass --flower-python an interpreter that has it."
)


def flower_version(python: str) -> str | None:
    """``"flwr 1.42.0, ray 2.55.1"`` if ``python`` can import Flower's simulation engine, else ``None``."""
    probe = "import flwr, ray; print(f'flwr {flwr.__version__}, ray {ray.__version__}')"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass
class Measurement:
    """Per-repeat s/round of one case at one worker count; ``flower`` is ``None`` when Flower was skipped."""

    case: Case
    workers: int
    lightning_fed: list[float]
    flower: list[float] | None
    weight_diff: float | None = None
    lightning_fed_loads: list[LoadRecord] = field(default_factory=list)
    flower_loads: list[LoadRecord] = field(default_factory=list)


def plan_runs(cases: list[str], workers: list[int], repeats: int, with_flower: bool) -> list[tuple[str, int, str]]:
    """(case, workers, side) in run order: the sides alternate, their order flipping every repeat."""
    runs = []
    for repeat in range(repeats):
        sides = ["lightning_fed", "flower"] if with_flower else ["lightning_fed"]
        for case in cases:
            for count in workers:
                runs += [(case, count, side) for side in (sides if repeat % 2 == 0 else sides[::-1])]
    return runs


def format_table(measurements: list[Measurement], batch_size: int) -> str:
    """Markdown: median s/round of each side and the median of the per-repeat Flower / lightning_fed ratios."""
    lines = [
        "| case | clients x images, per round | steps/round | workers | Flower (s/round) | lightning_fed (s/round)"
        " | Flower / lightning_fed |",
        "|:---|:---|---:|---:|---:|---:|---:|",
    ]
    for m in measurements:
        # A median taken from any run at a load above the cores is marked (benchmarks/load.py); no record, no mark.
        ours_mark = mark(m.lightning_fed_loads) if m.lightning_fed_loads else ""
        ours = f"{statistics.median(m.lightning_fed):.3f}{ours_mark}"
        if m.flower is None:
            flower, ratio = "skipped", "–"
        else:
            flower_mark = mark(m.flower_loads) if m.flower_loads else ""
            flower = f"{statistics.median(m.flower):.3f}{flower_mark}"
            flower_over_ours = statistics.median(f / o for f, o in zip(m.flower, m.lightning_fed))
            ratio = f"**{flower_over_ours:.2f}×**{max(ours_mark, flower_mark)}"
        lines.append(
            f"| {m.case.name} | {m.case.label} | {m.case.steps_per_round(batch_size)} | {m.workers} | {flower} | {ours}"
            f" | {ratio} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------------
# The lightning_fed side: one fit in this process (Lightning's DDP launcher re-runs the command for the other ranks).


def make_datamodule(case: Case, data: str | Path, batch_size: int, seed: int) -> DatasetFederated:
    x, y = load_case_data(data)
    dataset = TensorClassificationDataset(x, y)
    # The runs evaluate nothing; a test set is required all the same, and the training images cost no copy.
    return DatasetFederated(
        dataset,
        dataset,
        10,
        ContiguousPartitioner(case),
        batch_size=batch_size,
        client_test_fraction=0.0,
        seed=seed,
    )


def run_lightning_fed(
    case: Case, data: str | Path, workers: int, rounds: int, batch_size: int, seed: int, out: str
) -> None:
    """Fits FedAvg on ``case``; rank 0 writes the round ends to ``out`` and the final LeNet-5 weights to ``out.pt``."""
    from benchmarks.speed import RoundClock, benchmark_trainer, make_module

    clock = RoundClock()
    trainer = benchmark_trainer(
        rounds,
        case.clients_per_round,
        seed,
        tempfile.mkdtemp(prefix="lightning_fed_vs_flower_"),
        devices=workers,
        strategy="ddp" if workers > 1 else "auto",
        callbacks=[clock],
    )
    module = make_module(seed)
    trainer.fit(module, datamodule=make_datamodule(case, data, batch_size, seed))
    if trainer.is_global_zero:
        torch.save({k: v.detach().clone() for k, v in module.backbone.state_dict().items()}, out + ".pt")
        Path(out).write_text(json.dumps({"round_ends": clock.ends}))


# --------------------------------------------------------------------------------------------------------------------
# The driver: data files, fresh processes, the table.


def write_data_files(cases: list[str], data_dir: str, seed: int, out_dir: Path) -> dict[str, Path]:
    train, _ = FashionMNISTFederated(IidPartitioner(1), data_dir=data_dir, download=False)._load_datasets()
    paths = {}
    for name in cases:
        paths[name] = out_dir / f"{name}.pt"
        write_case_data(CASES[name], train.inputs, train.targets, seed, paths[name])
    return paths


def launch(
    side: str, case: str, workers: int, data: Path, out: str, args: argparse.Namespace
) -> tuple[float, LoadRecord]:
    """Runs one side in a fresh process and returns its per-round time and the load around the run."""
    here = Path(__file__).resolve().parent
    if side == "flower":
        command = [args.flower_python, str(here / "flower_app.py"), "--out", out, "--lr", str(LEARNING_RATE)]
    else:
        command = [sys.executable, str(here / "vs_flower.py"), "--lightning-fed-worker", out]
    command += ["--case", case, "--workers", str(workers), "--data", str(data), "--rounds", str(args.rounds)]
    command += ["--batch-size", str(args.batch_size), "--seed", str(args.seed)]
    pythonpath = os.pathsep.join(filter(None, [str(here.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    for attempt in (1, 2):
        # One torch thread per worker process: the run keeps `workers` cores busy.
        with open(out + ".log", "w") as log, LoadRecorder(workers, args.wait_quiet) as load:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.run_timeout)
        if done.returncode == 0:
            return per_round_time(json.loads(Path(out).read_text())["round_ends"]), load.record
        tail = "\n".join(Path(out + ".log").read_text().splitlines()[-15:])
        # Ray's start-up can time out on an overloaded machine; one retry, reported, keeps a long run going.
        print(f"  {side} on {case} with {workers} worker(s) failed (attempt {attempt}); its output ends:\n{tail}")
    raise RuntimeError(f"{side} on {case} with {workers} worker(s) failed twice; see above.")


def max_weight_diff(a: str, b: str) -> float:
    first, second = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return max(float((first[k].double() - second[k].double()).abs().max()) for k in first)


def measure(args: argparse.Namespace, flower: str | None, root: Path) -> list[Measurement]:
    paths = write_data_files(args.cases, args.data_dir, args.seed, root)
    results = {
        (case, count): Measurement(CASES[case], count, [], [] if flower else None)
        for case in args.cases
        for count in args.workers
    }
    for index, (case, count, side) in enumerate(plan_runs(args.cases, args.workers, args.repeats, flower is not None)):
        seconds, load = launch(side, case, count, paths[case], str(root / f"{side}_{case}_{count}.json"), args)
        result = results[case, count]
        times = result.flower if side == "flower" else result.lightning_fed
        assert times is not None  # no Flower run is planned without Flower
        times.append(seconds)
        (result.flower_loads if side == "flower" else result.lightning_fed_loads).append(load)
        print(f"  run {index + 1}: {case}, {count} worker(s), {side}: {seconds:.3f}{mark(load)} s/round", flush=True)
    for (case, count), result in results.items():
        # Sampled clients differ between the two samplers; with every client training, the work is the same FedAvg.
        if flower is not None and CASES[case].clients_per_round == CASES[case].num_clients:
            finals = [str(root / f"{side}_{case}_{count}.json.pt") for side in ("flower", "lightning_fed")]
            result.weight_diff = max_weight_diff(*finals)
    return list(results.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (>= 2); default 4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=os.environ.get("LIGHTNING_FED_DATA", "data"))
    parser.add_argument("--flower-python", default=sys.executable, help="interpreter for the Flower side")
    parser.add_argument("--run-timeout", type=float, default=1800, help="seconds before one run is given up")
    add_wait_quiet_argument(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the work per round only")
    parser.add_argument("--lightning-fed-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        check_int("--rounds", args.rounds, minimum=2)  # (T_R - T_1) / (R - 1) leaves out the first round
        check_int("--repeats", args.repeats, minimum=1)
        check_int("--batch-size", args.batch_size, minimum=1)
        for count in args.workers:
            check_int("--workers", count, minimum=1)
    except InvalidArgumentError as error:
        parser.error(str(error))
    if args.lightning_fed_worker:
        torch.set_num_threads(1)
        from benchmarks.speed import quiet, silence_lightning

        silence_lightning()
        with quiet():
            run_lightning_fed(
                CASES[args.case],
                args.data,
                args.workers[0],
                args.rounds,
                args.batch_size,
                args.seed,
                args.lightning_fed_worker,
            )
        return

    flower = flower_version(args.flower_python)
    if flower is None:
        print(FLOWER_MISSING.format(python=args.flower_python), flush=True)
    import lightning

    print(
        f"FedAvg, LeNet-5 on Fashion-MNIST, SGD lr={LEARNING_RATE}, batch {args.batch_size}, 1 local epoch; "
        f"{args.rounds} rounds per run, {args.repeats} repeats; torch {torch.__version__}, lightning "
        f"{lightning.__version__}, {flower or 'Flower skipped'}; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = plan_runs(args.cases, args.workers, args.repeats, flower is not None)
    if args.dry_run:
        for case in args.cases:
            print(f"  {case}: {CASES[case].label}, {CASES[case].steps_per_round(args.batch_size)} steps per round")
        print(f"  {len(runs)} runs: " + ", ".join(f"{c}/{w}/{s}" for c, w, s in runs))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs_flower_") as root:
        measurements = measure(args, flower, Path(root))
    print(f"\nWall time per round, (T_R - T_1) / (R - 1), median of {args.repeats} repeats; ratio: median of the")
    print("per-repeat ratios. Same work on both sides (same batches); one torch thread per process.\n")
    print(format_table(measurements, args.batch_size))
    print(footnote([load for m in measurements for load in m.lightning_fed_loads + m.flower_loads]))
    for m in measurements:
        if m.weight_diff is not None:
            print(f"  {m.case.name}, {m.workers} worker(s): final global models differ by {m.weight_diff:.1e} at most")
    print(f"\nLoad average at the end {os.getloadavg()[0]:.1f}; total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
