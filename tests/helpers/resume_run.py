"""A run that can kill itself (SIGKILL) mid-round and resume from `last`; used by the resume tests.

Usage: python resume_run.py ROOT OUT [--kill-round R --kill-client-index I] [--resume]
[--pause-round R --pause-client-index I --marker PATH]

``--pause-round`` makes the run wait after that client (writing ``PATH``, then waiting for ``PATH.go``), so that a
test can send it a real signal at a known client boundary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.boring import BoringClassifier, make_datamodule
from lightning_fed import FedCallback, FederatedTrainer


class Killer(FedCallback):
    """SIGKILLs the process when the given client of the given round has finished training."""

    def __init__(self, round_idx: int, client_index: int) -> None:
        self.round_idx, self.client_index = round_idx, client_index
        self.seen = 0

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.seen = 0

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        if client_ctx.round_idx == self.round_idx and self.seen == self.client_index:
            os.kill(os.getpid(), signal.SIGKILL)
        self.seen += 1


class Pauser(FedCallback):
    """After the given client of the given round: writes ``marker`` (the round's index), waits for ``marker.go``.
    Every trained client is appended to ``marker.clients`` as ``round/client``. With several processes only rank 0
    waits."""

    def __init__(self, round_idx: int, client_index: int, marker: str | None) -> None:
        self.round_idx, self.client_index, self.marker = round_idx, client_index, marker
        self.seen = 0

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.seen = 0

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        if self.marker is None:
            return
        with open(self.marker + ".clients", "a") as log:
            log.write(f"{client_ctx.round_idx}/{client_ctx.client_id}\n")
        if client_ctx.round_idx == self.round_idx and self.seen == self.client_index and trainer.global_rank == 0:
            wait_for_go(self.marker, client_ctx.round_idx)
        self.seen += 1


def wait_for_go(marker: str, round_idx: int) -> None:
    """Writes ``marker``, waits (at most a minute) until ``marker.go`` exists, then a moment for a signal sent
    before it to be handled."""
    Path(marker).write_text(str(round_idx))
    go = Path(marker + ".go")
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)


class Counter(FedCallback):
    """Stateful in both places a callback can keep state: its own state_dict and the client store."""

    def __init__(self) -> None:
        self.clients_seen = 0
        self.rounds_run_here = 0  # not checkpointed: tells whether a resume really skipped finished rounds

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.rounds_run_here += 1

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        self.clients_seen += 1
        visits = client_ctx.store.get("counter", client_ctx.client_id, {"visits": torch.zeros(())})["visits"]
        client_ctx.store.put("counter", client_ctx.client_id, {"visits": visits + 1})

    def on_round_end(self, trainer, pl_module, round_ctx, metrics):
        metrics["counter/clients_seen"] = float(self.clients_seen)

    def state_dict(self):
        return {"clients_seen": self.clients_seen}

    def load_state_dict(self, state_dict):
        self.clients_seen = state_dict["clients_seen"]


def build(spec: str) -> object:
    """Instantiates ``package.module.Class`` or ``package.module.Class={"kwarg": value}``."""
    class_path, _, kwargs = spec.partition("=")
    module_name, _, class_name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)(**(json.loads(kwargs) if kwargs else {}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--kill-round", type=int, default=-1)
    parser.add_argument("--kill-client-index", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--pause-round", type=int, default=-1)
    parser.add_argument("--pause-client-index", type=int, default=0)
    parser.add_argument("--marker", default=None)
    parser.add_argument("--callback", action="append", default=[], help="CLASS_PATH or CLASS_PATH=JSON_KWARGS")
    parser.add_argument("--aggregator", default=None, help="CLASS_PATH or CLASS_PATH=JSON_KWARGS")
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = BoringClassifier(lr=0.1, momentum=args.momentum, batch_norm=True, dropout=0.2)
    datamodule = make_datamodule(num_clients=5, val_fraction=0.1)
    counter = Counter()
    trainer = FederatedTrainer(
        num_rounds=4,
        clients_per_round=3,
        local_epochs=2,
        keep_optimizer_state=True,
        callbacks=[
            counter,
            *map(build, args.callback),
            Killer(args.kill_round, args.kill_client_index),
            Pauser(args.pause_round, args.pause_client_index, args.marker),
        ],
        aggregator=build(args.aggregator) if args.aggregator else None,
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        # The killer's and the pauser's round and client are when to crash or wait, not part of the experiment.
        resume_allow_changes=["callbacks.Killer", "callbacks.Pauser"],
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path="last" if args.resume else None)
    torch.save(
        {
            "weights": module.state_dict(),
            "history": trainer.federation_state.history,
            "store": trainer.federation_state.store.state_dict(),
            "clients_seen": counter.clients_seen,
            "rounds_run_here": counter.rounds_run_here,
            # ModelCheckpoint's state names its own directory, which differs between the runs compared.
            "callback_states": [cb.state_dict() for cb in trainer.callbacks if isinstance(cb, FedCallback)],
            "aggregator_state": trainer.aggregator.state_dict(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
