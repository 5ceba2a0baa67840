"""The Flower side of ``vs_flower.py``: FedAvg as a Flower ``ServerApp`` and ``ClientApp`` in its simulation engine.

Written against Flower's message API (``flwr.clientapp.ClientApp``, ``flwr.serverapp.ServerApp`` with a ``Grid``,
``flwr.serverapp.strategy.FedAvg``) and run with ``flwr.simulation.run_simulation`` on the Ray backend, the way
Flower's documentation sets up a simulation: one virtual SuperNode per client, ``workers`` Ray actors
(``init_args.num_cpus = workers``, ``client_resources.num_cpus = 1``), no federated evaluation. The client trains
the batches of :func:`benchmarks.vs_flower_work.client_batches`, so its work equals a lightning_fed client's.

The end of every round is stamped by the strategy's ``evaluate_fn``, which ``Strategy.start`` calls right after the
round's aggregation; it evaluates nothing.

Run as ``python benchmarks/flower_app.py --case cross-silo --workers 2 --data <file> --out <json>`` (what
``vs_flower.py --flower-apis message`` does, in a fresh process per run). Flower is imported only in the two Flower
apps (this one and ``flower_numpy_app.py``), and only when they run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flower_run import actor_data, parse_run_args, simulate
from benchmarks.vs_flower_work import CASES, Case, client_batches, make_model, train_on_batches


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
        x, y = actor_data(str(config["data"]))
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
    simulate(args, build_server_app, build_client_app)


def main() -> None:
    run(parse_run_args("One Flower simulation run of vs_flower.py, written against the message API."))


if __name__ == "__main__":
    main()
