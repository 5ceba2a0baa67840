"""A deployment over the loopback transport (server and sites in one process, every message through the wire
encoding) equals ``FederatedTrainer.fit`` of the same configuration, and no client's own state leaves its site."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, PoisonClient, fast_trainer, make_datamodule

from lightning_fed.aggregators import FedAvg, QFedAvg
from lightning_fed.callbacks import APFL, FedCurv, FedProx, Scaffold
from lightning_fed.deploy import ClientSite, LoopbackTransport, RemoteClients, SiteTrainer, serve
from lightning_fed.deploy.remote import FOLDED
from lightning_fed.deploy.site_store import SiteStateStore
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.messages import ClientTask

NUM_CLIENTS = 4

# (aggregator, callbacks) factories: every site and the server build their own objects, as from one config.
ALGORITHMS: dict[str, Callable[[], tuple[Any, list[Any]]]] = {
    "fedavg": lambda: (FedAvg(), []),
    "fedprox": lambda: (FedAvg(), [FedProx(mu=0.1)]),
    "scaffold+fedcurv": lambda: (FedAvg(weighting="uniform"), [Scaffold(), FedCurv(lam=0.1)]),
    "qfedavg": lambda: (QFedAvg(q=1.0, lipschitz=10.0), []),
    "apfl": lambda: (FedAvg(), [APFL(alpha=0.25)]),
}


def _settings(algorithm: str, client_eval: str = "none") -> dict[str, Any]:
    aggregator, callbacks = ALGORITHMS[algorithm]()
    return dict(
        num_rounds=3,
        clients_per_round=3,
        aggregator=aggregator,
        callbacks=callbacks,
        client_eval=client_eval,
        eval_every_n_rounds=0,
        seed=0,
    )


def _module() -> BoringClassifier:
    torch.manual_seed(0)
    return BoringClassifier(lr=0.1, batch_norm=True)


def _simulated(tmp_path: Any, algorithm: str) -> dict[str, torch.Tensor]:
    module = _module()
    fast_trainer(tmp_path / "sim", **_settings(algorithm)).fit(module, datamodule=make_datamodule(NUM_CLIENTS))
    return module.state_dict()


def _sites(tmp_path: Any, algorithm: str) -> dict[int, ClientSite]:
    def build() -> tuple[Any, Any, SiteTrainer]:
        settings = _settings(algorithm)
        trainer = SiteTrainer(default_root_dir=str(tmp_path / "site"), accelerator="cpu", devices=1, **settings)
        return BoringClassifier(lr=0.1, batch_norm=True), make_datamodule(NUM_CLIENTS), trainer

    return {cid: ClientSite(build, tmp_path / "site-state") for cid in range(NUM_CLIENTS)}


def _deployed(tmp_path: Any, algorithm: str, transport: Any = None) -> dict[str, torch.Tensor]:
    module = _module()
    trainer = fast_trainer(tmp_path / "server", **_settings(algorithm))
    transport = transport or LoopbackTransport(_sites(tmp_path, algorithm))
    serve(trainer, module, make_datamodule(NUM_CLIENTS), transport)
    return module.state_dict()


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_loopback_deployment_equals_the_simulated_fit(tmp_path, algorithm):
    simulated = _simulated(tmp_path, algorithm)
    deployed = _deployed(tmp_path, algorithm)
    assert deployed.keys() == simulated.keys()
    for name, value in simulated.items():
        torch.testing.assert_close(deployed[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # The model trained: a deployment that never reached the sites would still hold the initial weights.
    assert not torch.equal(deployed["net.0.weight"], _module().state_dict()["net.0.weight"])


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "apfl"])
def test_sums_that_reach_the_server_only_as_their_total_give_the_simulated_fit(tmp_path, algorithm):
    """The data path of secure aggregation without its rounding: each site's sums travel apart and the server folds
    their total in once, in the structure it declared."""
    transport = _RecordingTransport(_sites(tmp_path, algorithm), secure_range=8.0)
    deployed = _deployed(tmp_path, algorithm, transport)
    simulated = _simulated(tmp_path, algorithm)
    for name, value in simulated.items():
        torch.testing.assert_close(deployed[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # What the server saw of each reply: no sum, only the integer buffers the round copies from its last client.
    for reply in transport.replies:
        assert reply.secure_sums == [] and set(reply.round_state["aggregator"]) == {"_last_integer_entries"}


@pytest.mark.parametrize(
    ("algorithm", "reason"),
    [
        ("qfedavg", r"QFedAvg \(aggregator\) cannot run under secure aggregation: its server reads each client's"),
        ("scaffold+fedcurv", r"FedCurv \(callback-1-FedCurv\) cannot run under secure aggregation: its sums span"),
    ],
)
def test_an_algorithm_secure_aggregation_cannot_carry_is_refused_before_any_site_is_reached(
    tmp_path, algorithm, reason
):
    trainer = fast_trainer(tmp_path / "server", **_settings(algorithm))
    transport = _RecordingTransport(_sites(tmp_path, algorithm), secure_range=8.0)
    with pytest.raises(ValueError, match=reason):
        serve(trainer, _module(), make_datamodule(NUM_CLIENTS), transport)
    assert transport.tasks == []


class _RecordingTransport(LoopbackTransport):
    """The loopback, keeping every task and reply it carried."""

    def __init__(self, sites: dict[int, ClientSite], secure_range: float | None = None) -> None:
        super().__init__(sites, secure_range)
        self.tasks: list[ClientTask] = []
        self.replies: list[Any] = []

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        self.tasks += tasks
        received = super().exchange(tasks)
        self.replies += list(received.replies.values())
        return received


def test_no_client_store_namespace_leaves_a_site(tmp_path):
    transport = _RecordingTransport(_sites(tmp_path, "scaffold+fedcurv"))
    _deployed(tmp_path, "scaffold+fedcurv", transport)
    per_client = {"scaffold", "fedcurv"}

    def keys(value: Any) -> set[str]:
        if isinstance(value, dict):
            return {str(k) for k in value} | {k for item in value.values() for k in keys(item)}
        if isinstance(value, (list, tuple)):
            return {k for item in value for k in keys(item)}
        return set()

    assert transport.replies, "no site replied"
    for reply in transport.replies:
        assert not keys(reply.round_state) & per_client
    # ... and the sites do keep them: every trained client has a SCAFFOLD control and FedCurv statistics on disk.
    trained = {task.client_id for task in transport.tasks}
    for client_id in trained:
        stored = SiteStateStore(tmp_path / "site-state", client_id)
        state = stored.load(committed_round=10)
        assert set(state) == per_client, client_id


def test_the_server_holds_no_client_state(tmp_path):
    module = _module()
    trainer = fast_trainer(tmp_path / "server", **_settings("scaffold+fedcurv"))
    serve(trainer, module, make_datamodule(NUM_CLIENTS), LoopbackTransport(_sites(tmp_path, "scaffold+fedcurv")))
    store = trainer.federation_state.store
    # Only which round of each client's replies it folded last: no algorithm's per-client state.
    assert store.namespaces() == [FOLDED]
    assert all(isinstance(round_idx, int) for _, round_idx in store.items(FOLDED))
    assert isinstance(trainer.fed_runner.clients, RemoteClients)


def test_a_site_that_never_answers_is_dropped_like_a_rejected_client(tmp_path):
    silent = 2
    module = _module()
    settings = _settings("fedprox")
    settings["callbacks"].append(PoisonClient(silent))
    reference = fast_trainer(tmp_path / "sim", **settings)
    reference.fit(module, datamodule=make_datamodule(NUM_CLIENTS))
    simulated = module.state_dict()

    sites = _sites(tmp_path, "fedprox")
    del sites[silent]
    module = _module()
    trainer = fast_trainer(tmp_path / "server", **_settings("fedprox"))
    # The end of the run tells a site that never answered from a client that diverged.
    with pytest.warns(UserWarning, match=r"never arrived from their sites .* `round-timeout`") as warned:
        serve(trainer, module, make_datamodule(NUM_CLIENTS), LoopbackTransport(sites))
    assert not any("not finite" in str(warning.message) for warning in warned)
    for name, value in simulated.items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    history = trainer.federation_state.history
    sampled_silent = [silent in round_ids for round_ids in _sampled_rounds(reference)]
    assert any(sampled_silent), "the silent client was never sampled: the test would prove nothing"
    assert [m["clients/dropped"] for m in history] == [float(s) for s in sampled_silent]
    assert [m["clients/rejected"] for m in history] == [
        m["clients/rejected"] for m in reference.federation_state.history
    ]
    assert all("clients/dropped" not in m for m in reference.federation_state.history)


def _sampled_rounds(trainer: Any) -> list[list[int]]:
    return [trainer.sampler.sample(r, NUM_CLIENTS) for r in range(trainer.num_rounds)]


@pytest.mark.parametrize(("algorithm", "client_eval"), [("fedavg", "all"), ("apfl", "sampled")])
def test_clients_are_evaluated_at_their_sites_as_in_simulation(tmp_path, algorithm, client_eval):
    module = _module()
    reference = fast_trainer(tmp_path / "sim", **_settings(algorithm, client_eval))
    reference.fit(module, datamodule=make_datamodule(NUM_CLIENTS))

    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(default_root_dir=str(tmp_path / "site"), **_settings(algorithm, client_eval))
        return BoringClassifier(lr=0.1, batch_norm=True), make_datamodule(NUM_CLIENTS), trainer

    sites = {cid: ClientSite(build, tmp_path / "site-state") for cid in range(NUM_CLIENTS)}
    module = _module()
    trainer = fast_trainer(tmp_path / "server", **_settings(algorithm, client_eval))
    serve(trainer, module, make_datamodule(NUM_CLIENTS), LoopbackTransport(sites))
    prefix = "personal/" if algorithm == "apfl" else "client/"
    expected = [{k: v for k, v in m.items() if k.startswith(prefix)} for m in reference.federation_state.history]
    got = [{k: v for k, v in m.items() if k.startswith(prefix)} for m in trainer.federation_state.history]
    assert all(expected), f"simulation logged no {prefix}* metrics: the comparison would be empty"
    assert [sorted(m) for m in got] == [sorted(m) for m in expected]
    for round_got, round_expected in zip(got, expected):
        for key, value in round_expected.items():
            assert round_got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_a_site_built_from_another_configuration_refuses_the_task_naming_the_difference(tmp_path):
    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(default_root_dir=str(tmp_path / "site"), **_settings("fedprox"))
        return BoringClassifier(lr=0.05, batch_norm=True), make_datamodule(NUM_CLIENTS), trainer

    sites = {cid: ClientSite(build, tmp_path / "site-state") for cid in range(NUM_CLIENTS)}
    trainer = fast_trainer(tmp_path / "server", **_settings("fedprox"))
    with pytest.raises(ValueError, match=r"(?s)another configuration.*model\.lr: 0\.1 -> 0\.05"):
        serve(trainer, _module(), make_datamodule(NUM_CLIENTS), LoopbackTransport(sites))
    # Nothing of the refused round reached a site's disk.
    assert not (tmp_path / "site-state").exists()


@pytest.mark.parametrize(("callback", "kwargs"), [("FedAMP", {}), ("RFedAvg", {"lam": 0.1})])
def test_an_algorithm_whose_server_reads_the_client_store_is_refused_before_any_site_is_reached(
    tmp_path, callback, kwargs
):
    import lightning_fed.callbacks as callbacks

    contacted: list[int] = []

    class _Counting(LoopbackTransport):
        def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
            contacted.extend(task.client_id for task in tasks)
            return super().exchange(tasks)

    settings = _settings("fedavg")
    settings["callbacks"] = [getattr(callbacks, callback)(**kwargs)]
    trainer = fast_trainer(tmp_path / "server", **settings)
    with pytest.raises(ValueError, match=rf"{callback} \(callback-0-{callback}\) cannot be deployed: its server reads"):
        serve(trainer, _module(), make_datamodule(NUM_CLIENTS), _Counting({}))
    assert contacted == []
    assert not (tmp_path / "server").exists()


def test_the_server_progress_bar_counts_the_clients_the_sites_trained(tmp_path, capsys):
    module = _module()
    trainer = fast_trainer(tmp_path / "server", enable_progress_bar=True, **_settings("fedavg"))
    serve(trainer, module, make_datamodule(NUM_CLIENTS), LoopbackTransport(_sites(tmp_path, "fedavg")))
    shown = capsys.readouterr().out
    assert "clients=3/3" in shown and "clients=0/3" not in shown.rsplit("\r", 1)[-1]
