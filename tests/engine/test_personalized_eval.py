import json

import lightning.pytorch as L
import pytest
import torch
from helpers.boring import NUM_CLASSES, BoringClassifier, fast_trainer, global_weights, make_datamodule, plain_sgd_pass

from lightning_fed import FedCallback
from lightning_fed.callbacks import FedProx
from lightning_fed.callbacks.personalized import PersonalizedCallback
from lightning_fed.utilities.seeding import derive_seed

NUM_CLIENTS = 5
SEED = 2


class OneClassModels(PersonalizedCallback):
    """From round ``start`` on, client i's personalised model predicts class i mod NUM_CLASSES for every input."""

    def __init__(self, start: int = 1) -> None:
        super().__init__("one_class")
        self.start = start

    def on_round_start(self, trainer, pl_module, round_ctx):
        if round_ctx.round_idx < self.start:
            return
        for cid in range(trainer.datamodule.num_clients):
            params = {name: tensor.clone() for name, tensor in round_ctx.global_params.items()}
            params["net.3.weight"] = torch.zeros_like(params["net.3.weight"])
            params["net.3.bias"] = torch.nn.functional.one_hot(torch.tensor(cid % NUM_CLASSES), NUM_CLASSES).float()
            self.save_personal(round_ctx.store, cid, params)


class LossAdder(FedCallback):
    """A client_loss term large enough to change any training it enters."""

    def client_loss(self, trainer, pl_module, ctx, batch, batch_idx):
        return 0.5 * sum((p**2).sum() for p in pl_module.parameters())


class LocalProbe(FedCallback):
    """Calls train_locally on client 0 after every round and keeps its start point and result."""

    def __init__(self) -> None:
        self.calls = []

    def on_round_end(self, trainer, pl_module, round_ctx, metrics):
        start = {name: tensor.clone() for name, tensor in round_ctx.global_params.items()}
        result = trainer.train_locally(0, round_ctx.round_idx, start, epochs=1, purpose="probe")
        self.calls.append((round_ctx.round_idx, start, result))


def _fit(tmp_path, callbacks, num_rounds=3, clients_per_round=2):
    L.seed_everything(0)
    module = BoringClassifier(lr=0.1, momentum=0.9)
    datamodule = make_datamodule(num_clients=NUM_CLIENTS)
    trainer = fast_trainer(
        tmp_path, num_rounds=num_rounds, clients_per_round=clients_per_round, seed=SEED, callbacks=callbacks
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer, module, datamodule


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("fedavg"), [])


@pytest.fixture(scope="module")
def one_class_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("one_class"), [OneClassModels(start=1)], clients_per_round=1)


def _test_labels(datamodule, cid):
    return torch.cat([y for _, y in datamodule.client_test_dataloader(cid)])


def test_every_client_is_evaluated_with_its_personalised_parameters(one_class_run):
    trainer, _, datamodule = one_class_run
    per_client = trainer.last_round_result.client_results
    # One client trains per round, yet all are evaluated.
    assert sorted(per_client) == list(range(NUM_CLIENTS))
    for cid, metrics in per_client.items():
        labels = _test_labels(datamodule, cid)
        frequency = (labels == cid % NUM_CLASSES).double().mean().item()
        assert metrics["test_acc"] == pytest.approx(frequency, abs=1e-6), cid
    assert len({round(m["test_acc"], 6) for m in per_client.values()}) > 1


def test_personal_metrics_replace_client_metrics_in_personalised_rounds(one_class_run):
    history = one_class_run[0].federation_state.history
    assert "client/test_acc_mean" in history[0] and not any(k.startswith("personal/") for k in history[0])
    for metrics in history[1:]:
        assert {
            "personal/test_acc_mean",
            "personal/test_acc_std",
            "personal/test_acc_min",
            "personal/test_acc_worst10",
            "personal/bmta",
        } <= metrics.keys()
        assert not any(k.startswith("client/") for k in metrics)


@pytest.mark.parametrize("prefix", ["client/", "personal/"])
def test_bmta_is_the_best_mean_accuracy_over_rounds_so_far(fedavg_run, one_class_run, prefix):
    trainer = (fedavg_run if prefix == "client/" else one_class_run)[0]
    history = trainer.federation_state.history
    means = []
    for metrics in history:
        if f"{prefix}test_acc_mean" not in metrics:
            assert f"{prefix}bmta" not in metrics
            continue
        means.append(metrics[f"{prefix}test_acc_mean"])
        assert metrics[f"{prefix}bmta"] == max(means)
    assert means


def test_summary_names_the_kind_of_final_client_metrics(fedavg_run, one_class_run):
    for (trainer, _, _), kind in ((fedavg_run, "client/"), (one_class_run, "personal/")):
        summary = json.loads(trainer.summary_path.read_text())
        assert summary["final_client_metrics_kind"] == kind
        assert sorted(summary["final_client_metrics"]) == [str(cid) for cid in range(NUM_CLIENTS)]


def test_client_accuracy_plot_is_written_in_the_run_directory(one_class_run):
    trainer = one_class_run[0]
    path = trainer.fed_run_dir / "client_accuracy.png"
    assert path.is_file() and path.stat().st_size > 0


def _plain_local_training(start, datamodule, round_idx):
    tuned = BoringClassifier(lr=0.1, momentum=0.9)
    tuned.load_state_dict(start)
    loader = datamodule.client_dataloader(0, seed=derive_seed(SEED, "probe", "data", round_idx, 0))
    return plain_sgd_pass(tuned, loader)


def test_train_locally_is_plain_training_that_leaves_the_run_unchanged(tmp_path):
    algorithms = [FedProx(mu=5.0), LossAdder()]
    reference, reference_module, _ = _fit(tmp_path / "reference", algorithms)
    probe = LocalProbe()
    trainer, module, datamodule = _fit(tmp_path / "probed", [*algorithms, probe])
    for name, tensor in global_weights(reference_module).items():
        assert torch.equal(global_weights(module)[name], tensor), name

    def without_time(history):
        return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in history]

    assert without_time(trainer.federation_state.history) == without_time(reference.federation_state.history)
    assert [round_idx for round_idx, _, _ in probe.calls] == [0, 1, 2]
    for round_idx, start, result in probe.calls:
        expected = _plain_local_training(start, datamodule, round_idx)
        for name, tensor in expected.items():
            assert torch.equal(result[name], tensor), (round_idx, name)
