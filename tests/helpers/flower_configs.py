"""Tiny deployment configurations for the Flower tests: MNIST-1D, 3 clients (one per site), 3 rounds.

The model and datamodule are lightning_fed's own classes, so that a ClientApp process can import them by class path.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: The algorithms the Flower tests deploy, as the ``trainer.callbacks`` entry of the configuration.
ALGORITHMS = {
    "fedavg": "  callbacks: []\n",
    "fedprox": ("  callbacks:\n    - class_path: lightning_fed.callbacks.FedProx\n      init_args:\n        mu: 0.1\n"),
    "scaffold": (
        "  aggregator:\n    class_path: lightning_fed.aggregators.FedAvg\n    init_args:\n      weighting: uniform\n"
        "  callbacks:\n    - class_path: lightning_fed.callbacks.Scaffold\n"
    ),
}

_CONFIG = """\
seed_everything: 0
trainer:
  num_rounds: 3
  clients_per_round: 3
  local_epochs: 1
  accelerator: cpu
  devices: 1
  logger: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  client_eval: none
  seed: 0
{callbacks}model:
  class_path: lightning_fed.models.ClassifierModule
  init_args:
    backbone:
      class_path: lightning_fed.models.MNIST1DCNN
      init_args:
        num_classes: 10
    num_classes: 10
    optimizer: sgd
    lr: 0.05
data:
  class_path: lightning_fed.datamodules.MNIST1DFederated
  init_args:
    partitioner:
      class_path: lightning_fed.datamodules.DirichletPartitioner
      init_args:
        num_partitions: 3
        alpha: 0.5
        seed: 0
    num_samples: 300
    batch_size: 32
"""


def write_config(directory: Path, algorithm: str = "fedavg") -> Path:
    """Writes the ``algorithm``'s configuration into ``directory``; returns its path."""
    path = directory / f"{algorithm}.yaml"
    path.write_text(_CONFIG.format(callbacks=ALGORITHMS[algorithm]))
    return path


def use_client_app(app: Path, component: str) -> None:
    """Points the written Flower app's ClientApp at ``component`` (``"module:attribute"``, importable by the
    SuperNodes' ClientApp processes); its ServerApp stays lightning_fed's."""
    pyproject = app / "pyproject.toml"
    ours = 'clientapp = "lightning_fed.deploy.flower:client_app"'
    text = pyproject.read_text()
    assert ours in text, "the app's pyproject.toml names lightning_fed's ClientApp differently"
    pyproject.write_text(text.replace(ours, f'clientapp = "{component}"'))


def fitted_model(config: Path, directory: Path) -> dict[str, torch.Tensor]:
    """The model ``lightning-fed fit --config config`` trains, run from ``directory`` (its run directory goes there)."""
    from lightning_fed.deploy.config import build_from_config

    directory.mkdir(parents=True, exist_ok=True)
    previous = Path.cwd()
    os.chdir(directory)
    try:
        module, datamodule, trainer = build_from_config([config], save_config_callback=None)
        trainer.fit(module, datamodule=datamodule)
    finally:
        os.chdir(previous)
    return {name: value.detach().clone() for name, value in module.state_dict().items()}
