"""LoRAFedAvg deployed over the loopback transport (every message through the wire encoding) equals the simulated
fit: the gathered factors of ``"exact"`` travel as merged round state, and ``"ffa"``'s sums travel apart and reach
the server as their total, as under secure aggregation; ``"exact"`` is refused under it in one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.boring import fast_trainer, make_datamodule
from helpers.lora import LoRAClassifier

from lightning_fed.aggregators import LoRAFedAvg
from lightning_fed.deploy import ClientSite, LoopbackTransport, SiteTrainer, serve

NUM_CLIENTS = 4


def _settings(mode: str) -> dict[str, Any]:
    return dict(
        num_rounds=2,
        clients_per_round=3,
        aggregator=LoRAFedAvg(mode=mode),  # type: ignore[arg-type]
        client_eval="none",
        eval_every_n_rounds=0,
        seed=0,
    )


def _module(mode: str) -> LoRAClassifier:
    torch.manual_seed(0)
    return LoRAClassifier(train_a=mode != "ffa")


def _sites(tmp_path: Any, mode: str) -> dict[int, ClientSite]:
    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(default_root_dir=str(tmp_path / "site"), accelerator="cpu", devices=1, **_settings(mode))
        return _module(mode), make_datamodule(NUM_CLIENTS), trainer

    return {cid: ClientSite(build, tmp_path / "site-state") for cid in range(NUM_CLIENTS)}


@pytest.mark.parametrize(("mode", "secure_range"), [("exact", None), ("fedit", None), ("ffa", 8.0)])
def test_a_loopback_deployment_equals_the_simulated_fit(tmp_path, mode, secure_range):
    simulated = _module(mode)
    fast_trainer(tmp_path / "sim", **_settings(mode)).fit(simulated, datamodule=make_datamodule(NUM_CLIENTS))
    deployed = _module(mode)
    trainer = fast_trainer(tmp_path / "server", **_settings(mode))
    serve(trainer, deployed, make_datamodule(NUM_CLIENTS), LoopbackTransport(_sites(tmp_path, mode), secure_range))
    for name, value in simulated.state_dict().items():
        torch.testing.assert_close(deployed.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert deployed.layer1.factor_b.abs().sum() > 0


def test_exact_mode_is_refused_under_secure_aggregation(tmp_path):
    trainer = fast_trainer(tmp_path / "server", **_settings("exact"))
    transport = LoopbackTransport(_sites(tmp_path, "exact"), secure_range=8.0)
    with pytest.raises(ValueError, match=r"LoRAFedAvg \(aggregator\) cannot run under secure aggregation"):
        serve(trainer, _module("exact"), make_datamodule(NUM_CLIENTS), transport)
