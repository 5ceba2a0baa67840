"""A deployment built from the YAML of ``lightning-fed fit`` (server and sites parse the same file) equals the fit."""

from __future__ import annotations

import torch
from helpers.flower_configs import write_config

from lightning_fed.deploy import ClientSite, LoopbackTransport, SiteTrainer, serve
from lightning_fed.deploy.config import build_from_config, site_builder


def test_sites_built_from_the_fit_yaml_reproduce_the_fit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run directories go under the working directory's runs/
    config = write_config(tmp_path, "fedprox")  # lightning_fed's own classes, as a deployment's config names them
    module, datamodule, trainer = build_from_config([config])
    trainer.fit(module, datamodule=datamodule)
    simulated = module.state_dict()

    build = site_builder(config)
    _, _, probe = build()
    assert isinstance(probe, SiteTrainer) and probe.logger is None and probe.num_rounds == 1
    assert probe.client_eval == "none" and not probe.checkpoint_callbacks
    sites = {cid: ClientSite(build, tmp_path / "site-state") for cid in range(datamodule.num_clients)}
    module, datamodule, trainer = build_from_config([config])
    serve(trainer, module, datamodule, LoopbackTransport(sites))
    for name, value in simulated.items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
