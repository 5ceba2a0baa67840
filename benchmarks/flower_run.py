"""What both Flower sides of ``vs_flower.py`` share: one run's arguments, its Ray resources, its data and its output.

``flower_app.py`` (the message API) and ``flower_numpy_app.py`` (the older ``NumPyClient`` API) differ only in how
the FedAvg is written against Flower; everything that makes their figures comparable lives here, once: the command
line ``vs_flower.py`` calls them with, the Ray backend (``workers`` CPUs, one per client), the per-actor read of the
data file and what a finished run writes for the driver (round ends, final weights).

Nothing here imports Flower.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.vs_flower_work import CASES, load_case_data

_DATA: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
"""Per Ray actor: the data file, read on the actor's first message (in round 1, which is not timed)."""


def actor_data(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The data file at ``path``, read once per process (each Ray actor is one)."""
    if path not in _DATA:
        _DATA[path] = load_case_data(path)
    return _DATA[path]


def backend_config(workers: int) -> dict[str, Any]:
    """Ray with ``workers`` CPUs and one CPU per client, so that ``workers`` clients train at once."""
    return {
        "init_args": {"num_cpus": workers, "num_gpus": 0, "logging_level": "error", "log_to_driver": False},
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    }


def parse_run_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line ``vs_flower.py`` gives one Flower run (either API); also quiets Flower and torch."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    return args


def write_run(args: argparse.Namespace, round_ends: list[float], final: dict[str, torch.Tensor]) -> None:
    """Writes the round ends to ``args.out`` and the final global weights to ``args.out + ".pt"``.

    Raises:
        RuntimeError: If Flower stopped before the last round (its log, above, says why).
    """
    if len(round_ends) != args.rounds:
        raise RuntimeError(f"Flower finished {len(round_ends)} of {args.rounds} rounds; see its log above.")
    torch.save(final, args.out + ".pt")
    Path(args.out).write_text(json.dumps({"round_ends": round_ends}))


def simulate(
    args: argparse.Namespace,
    build_server_app: Callable[[Any, argparse.Namespace, list[float], dict[str, torch.Tensor]], Any],
    build_client_app: Callable[[], Any],
) -> None:
    """One run of ``vs_flower.py``'s Flower side in Flower's simulation engine, whichever API built the two apps:
    ``build_server_app(case, args, round_ends, final)`` stamps each round's end and keeps the final weights."""
    from flwr.simulation import run_simulation

    case = CASES[args.case]
    round_ends: list[float] = []
    final: dict[str, torch.Tensor] = {}
    run_simulation(
        server_app=build_server_app(case, args, round_ends, final),
        client_app=build_client_app(),
        num_supernodes=case.num_clients,
        backend_config=backend_config(args.workers),
    )
    write_run(args, round_ends, final)
