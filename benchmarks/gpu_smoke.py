"""GPU smoke run of the federated loop: a few rounds of each algorithm family under mixed precision.

Needs a CUDA device; nothing else in the project depends on one. For each algorithm and precision it trains a few
rounds of a small CNN on random image-shaped data (so no dataset is needed), checks that the global model and every
logged metric are finite and that the model stayed on the GPU, and prints the seconds per round.

    python benchmarks/gpu_smoke.py                       # bf16-mixed and 16-mixed, every algorithm family
    python benchmarks/gpu_smoke.py --precision bf16-mixed --rounds 3

Each timed fit records the 1-minute load average before and after it (``benchmarks/load.py``): a time taken at a
load above the CPU count is marked ``*`` (unreliable: the host process that drives the GPU waited for a core), and
the load line ends the output.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import LoadRecord, LoadRecorder, add_wait_quiet_argument, footnote, mark
from lightning_fed import FederatedTrainer
from lightning_fed.aggregators import FedAvg, QFedAvg
from lightning_fed.callbacks import APFL, FedAMP, FedCurv, FedProx, FineTune, Scaffold, Separate
from lightning_fed.datamodules import DatasetFederated, DirichletPartitioner, TensorClassificationDataset
from lightning_fed.models import ClassifierModule, LeNet5

ALGORITHMS = {
    "fedavg": lambda: ([], FedAvg()),
    "fedprox": lambda: ([FedProx(mu=0.01)], FedAvg()),
    "scaffold": lambda: ([Scaffold()], FedAvg(weighting="uniform")),
    "qfedavg": lambda: ([], QFedAvg(q=1.0)),
    "fedcurv": lambda: ([FedCurv(lam=1.0)], FedAvg()),
    "fedamp": lambda: ([FedAMP(alpha_k=0.01, lam=0.01, sigma=1.0)], FedAvg()),
    "apfl": lambda: ([APFL()], FedAvg()),
    "separate": lambda: ([Separate()], FedAvg()),
    "fedavg_ft": lambda: ([FineTune(epochs=1)], FedAvg()),
}
# Algorithms that count or edit optimizer steps refuse fp16 loss scaling (it skips steps) with a clear error.
SKIPS_STEPS = {"scaffold", "apfl"}


class DeviceProbe(Callback):
    """Records where the parameters live at the end of each round (Lightning moves the model to the CPU after fit)."""

    def __init__(self) -> None:
        self.devices: set[str] = set()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.devices |= {p.device.type for p in pl_module.parameters()}


def make_data(num_clients: int, seed: int = 0) -> DatasetFederated:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(4000, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (4000,), generator=generator)
    images[torch.arange(4000), 0, labels, labels] += 4.0  # a learnable signal: a bright pixel per class
    train = TensorClassificationDataset(images[:3000], labels[:3000])
    test = TensorClassificationDataset(images[3000:], labels[3000:])
    partitioner = DirichletPartitioner(num_partitions=num_clients, alpha=0.5, seed=seed)
    return DatasetFederated(train, test, 10, partitioner, batch_size=32, client_test_fraction=0.2)


def smoke(
    name: str, precision: str, rounds: int, root: str, wait_quiet_s: float = 0.0
) -> tuple[float, float, LoadRecord]:
    callbacks, aggregator = ALGORITHMS[name]()
    probe = DeviceProbe()
    trainer = FederatedTrainer(
        num_rounds=rounds,
        clients_per_round=5,
        aggregator=aggregator,
        callbacks=[*callbacks, probe],
        accelerator="gpu",
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        seed=0,
    )
    module = ClassifierModule(backbone=LeNet5(in_channels=1, num_classes=10), num_classes=10, optimizer="sgd", lr=0.05)
    data = make_data(10)
    with LoadRecorder(1, wait_quiet_s) as load:  # one host process drives the GPU
        start = time.perf_counter()
        trainer.fit(module, datamodule=data)
        seconds = (time.perf_counter() - start) / rounds
    assert probe.devices == {"cuda"}, f"{name}: parameters were on {probe.devices} during training"
    assert all(torch.isfinite(p).all() for p in module.parameters()), f"{name}: non-finite global model"
    final = trainer.federation_state.history[-1]
    bad = [key for key, value in final.items() if not math.isfinite(value)]
    assert not bad, f"{name}: non-finite metrics {bad}"
    accuracy = next((v for k, v in final.items() if k.endswith("test_acc_mean")), float("nan"))
    return seconds, accuracy, load.record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", nargs="+", default=["bf16-mixed", "16-mixed"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    add_wait_quiet_argument(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("No CUDA device: this smoke run is for GPU machines only.")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    loads: list[LoadRecord] = []
    with tempfile.TemporaryDirectory() as root:
        for precision in args.precision:
            for name in args.algorithms:
                if precision == "16-mixed" and name in SKIPS_STEPS:
                    try:
                        smoke(name, precision, 1, root)
                    except ValueError as error:
                        print(f"{precision:10s} {name:10s} refused as documented: {str(error)[:90]}")
                        continue
                    raise SystemExit(f"{name} should refuse 16-mixed")
                seconds, accuracy, load = smoke(name, precision, args.rounds, root, args.wait_quiet)
                loads.append(load)
                print(f"{precision:10s} {name:10s} {seconds:6.2f}{mark(load)} s/round  mean client acc {accuracy:.3f}")
    print(footnote(loads))


if __name__ == "__main__":
    main()
