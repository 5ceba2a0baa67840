"""The other Flower side of ``vs_flower.py``: the same FedAvg written against Flower's older ``NumPyClient`` API.

Much existing Flower code predates the message API of ``flower_app.py``: a ``flwr.client.NumPyClient`` subclass
(``get_parameters`` / ``fit`` / ``evaluate`` on lists of NumPy arrays) returned by a ``client_fn``, and a
``flwr.server.strategy.FedAvg`` returned in ``ServerAppComponents`` by a ``server_fn``, both wrapped in the
compatibility ``ClientApp(client_fn=...)`` / ``ServerApp(server_fn=...)`` and run with
``flwr.simulation.run_simulation``. Flower 1.42 still runs this (the older ``start_simulation`` is deprecated
since 1.13, and ``run_simulation`` itself logs a deprecation warning in 1.42 on both sides), so this is the code a
user who wrote it a few releases ago still runs today.

Everything else is the message-API side's (``benchmarks/flower_run.py``): the same Ray backend (``workers`` CPUs, one
per client), one virtual SuperNode per client, no federated evaluation (``fraction_evaluate=0``), the same initial
weights (``initial_parameters``), the same batches (:func:`benchmarks.vs_flower_work.client_batches`), and the end
of every round stamped by the strategy's ``evaluate_fn``, which the legacy ``Server.fit`` calls right after each
round's aggregation; it evaluates nothing and keeps the last round's weights for the final-model check.

Run as ``python benchmarks/flower_numpy_app.py --case cross-silo --workers 2 --data <file> --out <json>`` (what
``vs_flower.py --flower-apis numpyclient`` does, in a fresh process per run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flower_run import actor_data, parse_run_args, simulate
from benchmarks.vs_flower_work import CASES, Case, client_batches, make_model, train_on_batches


def get_weights(model: torch.nn.Module) -> list[np.ndarray]:
    """The model's state as the list of NumPy arrays a ``NumPyClient`` exchanges, in ``state_dict`` order."""
    return [tensor.detach().cpu().numpy() for tensor in model.state_dict().values()]


def set_weights(model: torch.nn.Module, weights: list[np.ndarray]) -> None:
    """Loads arrays in ``state_dict`` order, the inverse of :func:`get_weights`."""
    keys = model.state_dict().keys()
    model.load_state_dict({key: torch.from_numpy(np.copy(array)) for key, array in zip(keys, weights)}, strict=True)


def build_client_app() -> Any:
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context

    class LeNetClient(NumPyClient):
        """One Fashion-MNIST client: its rows of the data file, LeNet-5, a fresh SGD each round."""

        def __init__(self, client_id: int) -> None:
            self.client_id = client_id
            self.model = make_model(0)  # overwritten by the global weights before any use

        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return get_weights(self.model)

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
            torch.set_num_threads(1)
            case = CASES[str(config["case"])]
            set_weights(self.model, parameters)
            x, y = actor_data(str(config["data"]))
            batches = client_batches(
                x,
                y,
                case,
                self.client_id,
                int(config["server-round"]) - 1,
                int(config["batch-size"]),
                int(config["seed"]),
            )
            train_on_batches(self.model, batches, float(config["lr"]))
            return get_weights(self.model), case.samples_per_client, {}

        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict]:
            # Never called here (fraction_evaluate=0), as on the message-API side; written as users write it.
            case = CASES[str(config["case"])]
            set_weights(self.model, parameters)
            x, y = actor_data(str(config["data"]))
            rows = slice(self.client_id * case.samples_per_client, (self.client_id + 1) * case.samples_per_client)
            self.model.eval()
            with torch.no_grad():
                logits = self.model(x[rows])
            accuracy = float((logits.argmax(1) == y[rows]).float().mean())
            return float(F.cross_entropy(logits, y[rows])), case.samples_per_client, {"accuracy": accuracy}

    def client_fn(context: Context) -> Any:
        return LeNetClient(int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn)


def build_server_app(case: Case, args: argparse.Namespace, round_ends: list[float], final: dict) -> Any:
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg

    reference = make_model(args.seed)
    keys = list(reference.state_dict())

    def fit_config(server_round: int) -> dict[str, Any]:
        # What the message-API side sends in its train config; ``server-round`` is added there by the strategy.
        return {
            "case": case.name,
            "data": args.data,
            "batch-size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "server-round": server_round,
        }

    def stamp_round_end(server_round: int, weights: list[np.ndarray], config: dict[str, Any]) -> None:
        if server_round > 0:  # 0 is the initial model, before any round
            round_ends.append(time.perf_counter())
            if server_round == args.rounds:
                final.update({key: torch.from_numpy(np.copy(array)) for key, array in zip(keys, weights)})

    def server_fn(context: Context) -> Any:
        strategy = FedAvg(
            fraction_fit=case.clients_per_round / case.num_clients,
            fraction_evaluate=0.0,
            min_fit_clients=case.clients_per_round,
            min_available_clients=case.num_clients,
            evaluate_fn=stamp_round_end,
            on_fit_config_fn=fit_config,
            initial_parameters=ndarrays_to_parameters(get_weights(reference)),
        )
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=args.rounds))

    return ServerApp(server_fn=server_fn)


def run(args: argparse.Namespace) -> None:
    simulate(args, build_server_app, build_client_app)


def main() -> None:
    run(parse_run_args("One Flower simulation run of vs_flower.py, written against the NumPyClient API."))


if __name__ == "__main__":
    main()
