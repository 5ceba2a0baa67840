"""A deployment of a model with a frozen base: the wire carries the federated part only, each way, and a site whose
base differs from the server's refuses the task in one line naming its first tensor that differs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.boring import BigTrunkClassifier, fast_trainer, make_datamodule

from lightning_fed.aggregators import FedAvg
from lightning_fed.callbacks import Scaffold
from lightning_fed.deploy import ClientSite, LoopbackTransport, SiteTrainer, serve
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.functional.state_dict import state_nbytes
from lightning_fed.messages import ClientTask

NUM_CLIENTS = 3
FROZEN = set(BigTrunkClassifier.FROZEN)


def _settings(scaffold: bool = True) -> dict[str, Any]:
    return dict(
        num_rounds=2,
        clients_per_round=NUM_CLIENTS,
        aggregator=FedAvg(weighting="uniform"),
        callbacks=[Scaffold()] if scaffold else [],
        client_eval="all",
        seed=0,
    )


def _module(base_seed: int = 0) -> BigTrunkClassifier:
    torch.manual_seed(base_seed)
    return BigTrunkClassifier()


class _Recording(LoopbackTransport):
    def __init__(self, sites: dict[int, ClientSite], secure_range: float | None = None) -> None:
        super().__init__(sites, secure_range)
        self.tasks: list[ClientTask] = []
        self.replies: list[Any] = []
        self.secure_sums: list[list[torch.Tensor]] = []

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        self.tasks += tasks
        received = super().exchange(tasks)
        self.replies += list(received.replies.values())
        if received.secure_sum is not None:
            self.secure_sums.append(received.secure_sum)
        return received


def _sites(tmp_path, base_seed: int = 0, scaffold: bool = True) -> dict[int, ClientSite]:
    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(
            default_root_dir=str(tmp_path / "site"), accelerator="cpu", devices=1, **_settings(scaffold)
        )
        return _module(base_seed), make_datamodule(NUM_CLIENTS), trainer

    return {cid: ClientSite(build, tmp_path / "site-state") for cid in range(NUM_CLIENTS)}


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return {str(k) for k in value} | {k for item in value.values() for k in _keys(item)}
    if isinstance(value, (list, tuple)):
        return {k for item in value for k in _keys(item)}
    return set()


@pytest.mark.parametrize("secure_range", [None, 64.0], ids=["plain", "secure-sums"])
def test_the_wire_carries_the_federated_part_only_and_the_fit_equals_simulation(tmp_path, secure_range):
    simulated = _module()
    fast_trainer(tmp_path / "sim", **_settings()).fit(simulated, datamodule=make_datamodule(NUM_CLIENTS))
    transport = _Recording(_sites(tmp_path), secure_range)
    module = _module()
    serve(fast_trainer(tmp_path / "server", **_settings()), module, make_datamodule(NUM_CLIENTS), transport)
    for name, value in simulated.state_dict().items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert transport.tasks and transport.replies
    for task in transport.tasks:
        assert not _keys(task.global_params) & FROZEN and not _keys(task.broadcast) & FROZEN
        assert set(task.base["tensors"]) == FROZEN  # hashes, not tensors
    for reply in transport.replies:
        assert not _keys(reply.round_state) & FROZEN
    state = module.state_dict()
    frozen = state_nbytes({k: state[k] for k in FROZEN})
    federated = state_nbytes({k: v for k, v in state.items() if k not in FROZEN})
    # Down: the global model's federated part and SCAFFOLD's control of the same size; up: the sums of both; a few
    # KB of settings, fingerprints and metrics besides. The frozen base (5 MB) travels never.
    per_message = (transport.bytes_sent + transport.bytes_received) / (2 * len(transport.tasks))
    assert per_message <= 2.2 * federated + 32 * 2**10 < frozen / 10, (per_message, federated, frozen)
    if secure_range is not None:
        # SecAgg+'s masked vectors: the aggregator's float64 sums and SCAFFOLD's, of the federated part only.
        federated_values = sum(v.numel() for k, v in state.items() if k not in FROZEN)
        assert len(transport.secure_sums) == 2
        for total in transport.secure_sums:
            assert 0 < sum(leaf.numel() for leaf in total) <= 2 * federated_values + 8


def test_fedavg_sends_the_federated_part_once_each_way_and_folds_what_the_sites_held(tmp_path):
    simulated = _module()
    fast_trainer(tmp_path / "sim", **_settings(scaffold=False)).fit(simulated, datamodule=make_datamodule(NUM_CLIENTS))
    transport = _Recording(_sites(tmp_path, scaffold=False))
    module = _module()
    trainer = fast_trainer(tmp_path / "server", **_settings(scaffold=False))
    serve(trainer, module, make_datamodule(NUM_CLIENTS), transport)
    # A site's float64 share of the sum travels as the client's float32 entries and its weight, rebuilt to the bit:
    # the deployed fit is the simulated one.
    for name, value in simulated.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name
    state = module.state_dict()
    federated = state_nbytes({k: v for k, v in state.items() if k not in FROZEN})
    # Each way, per client: the federated part once (float32) and about 3 KB of settings, fingerprints and metrics
    # (the float64 share as it is held would be twice the federated part). Every evaluation reply is counted too.
    trained = sum(not task.evaluate for task in transport.tasks)
    assert transport.bytes_sent / len(transport.tasks) <= 1.1 * federated + 4 * 2**10
    assert transport.bytes_received / trained <= 1.1 * federated + 4 * 2**10, (transport.bytes_received, federated)


def test_a_site_with_another_base_refuses_the_task_naming_its_first_differing_tensor(tmp_path):
    transport = LoopbackTransport(_sites(tmp_path, base_seed=1))
    with pytest.raises(ValueError) as refused:
        serve(fast_trainer(tmp_path / "server", **_settings()), _module(), make_datamodule(NUM_CLIENTS), transport)
    message = str(refused.value)
    assert "This site's frozen base differs" in message and "'net.trunk.0.weight' differs" in message, message
    assert "\n" not in message
    assert not (tmp_path / "site-state").exists()
