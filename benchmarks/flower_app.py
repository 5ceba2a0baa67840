"""The Flower side of ``vs_flower.py``: FedAvg as a Flower ``ServerApp`` and ``ClientApp`` in its simulation engine.

Written against Flower's message API (``flwr.clientapp.ClientApp``, ``flwr.serverapp.ServerApp`` with a ``Grid``,
``flwr.serverapp.strategy.FedAvg``) and run with ``flwr.simulation.run_simulation`` on the Ray backend, the way
Flower's documentation sets up a simulation: one virtual SuperNode per client, ``workers`` Ray actors
(``init_args.num_cpus = workers``, ``client_resources.num_cpus = 1``), no federated evaluation. The client trains
the batches of :func:`benchmarks.vs_flower_work.client_batches`, so its work equals a lightning_fed client's.

The end of every round is stamped by the strategy's ``evaluate_fn``, which ``Strategy.start`` calls right after the
round's aggregation; it evaluates nothing.

Run as ``python benchmarks/flower_app.py --case cross-silo --workers 2 --data <file> --out <json>`` (what
``vs_flower.py`` does, in a fresh process per run). Flower is imported only here, and only when this runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.vs_flower_work import CASES, Case, client_batches, load_case_data, make_model, train_on_batches

_DATA: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
"""Per Ray actor: the data file, read on the actor's first message (in round 1, which is not timed)."""


def _actor_data(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    if path not in _DATA:
        _DATA[path] = load_case_data(path)
    return _DATA[path]


def build_client_app() -> Any:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        config = msg.content["config"]
        case = CASES[str(config["case"])]
        client_id = int(context.node_config["partition-id"])
        x, y = _actor_data(str(config["data"]))
        model = make_model(0)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        batches = client_batches(
            x, y, case, client_id, int(config["server-round"]) - 1, int(config["batch-size"]), int(config["seed"])
        )
        train_on_batches(model, batches, float(config["lr"]))
        reply = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": case.samples_per_client}),
            }
        )
        return Message(content=reply, reply_to=msg)

    return app


def build_server_app(case: Case, args: argparse.Namespace, round_ends: list[float], final: dict) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(
            fraction_train=case.clients_per_round / case.num_clients,
            fraction_evaluate=0.0,
            min_available_nodes=case.num_clients,
        )

        def stamp_round_end(server_round: int, arrays: ArrayRecord) -> None:
            if server_round > 0:  # 0 is the initial model, before any round
                round_ends.append(time.perf_counter())

        train_config = ConfigRecord(
            {"case": case.name, "data": args.data, "batch-size": args.batch_size, "lr": args.lr, "seed": args.seed}
        )
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(make_model(args.seed).state_dict()),
            num_rounds=args.rounds,
            train_config=train_config,
            evaluate_fn=stamp_round_end,
        )
        final.update(result.arrays.to_torch_state_dict())

    return app


def run(args: argparse.Namespace) -> None:
    from flwr.simulation import run_simulation

    case = CASES[args.case]
    round_ends: list[float] = []
    final: dict[str, torch.Tensor] = {}
    backend_config = {
        "init_args": {"num_cpus": args.workers, "num_gpus": 0, "logging_level": "error", "log_to_driver": False},
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    }
    run_simulation(
        server_app=build_server_app(case, args, round_ends, final),
        client_app=build_client_app(),
        num_supernodes=case.num_clients,
        backend_config=backend_config,
    )
    if len(round_ends) != args.rounds:
        raise RuntimeError(f"Flower finished {len(round_ends)} of {args.rounds} rounds; see its log above.")
    torch.save(final, args.out + ".pt")
    Path(args.out).write_text(json.dumps({"round_ends": round_ends}))


def main() -> None:
    parser = argparse.ArgumentParser(description="One Flower simulation run of vs_flower.py.")
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    run(args)


if __name__ == "__main__":
    main()
