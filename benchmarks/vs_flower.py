"""Per-round time of the same FedAvg work in Flower's simulation engine (two of its APIs) and in lightning_fed.

The work (``benchmarks/vs_flower_work.py``): LeNet-5 on Fashion-MNIST, SGD (lr 0.01, no momentum), one local
epoch, the same batch size, the same clients per round, the same initial weights; every client trains the same
batches in the same order on both sides, read from one data file written here once. Three federations:
cross-silo (10 clients x 6 000 images, all train every round) and cross-device (100 x 60, all train; 1 000 x 60,
100 sampled per round).

Flower is run written against two of its APIs, as users write it (``--flower-apis``, both by default): the message
API (``ServerApp`` ``@app.main()`` with ``flwr.serverapp.strategy.FedAvg``, ``ClientApp`` ``@app.train()``;
``benchmarks/flower_app.py``) and the older ``NumPyClient`` API (a ``flwr.client.NumPyClient`` from a ``client_fn``,
``flwr.server.strategy.FedAvg`` from a ``server_fn``; ``benchmarks/flower_numpy_app.py``), which much existing Flower
code still uses. Both run with ``run_simulation`` in the same simulation engine; only the API differs.

Workers: 1 and 2. Flower: the Ray backend with ``num_cpus`` = workers and one CPU per client, so that many clients
train at once. lightning_fed: one process, or ``strategy="ddp"`` with that many CPU processes (gloo). One torch
thread per process on every side.

How it measures: every run is a fresh process; the end of every round is stamped (Flower: the strategy's
``evaluate_fn``, called right after aggregation; lightning_fed: ``on_train_epoch_end`` on rank 0), and the per-round
time is (T_R - T_1) / (R - 1), which leaves out start-up and the first round (Ray's actors, imports, reading the
data). The sides alternate within each repeat (their order rotates every repeat, so drift on a shared machine hits
all alike); the table gives median s/round over repeats and the median of the per-repeat Flower / lightning_fed
ratios, for each Flower API. Where every client trains every round, all sides compute the same FedAvg, so each
Flower API's final global model is compared with lightning_fed's as a check (they differ by float32 versus float64
averaging only).

Flower is optional (the ``bench`` extra). Keep it out of the project's environment if you like and point
``--flower-python`` at another interpreter that has ``flwr[simulation]`` and can import torch and lightning_fed::

    python benchmarks/vs_flower.py --rounds 4 --repeats 3    # 3 cases x 1 and 2 workers x 3 sides
    python benchmarks/vs_flower.py --cases cross-device-100 --workers 1 --repeats 1 --flower-apis numpyclient
    python benchmarks/vs_flower.py --cases cross-device-100 --flower-python /path/to/python
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


FLOWER_APIS = {
    "message": ("flower_app.py", "Flower message API"),
    "numpyclient": ("flower_numpy_app.py", "Flower NumPyClient"),
}
"""``--flower-apis`` choice: (the script of that side, in this folder; its name in the table)."""


def flower_side(api: str) -> str:
    """The side name of a Flower API in the plan and in file names: ``"flower-message"``."""
    return f"flower-{api}"


def flower_version(python: str) -> str | None:
    """``"flwr 1.42.0, ray 2.55.1"`` if ``python`` can import Flower's simulation engine, else ``None``."""
    probe = "import flwr, ray; print(f'flwr {flwr.__version__}, ray {ray.__version__}')"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass
class Measurement:
    """Per-repeat s/round of one case at one worker count.

    ``flower`` maps each Flower API that ran to its per-repeat times; it is empty when Flower was skipped.
    ``weight_diff`` maps an API to the largest difference between its final global model and lightning_fed's.
    """

    case: Case
    workers: int
    lightning_fed: list[float]
    flower: dict[str, list[float]] = field(default_factory=dict)
    weight_diff: dict[str, float] = field(default_factory=dict)
    lightning_fed_loads: list[LoadRecord] = field(default_factory=list)
    flower_loads: dict[str, list[LoadRecord]] = field(default_factory=dict)


def plan_runs(cases: list[str], workers: list[int], repeats: int, flower_apis: list[str]) -> list[tuple[str, int, str]]:
    """(case, workers, side) in run order: the sides alternate, their order rotating by one every repeat.

    With lightning_fed and one Flower API the order flips every repeat; with two APIs, three repeats put every side
    once first, once in the middle and once last. ``flower_apis`` is empty when Flower is skipped.
    """
    sides = ["lightning_fed"] + [flower_side(api) for api in flower_apis]
    runs = []
    for repeat in range(repeats):
        shift = repeat % len(sides)
        order = sides[shift:] + sides[:shift]
        for case in cases:
            for count in workers:
                runs += [(case, count, side) for side in order]
    return runs


def format_table(measurements: list[Measurement], batch_size: int, flower_apis: list[str]) -> str:
    """Markdown: median s/round of each side, and per Flower API the median of per-repeat API / lightning_fed ratios.

    A column per API of ``flower_apis``; an API that did not run (Flower missing) reads "skipped".
    """
    names = [FLOWER_APIS[api][1] for api in flower_apis]
    header = ["case", "clients x images, per round", "steps/round", "workers"]
    header += [f"{name} (s/round)" for name in names] + ["lightning_fed (s/round)"]
    header += [f"{name} / lightning_fed" for name in names]
    lines = ["| " + " | ".join(header) + " |", "|:---|:---|" + "---:|" * (len(header) - 2)]
    for m in measurements:
        # A median taken from any run at a load above the cores is marked (benchmarks/load.py); no record, no mark.
        ours_mark = mark(m.lightning_fed_loads) if m.lightning_fed_loads else ""
        times, ratios = [], []
        for api in flower_apis:
            theirs = m.flower.get(api)
            if theirs:
                loads = m.flower_loads.get(api, [])
                theirs_mark = mark(loads) if loads else ""
                times.append(f"{statistics.median(theirs):.3f}{theirs_mark}")
                ratio = statistics.median(f / o for f, o in zip(theirs, m.lightning_fed))
                ratios.append(f"**{ratio:.2f}×**{max(ours_mark, theirs_mark)}")
            else:
                times.append("skipped")
                ratios.append("–")
        row = [m.case.name, m.case.label, str(m.case.steps_per_round(batch_size)), str(m.workers)]
        row += times + [f"{statistics.median(m.lightning_fed):.3f}{ours_mark}"] + ratios
        lines.append("| " + " | ".join(row) + " |")
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
    if side.startswith("flower-"):
        script = FLOWER_APIS[side.removeprefix("flower-")][0]
        command = [args.flower_python, str(here / script), "--out", out, "--lr", str(LEARNING_RATE)]
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


def measure(args: argparse.Namespace, flower_apis: list[str], root: Path) -> list[Measurement]:
    """Runs the plan; ``flower_apis`` is empty when Flower is skipped."""
    paths = write_data_files(args.cases, args.data_dir, args.seed, root)
    results = {
        (case, count): Measurement(CASES[case], count, [], {api: [] for api in flower_apis})
        for case in args.cases
        for count in args.workers
    }
    for index, (case, count, side) in enumerate(plan_runs(args.cases, args.workers, args.repeats, flower_apis)):
        seconds, load = launch(side, case, count, paths[case], str(root / f"{side}_{case}_{count}.json"), args)
        result = results[case, count]
        times = result.flower[side.removeprefix("flower-")] if side != "lightning_fed" else result.lightning_fed
        times.append(seconds)
        if side == "lightning_fed":
            result.lightning_fed_loads.append(load)
        else:
            result.flower_loads.setdefault(side.removeprefix("flower-"), []).append(load)
        print(f"  run {index + 1}: {case}, {count} worker(s), {side}: {seconds:.3f}{mark(load)} s/round", flush=True)
    for (case, count), result in results.items():
        # Sampled clients differ between the samplers; with every client training, the work is the same FedAvg.
        if CASES[case].clients_per_round != CASES[case].num_clients:
            continue
        ours = str(root / f"lightning_fed_{case}_{count}.json.pt")
        for api in flower_apis:
            theirs = str(root / f"{flower_side(api)}_{case}_{count}.json.pt")
            result.weight_diff[api] = max_weight_diff(theirs, ours)
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
    parser.add_argument(
        "--flower-apis",
        nargs="+",
        choices=sorted(FLOWER_APIS),
        default=list(FLOWER_APIS),
        help="the Flower APIs to run, each a side of its own; default both",
    )
    parser.add_argument("--flower-python", default=sys.executable, help="interpreter for the Flower sides")
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
    apis = list(dict.fromkeys(args.flower_apis))  # a repeated choice runs once
    flower_apis = apis if flower is not None else []
    flower_note = f"{flower} ({', '.join(apis)})" if flower else "Flower skipped"
    import lightning

    print(
        f"FedAvg, LeNet-5 on Fashion-MNIST, SGD lr={LEARNING_RATE}, batch {args.batch_size}, 1 local epoch; "
        f"{args.rounds} rounds per run, {args.repeats} repeats; torch {torch.__version__}, lightning "
        f"{lightning.__version__}, {flower_note}; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = plan_runs(args.cases, args.workers, args.repeats, flower_apis)
    if args.dry_run:
        for case in args.cases:
            print(f"  {case}: {CASES[case].label}, {CASES[case].steps_per_round(args.batch_size)} steps per round")
        print(f"  {len(runs)} runs: " + ", ".join(f"{c}/{w}/{s}" for c, w, s in runs))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs_flower_") as root:
        measurements = measure(args, flower_apis, Path(root))
    print(f"\nWall time per round, (T_R - T_1) / (R - 1), median of {args.repeats} repeats; ratio: median of the")
    print("per-repeat ratios. Same work on every side (same batches); one torch thread per process.\n")
    print(format_table(measurements, args.batch_size, apis))
    print(
        footnote(
            [load for m in measurements for load in m.lightning_fed_loads]
            + [load for m in measurements for loads in m.flower_loads.values() for load in loads]
        )
    )
    for m in measurements:
        for api, diff in m.weight_diff.items():
            print(
                f"  {m.case.name}, {m.workers} worker(s): {FLOWER_APIS[api][1]}'s final global model differs from "
                f"lightning_fed's by {diff:.1e} at most"
            )
    print(f"\nLoad average at the end {os.getloadavg()[0]:.1f}; total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
