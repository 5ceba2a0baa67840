"""Server optimizers inside federated runs: Algorithm 2's steps, BatchNorm buffers, diverging clients, resume."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule

from lightning_fed import FedCallback
from lightning_fed.aggregators import FedAdam, FedAvg, FedAvgM, FedYogi


class _Recorder(FedCallback):
    """Keeps each round's global model, accepted client models with their sizes, and the aggregate."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.rounds.append({"clients": [], "parameter_names": round_ctx.parameter_names})

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        self.rounds[-1]["clients"].append((update.num_samples, {n: t.clone() for n, t in update.params.items()}))

    def on_aggregate(self, trainer, pl_module, round_ctx, new_params):
        self.rounds[-1]["global"] = {n: t.clone() for n, t in round_ctx.global_params.items()}
        self.rounds[-1]["new"] = {n: t.clone() for n, t in new_params.items()}


def test_fedadam_in_a_federated_run_takes_algorithm_2_steps(tmp_path):
    recorder = _Recorder()
    aggregator = FedAdam(server_lr=0.05)
    trainer = fast_trainer(tmp_path, num_rounds=3, clients_per_round=3, aggregator=aggregator, callbacks=[recorder])
    module = BoringClassifier(batch_norm=True)
    trainer.fit(module, datamodule=make_datamodule(num_clients=4))
    # The runner names the parameters; BatchNorm's running statistics are buffers and take the plain mean below.
    assert recorder.rounds[0]["parameter_names"] == {name for name, _ in module.named_parameters()}
    m: dict[str, torch.Tensor] = {}
    v: dict[str, torch.Tensor] = {}
    for entry in recorder.rounds:
        total = sum(n for n, _ in entry["clients"])
        for name, old in entry["global"].items():
            if not old.is_floating_point():
                continue
            mean = sum(n / total * state[name].double() for n, state in entry["clients"])
            if name not in entry["parameter_names"]:
                torch.testing.assert_close(entry["new"][name], mean.float(), msg=name)
                continue
            delta = mean - old.double()
            m[name] = 0.9 * m.get(name, torch.zeros_like(delta)) + 0.1 * delta
            v[name] = 0.99 * v.get(name, torch.full_like(delta, 1e-6)) + 0.01 * delta**2
            expected = old.double() + 0.05 * m[name] / (v[name].sqrt() + 1e-3)
            torch.testing.assert_close(entry["new"][name], expected.float(), rtol=0, atol=1e-6, msg=name)
    assert aggregator.num_steps == 3


class _Poison(FedCallback):
    def on_client_start(self, trainer, pl_module, client_ctx):
        pl_module.poison = client_ctx.client_id == 1


@pytest.mark.filterwarnings("ignore:.*were rejected")
@pytest.mark.parametrize("aggregator", [FedAdam(server_lr=0.05), FedYogi(server_lr=0.05), FedAvgM()], ids=repr)
def test_a_diverging_client_never_reaches_the_server_state(tmp_path, aggregator):
    trainer = fast_trainer(tmp_path, num_rounds=3, clients_per_round=3, aggregator=aggregator, callbacks=[_Poison()])
    module = BoringClassifier()
    trainer.fit(module, datamodule=make_datamodule(num_clients=3))
    assert trainer.federation_state.rejected_total == 3
    assert all(torch.isfinite(t).all() for t in global_weights(module).values())
    state = aggregator.state_dict()
    assert state["num_steps"] == 3
    assert all(torch.isfinite(t).all() for kind in aggregator.buffer_names for t in state[kind].values())


def _small_inputs_datamodule():
    """Inputs scaled by 0.01: BatchNorm's running variance falls from 1 far below 0.5 within a client's training."""
    from helpers.boring import NUM_CLASSES, make_tensors

    from lightning_fed.datamodules import DatasetFederated, IidPartitioner
    from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset

    x, y = make_tensors(400, seed=0)
    x_test, y_test = make_tensors(200, seed=1)
    train = TensorClassificationDataset(x * 0.01, y)
    test = TensorClassificationDataset(x_test * 0.01, y_test)
    return DatasetFederated(train, test, NUM_CLASSES, IidPartitioner(num_partitions=3, seed=0), batch_size=8)


class _Extrapolation(FedCallback):
    """Records, per round, the smallest running variance that FedAvg's old step on every float entry would give."""

    def __init__(self, server_lr: float) -> None:
        self.server_lr = server_lr
        self.extrapolated_min: list[float] = []

    def on_aggregate(self, trainer, pl_module, round_ctx, new_params):
        old, new = round_ctx.global_params["net.1.running_var"], new_params["net.1.running_var"]
        self.extrapolated_min.append(float((old + self.server_lr * (new - old)).min()))


@pytest.mark.parametrize("aggregator", [FedAvg(server_lr=2.0), FedAdam(server_lr=1.0)], ids=repr)
def test_batchnorm_variance_stays_positive_under_a_large_server_step(tmp_path, aggregator):
    extrapolation = _Extrapolation(server_lr=2.0)
    trainer = fast_trainer(
        tmp_path, num_rounds=2, clients_per_round=3, aggregator=aggregator, callbacks=[extrapolation]
    )
    module = BoringClassifier(batch_norm=True)
    datamodule = _small_inputs_datamodule()
    trainer.fit(module, datamodule=datamodule)
    # Stepping the buffers by 2x their change would have made the variance negative in round 0.
    assert extrapolation.extrapolated_min[0] < 0
    assert (module.net[1].running_var > 0).all()
    module.eval()
    x, _ = next(iter(datamodule.test_dataloader()))
    with torch.no_grad():
        assert torch.isfinite(module(x)).all()
    assert not math.isnan(trainer.federation_state.history[-1]["global/test_loss"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [
        'lightning_fed.aggregators.FedAvgM={"server_lr": 0.5, "momentum": 0.9, "nesterov": true}',
        'lightning_fed.aggregators.FedAdagrad={"server_lr": 0.05}',
        'lightning_fed.aggregators.FedAdam={"server_lr": 0.05}',
        'lightning_fed.aggregators.FedYogi={"server_lr": 0.05}',
    ],
    ids=["fedavgm", "fedadagrad", "fedadam", "fedyogi"],
)
def test_resume_is_bit_identical(tmp_path, spec):
    from helpers.resume import assert_resume_bit_identical

    # Killed in round 2: the server state of rounds 0 and 1 comes back from the checkpoint.
    result = assert_resume_bit_identical(tmp_path, "--aggregator", spec, kill_round=2, client_index=1)
    state = result["aggregator_state"]
    assert state["num_steps"] == 4
    assert any(bool(t.abs().sum() > 0) for kind in state if kind != "num_steps" for t in state[kind].values())
