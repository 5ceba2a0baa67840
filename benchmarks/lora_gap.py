"""How far FedIT's per-matrix average of LoRA factors lands from the average of the products, on a real run.

Usage (from the repository root)::

    python benchmarks/lora_gap.py                       # 8 clients, 4 per round, 6 rounds, each mode (about a minute)
    python benchmarks/lora_gap.py --rounds 10 --modes fedit --rank 8

A small MLP over MNIST-1D (generated offline; 40 inputs, 10 classes) with a frozen base, LoRA adapters (rank
``--rank``, α = 2r) on its two hidden layers and a trainable head, is fitted on a Dirichlet(α = 0.3) split with
:class:`lightning_fed.aggregators.LoRAFedAvg` in each mode of ``--modes``. The base and the head are first trained
centrally on ``--pretrain-samples`` MNIST-1D examples of another seed (a stand-in for pretraining; 0 keeps the base
random). Per round it prints:

* ``gap``: ``lora/aggregation_gap`` (mean over the two layers) and its max, ‖mean_k B_k A_k − mean(B) mean(A)‖_F /
  ‖mean_k B_k A_k‖_F: how far the per-matrix average (``fedit``, the anchors' aggregation) is from the average of
  the clients' products. Measured in the modes that gather the factors (``fedit``, ``exact``);
* ``refactor``: ``lora/refactorisation_error`` (``exact`` only), the relative error of the rank-r truncated SVD of
  the average product;
* the global test accuracy after the round.

``ffa`` freezes A in the module (FFA-LoRA), where the per-matrix average is exact. The adapter is the same in every
mode at round 0; later rounds differ, since each mode trains from its own aggregate.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_fed import FedCallback, FederatedTrainer
from lightning_fed.aggregators import LoRAFedAvg
from lightning_fed.aggregators.lora import GAP_KEY, GAP_MAX_KEY, REFACTORISATION_ERROR_KEY
from lightning_fed.datamodules import DirichletPartitioner, MNIST1DFederated

INPUTS, CLASSES = 40, 10


class LoRALinear(nn.Module):
    """A frozen linear layer plus ``(alpha / r) B A``, factors named as PEFT names them (``lora_A.default.weight``)."""

    def __init__(self, in_features: int, out_features: int, rank: int, train_a: bool = True) -> None:
        super().__init__()
        self.base = nn.Linear(in_features, out_features).requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, out_features, bias=False)})
        nn.init.kaiming_uniform_(self.lora_A["default"].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B["default"].weight)
        self.lora_A["default"].weight.requires_grad_(train_a)
        self.scaling = 2.0  # alpha = 2 r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * self.lora_B["default"](self.lora_A["default"](x))


class LoRAMLP(L.LightningModule):
    def __init__(self, rank: int, hidden: int = 128, lr: float = 0.05, train_a: bool = True) -> None:
        super().__init__()
        self.layer1 = LoRALinear(INPUTS, hidden, rank, train_a)
        self.layer2 = LoRALinear(hidden, hidden, rank, train_a)
        self.head = nn.Linear(hidden, CLASSES)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.head(torch.relu(self.layer2(torch.relu(self.layer1(x)))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def pretrain_base(module: LoRAMLP, num_samples: int, epochs: int, seed: int) -> float:
    """Trains the base layers and the head, without adapters, on MNIST-1D examples of another seed (a stand-in for
    pretraining: the federated run fine-tunes the adapters and the head from there); returns its train accuracy."""
    from mnist1d.data import get_dataset_args, make_dataset

    data_args = get_dataset_args()
    data_args.num_samples, data_args.seed = num_samples, seed + 1000
    data = make_dataset(data_args)
    x, y = torch.as_tensor(data["x"], dtype=torch.float32), torch.as_tensor(data["y"], dtype=torch.int64)
    layers = [module.layer1.base, module.layer2.base, module.head]
    weights = [p for layer in layers for p in layer.parameters()]
    for p in weights:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(weights, lr=1e-3)
    generator = torch.Generator().manual_seed(seed)

    def base_forward(inputs: torch.Tensor) -> torch.Tensor:
        return module.head(torch.relu(module.layer2.base(torch.relu(module.layer1.base(inputs)))))

    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            F.cross_entropy(base_forward(x[batch]), y[batch]).backward()
            optimizer.step()
    for layer in layers[:2]:
        layer.requires_grad_(False)
    with torch.no_grad():
        return float((base_forward(x).argmax(1) == y).float().mean())


class RoundLog(FedCallback):
    """Keeps each round's metrics."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, float]] = []

    def on_round_end(self, trainer: Any, pl_module: Any, round_ctx: Any, metrics: dict[str, float]) -> None:
        self.rounds.append(dict(metrics))


def run(mode: str, args: argparse.Namespace) -> list[dict[str, float]]:
    torch.manual_seed(args.seed)
    module = LoRAMLP(args.rank, lr=args.lr, train_a=mode != "ffa")
    if args.pretrain_samples:
        pretrain_base(module, args.pretrain_samples, args.pretrain_epochs, args.seed)
    datamodule = MNIST1DFederated(
        DirichletPartitioner(args.clients, alpha=args.alpha, seed=args.seed),
        num_samples=4000,
        batch_size=32,
        seed=args.seed,
    )
    log = RoundLog()
    with tempfile.TemporaryDirectory() as root:
        trainer = FederatedTrainer(
            num_rounds=args.rounds,
            clients_per_round=args.per_round,
            local_epochs=args.local_epochs,
            aggregator=LoRAFedAvg(mode=mode),  # type: ignore[arg-type]
            callbacks=[log],
            default_root_dir=root,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            accelerator="cpu",
            devices=1,
            seed=args.seed,
            client_eval="none",
        )
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.fit(module, datamodule=datamodule)
    return log.rounds


def _fmt(value: float | None, spec: str = ".2e") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["fedit", "exact", "ffa"], choices=["fedit", "ffa", "exact"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--alpha", type=float, default=0.3, help="the Dirichlet split's concentration")
    parser.add_argument("--pretrain-samples", type=int, default=1000, help="0: a random base")
    parser.add_argument("--pretrain-epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(
        f"MNIST-1D, Dirichlet({args.alpha}) over {args.clients} clients, {args.per_round} per round,"
        f" {args.local_epochs} local epochs, SGD {args.lr}; LoRA rank {args.rank} on two 128-wide layers over a"
        f" frozen base pretrained on {args.pretrain_samples} examples, trainable head; torch {torch.__version__},"
        f" {torch.get_num_threads()} threads"
    )
    print("| mode | round | gap (mean) | gap (max) | refactor error | global test acc |")
    print("|---|---|---|---|---|---|")
    for mode in args.modes:
        start = time.perf_counter()
        for metrics in run(mode, args):
            print(
                f"| {mode} | {int(metrics['round'])} | {_fmt(metrics.get(GAP_KEY))} | {_fmt(metrics.get(GAP_MAX_KEY))}"
                f" | {_fmt(metrics.get(REFACTORISATION_ERROR_KEY))} | {_fmt(metrics.get('global/test_acc'), '.3f')} |"
            )
        print(f"<!-- {mode}: {time.perf_counter() - start:.1f} s -->")


if __name__ == "__main__":
    main()
