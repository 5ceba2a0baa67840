"""A deployment built from the YAML of ``lightning-fed fit`` (server and sites parse the same file) equals the fit."""

from __future__ import annotations

import torch

from lightning_fed.deploy import ClientSite, LoopbackTransport, SiteTrainer, serve
from lightning_fed.deploy.config import build_from_config, site_builder

CONFIG = """\
seed_everything: 0
trainer:
  num_rounds: 2
  clients_per_round: 3
  local_epochs: 1
  accelerator: cpu
  devices: 1
  logger: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  client_eval: none
  seed: 0
  callbacks:
    - class_path: lightning_fed.callbacks.FedProx
      init_args:
        mu: 0.1
model:
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
        num_partitions: 4
        alpha: 0.5
        seed: 0
    num_samples: 400
    batch_size: 32
"""


def test_sites_built_from_the_fit_yaml_reproduce_the_fit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run directories go under the working directory's runs/
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    module, datamodule, trainer = build_from_config([config])
    trainer.fit(module, datamodule=datamodule)
    simulated = module.state_dict()

    build = site_builder(config)
    _, _, probe = build()
    assert isinstance(probe, SiteTrainer) and probe.logger is None and probe.num_rounds == 1
    assert probe.client_eval == "none" and not probe.checkpoint_callbacks
    sites = {cid: ClientSite(build, tmp_path / "site-state") for cid in range(4)}
    module, datamodule, trainer = build_from_config([config])
    serve(trainer, module, datamodule, LoopbackTransport(sites))
    for name, value in simulated.items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
