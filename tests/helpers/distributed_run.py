"""A small federated run on 1 process or on N CPU processes (``strategy="ddp"``, gloo); used by the distributed tests.

Usage: python distributed_run.py ROOT OUT --devices N --algorithm NAME [--rounds N] [--resume]
[--kill-round R --kill-client-index I] [--pause-round R --pause-client-index I --marker PATH]

Every rank writes ``OUT.rank<r>`` with its final weights, client store, callback and aggregator states, the round
history, each client's locally trained model per round (only for the clients it trained), and ``global_step``.
``--kill-round`` SIGKILLs the whole process group (every rank, as a crashed node would) when rank 0 has finished
its ``--kill-client-index``-th client of that round; ``--pause-round`` makes rank 0 wait there instead, for a test
to send a real signal (``Pauser`` in ``resume_run.py``). In-process callers use :func:`fit` directly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.loggers import Logger
from torchmetrics.classification import MulticlassAccuracy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.boring import NUM_CLASSES, BoringClassifier, make_datamodule
from helpers.resume_run import Pauser
from lightning_fed import FedCallback, FederatedTrainer
from lightning_fed.aggregators import DPFedAvg, FedAdam, FedAvg, QFedAvg
from lightning_fed.callbacks import FedCurv, FedProx, RFedAvg, Scaffold
from lightning_fed.parallel.reduction import CrossProcessState

NUM_ROUNDS = 3
CLIENTS_PER_ROUND = {"robust": 6}  # MultiKrum with f = 1 needs n > 2f + 2; the others sample 4 of the 6 clients


class MetricClassifier(BoringClassifier):
    """Logs a torchmetrics accuracy object in ``test_step``: such a metric syncs across ranks when it computes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.test_metric = MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        x, y = batch
        self.test_metric(self(x), y)
        self.log("test_metric_acc", self.test_metric)


class ClientModels(FedCallback):
    """Keeps each client's locally trained model, per round, on the rank that trained it."""

    supports_batched_clients = True

    def __init__(self) -> None:
        self.models: dict[str, dict[str, torch.Tensor]] = {}

    def on_client_end(self, trainer: Any, pl_module: Any, client_ctx: Any, update: Any) -> None:
        key = f"{client_ctx.round_idx}/{client_ctx.client_id}"
        self.models[key] = {name: t.detach().cpu().clone() for name, t in update.params.items()}


class DeclaredState(FedCallback, CrossProcessState):
    """Declares one round state of each reduction and records, per round, what ``reduce_round_state`` made of it."""

    def __init__(self) -> None:
        self.reduced: list[dict[str, Any]] = []

    def on_round_start(self, trainer: Any, pl_module: Any, round_ctx: Any) -> None:
        self.client_ids = list(round_ctx.client_ids)
        self.add_round_state("sums", {"samples": torch.zeros((), dtype=torch.int64), "ids": torch.zeros(2)})
        self.add_round_state("count", 0)
        self.add_round_state("weight", 0.0)
        self.add_round_state("steps", {}, reduce="merge")
        self.add_round_state("last", (-1, None), reduce="last")

    def on_client_end(self, trainer: Any, pl_module: Any, client_ctx: Any, update: Any) -> None:
        cid = client_ctx.client_id
        self.sums["samples"] += client_ctx.num_samples
        self.sums["ids"] += torch.tensor([1.0, cid])
        self.count += 1
        self.weight += 0.5 * cid
        self.steps[cid] = client_ctx.num_steps
        self.last = (self.client_ids.index(cid), {"client": torch.tensor(cid)})

    def on_aggregate(self, trainer: Any, pl_module: Any, round_ctx: Any, new_params: Any) -> None:
        self.reduce_round_state()
        self.reduced.append(
            {
                "client_ids": self.client_ids,
                "samples": self.sums["samples"].clone(),
                "ids": self.sums["ids"].clone(),
                "count": self.count,
                "weight": self.weight,
                "steps": dict(sorted(self.steps.items())),
                "last": (self.last[0], self.last[1]["client"].clone()),
            }
        )

    def state_dict(self) -> dict[str, Any]:
        return {"reduced": self.reduced}


class Selections(FedCallback):
    """Records which clients the (wrapped) robust aggregator kept, per round."""

    def __init__(self) -> None:
        self.selected: list[list[int]] = []

    def on_aggregate(self, trainer: Any, pl_module: Any, round_ctx: Any, new_params: Any) -> None:
        self.selected.append(list(trainer.aggregator.aggregator.selected_clients))

    def state_dict(self) -> dict[str, Any]:
        return {"selected": self.selected}


class ShardPoison(FedCallback):
    """Makes the losses NaN, so that the ranks hold unequal numbers of accepted updates: in round 1 the first client
    of rank 0's share, in round 2 every client of rank 1's share (rank 1 then has none, and too few remain for the
    aggregator). The shares are computed as a 2-process run splits the round, so 1 process rejects the same clients.
    """

    def on_round_start(self, trainer: Any, pl_module: Any, round_ctx: Any) -> None:
        from lightning_fed.parallel.distributed import shard_clients

        shares = shard_clients(round_ctx.client_ids, round_ctx.num_samples, 2)
        self.poisoned = {1: shares[0][:1], 2: shares[1]}.get(round_ctx.round_idx, [])

    def on_client_start(self, trainer: Any, pl_module: Any, client_ctx: Any) -> None:
        pl_module.poison = client_ctx.client_id in self.poisoned


class Killer(FedCallback):
    """SIGKILLs every process of the run when rank 0 has trained its ``client_index``-th client of ``round_idx``."""

    def __init__(self, round_idx: int, client_index: int) -> None:
        self.round_idx, self.client_index, self.seen = round_idx, client_index, 0

    def on_round_start(self, trainer: Any, pl_module: Any, round_ctx: Any) -> None:
        self.seen = 0

    def on_client_end(self, trainer: Any, pl_module: Any, client_ctx: Any, update: Any) -> None:
        if trainer.global_rank == 0 and client_ctx.round_idx == self.round_idx and self.seen == self.client_index:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        self.seen += 1


class RankLogger(Logger):
    """Appends what it is asked to log to ``<root>/log_rank<r>.jsonl``, on every rank (no rank-zero filter)."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    @property
    def name(self) -> str:
        return "rank_logger"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
        with open(Path(self.root) / f"log_rank{rank}.jsonl", "a") as file:
            file.write(json.dumps(sorted(metrics)) + "\n")


def algorithm(name: str) -> tuple[Any, list[FedCallback], float, bool]:
    """(aggregator, callbacks, SGD momentum, keep_optimizer_state) for an algorithm name."""
    if name == "fedavg":
        return FedAvg(), [], 0.9, True
    if name == "stateful":
        # SCAFFOLD's c_i and c, FedCurv's per-client statistics and server sums, rFedAvg's per-client δ.
        callbacks = [Scaffold(), FedCurv(lam=0.1), RFedAvg(lam=0.01, variant="v1", feature_layer="net.2")]
        return FedAvg(weighting="uniform"), callbacks, 0.0, False
    if name == "qfedavg":
        # DeclaredState: every reduction of lightning_fed.parallel.reduction, compared between 1 and 2 processes.
        return QFedAvg(q=1.0), [DeclaredState()], 0.0, False
    if name == "dpfedavg":
        # Clipped sums reduced over ranks, then the same noise added once on every rank; adaptive clip norm.
        dp = DPFedAvg(clip_norm=0.5, noise_multiplier=1.0, adaptive_clipping=True, clipped_count_stddev=1.0, delta=1e-3)
        return dp, [], 0.0, False
    if name == "fedamp":
        # Every client's personalised w_j feeds every cloud model u_i; clients are evaluated with their own w_i.
        from lightning_fed.callbacks import FedAMP

        return FedAvg(), [FedAMP(alpha_k=0.5, lam=1.0, sigma=2.0, heatmap_every_n_rounds=0)], 0.0, False
    if name == "robust":
        # Every client of the round is needed on every rank: the rows are gathered and put in round order.
        from lightning_fed.aggregators import MultiKrum, NormBound

        return (
            NormBound(MultiKrum(num_byzantine=1, num_selected=3), max_norm=0.6),
            [Selections(), ShardPoison()],
            0.0,
            False,
        )
    if name == "attacks":
        # "A little is enough": every rank needs the honest updates of the attackers that the others trained.
        from lightning_fed.attacks import MaliciousClients

        return FedAvg(), [MaliciousClients(fraction=0.5, attack="alie")], 0.0, False
    if name == "fedadam":
        # Server state (m, v) computed from the reduced mean on every rank; BatchNorm buffers averaged, not stepped.
        return FedAdam(server_lr=0.05), [], 0.0, False
    if name == "batched":
        # Clients trained side by side in groups of 2 (client_parallelism=2) with the batched hooks of SCAFFOLD's
        # after-step correction (momentum) and FedProx's gradient; the module has no BatchNorm or dropout.
        return FedAvg(weighting="uniform"), [Scaffold(), FedProx(mu=0.1)], 0.9, False
    raise ValueError(f"unknown algorithm {name!r}")


def fit(
    root: str,
    devices: int,
    name: str,
    kill: tuple[int, int] | None = None,
    resume: bool = False,
    num_rounds: int = NUM_ROUNDS,
    pause: tuple[int, int, str] | None = None,
) -> tuple[FederatedTrainer, ClientModels]:
    torch.set_num_threads(1)
    L.seed_everything(0)
    aggregator, callbacks, momentum, keep_optimizer_state = algorithm(name)
    batched = name == "batched"
    module = MetricClassifier(lr=0.1, momentum=momentum, batch_norm=not batched, dropout=0.0 if batched else 0.2)
    datamodule = make_datamodule(num_clients=6, num_samples=300, val_fraction=0.1, batch_size=16)
    models = ClientModels()
    extra = [Killer(*kill)] if kill is not None else []
    extra += [Pauser(*pause)] if pause is not None else []
    trainer = FederatedTrainer(
        num_rounds=num_rounds,
        clients_per_round=CLIENTS_PER_ROUND.get(name, 4),
        local_epochs=1,
        aggregator=aggregator,
        keep_optimizer_state=keep_optimizer_state,
        client_parallelism=2 if batched else 1,
        callbacks=[*callbacks, models, *extra],
        # When to crash is not part of the experiment: the resumed run has no Killer.
        resume_allow_changes=["callbacks.Killer", "callbacks.Pauser"],
        default_root_dir=root,
        run_dir=str(Path(root) / "run"),
        logger=RankLogger(root),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path="last" if resume else None)
    return trainer, models


def result(trainer: FederatedTrainer, models: ClientModels) -> dict[str, Any]:
    """What the tests compare, from one rank."""
    return {
        "weights": {n: t.detach().cpu().clone() for n, t in trainer.lightning_module.state_dict().items()},
        "history": trainer.federation_state.history,
        "store": trainer.federation_state.store.state_dict(),
        "callback_states": [
            cb.state_dict()
            for cb in trainer.callbacks
            if isinstance(cb, FedCallback) and not isinstance(cb, ClientModels)
        ],
        "aggregator_state": trainer.aggregator.state_dict(),
        "client_models": models.models,
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "seed": trainer.federation_state.seed,
        "client_group_size": trainer.fed_runner.batched.size if trainer.fed_runner is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--kill-round", type=int, default=-1)
    parser.add_argument("--kill-client-index", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--rounds", type=int, default=NUM_ROUNDS)
    parser.add_argument("--pause-round", type=int, default=-1)
    parser.add_argument("--pause-client-index", type=int, default=0)
    parser.add_argument("--marker", default=None)
    args = parser.parse_args()
    kill = (args.kill_round, args.kill_client_index) if args.kill_round >= 0 else None
    pause = (args.pause_round, args.pause_client_index, args.marker) if args.pause_round >= 0 else None
    trainer, models = fit(args.root, args.devices, args.algorithm, kill, args.resume, args.rounds, pause)
    torch.save(result(trainer, models), f"{args.out}.rank{trainer.global_rank}")


if __name__ == "__main__":
    main()
