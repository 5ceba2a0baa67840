import math
from types import SimpleNamespace

import pytest
import torch
from helpers.boring import (
    BoringClassifier,
    OneCycleClassifier,
    fast_trainer,
    global_weights,
    make_datamodule,
    one_cycle_lrs,
)
from helpers.resume import assert_resume_bit_identical

from lightning_fed import FedCallback
from lightning_fed.aggregators import FedAvg
from lightning_fed.callbacks import Scaffold
from lightning_fed.functional.scaffold import client_control_update, gradient_correction, server_control_update
from lightning_fed.run.module_checks import check_module_setup

LR = 0.1


class Before(FedCallback):
    """Placed before Scaffold: sees x, the raw gradient of the first step, and the controls the client trains with."""

    def __init__(self, scaffold):
        self.scaffold, self.records = scaffold, []

    def on_client_train_start(self, trainer, pl_module, ctx, dataloader):
        stored = ctx.store.get("scaffold", ctx.client_id)
        server = {n: c.clone() for n, c in self.scaffold.state_dict()["server_control"].items()}
        client = stored if stored is not None else {n: torch.zeros_like(c) for n, c in server.items()}
        self.current = dict(cid=ctx.client_id, x=global_weights(pl_module), c=server, c_i=client, grad=None)

    def on_client_before_optimizer_step(self, trainer, pl_module, step):
        if self.current["grad"] is None:
            self.current["grad"] = {n: p.grad.clone() for n, p in pl_module.named_parameters()}

    def on_client_end(self, trainer, pl_module, ctx, update):
        self.current.update(y=global_weights(pl_module), K=ctx.num_steps, n=ctx.num_samples)
        self.records.append(self.current)


class After(FedCallback):
    """Placed after Scaffold: sees the stored c_i+ and, at round end, the new server control."""

    def __init__(self, scaffold):
        self.scaffold, self.client_controls, self.server_controls = scaffold, [], []

    def on_client_end(self, trainer, pl_module, ctx, update):
        self.client_controls.append(ctx.store.get("scaffold", ctx.client_id))

    def on_round_end(self, trainer, pl_module, round_ctx, metrics):
        self.server_controls.append({n: c.clone() for n, c in self.scaffold.state_dict()["server_control"].items()})


def _fit(tmp_path, num_clients=2, callbacks=(), aggregator=None, momentum=0.0, datamodule_kwargs=None, **kwargs):
    torch.manual_seed(0)
    module = BoringClassifier(lr=LR, momentum=momentum)
    datamodule = make_datamodule(num_clients=num_clients, **(datamodule_kwargs or {}))
    kwargs.setdefault("clients_per_round", num_clients)
    trainer = fast_trainer(
        tmp_path,
        callbacks=list(callbacks),
        aggregator=aggregator or FedAvg(weighting="uniform"),
        client_eval="none",
        eval_every_n_rounds=0,
        seed=0,
        **kwargs,
    )
    trainer.fit(module, datamodule=datamodule)
    return module, trainer


def _with_recorders(tmp_path, **kwargs):
    scaffold = Scaffold()
    before, after = Before(scaffold), After(scaffold)
    module, trainer = _fit(tmp_path, callbacks=[before, scaffold, after], **kwargs)
    return before, after, module, trainer


def test_functional_control_updates_match_hand_computed_values():
    c, c_i = {"w": torch.tensor([0.5, -1.0])}, {"w": torch.tensor([0.25, 2.0])}
    x, y = {"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([0.4, 1.6])}
    assert torch.equal(gradient_correction(c, c_i)["w"], torch.tensor([0.25, -3.0]))
    new, delta = client_control_update(c_i, c, x, y, step_size_sums={"w": 3 * 0.1})
    # c_i+ = c_i - c + (x - y) / (K lr) = [0.25 - 0.5 + 2, 2 + 1 - 2]
    torch.testing.assert_close(new["w"], torch.tensor([1.75, 1.0]))
    torch.testing.assert_close(delta["w"], torch.tensor([1.5, -1.0]))
    # c + (1/N) sum of deltas, with N = 4 registered clients
    updated = server_control_update(c, {"w": torch.tensor([2.0, -4.0])}, num_clients=4)
    torch.testing.assert_close(updated["w"], torch.tensor([1.0, -2.0]))
    with pytest.raises(ValueError, match="sum to > 0"):
        client_control_update(c_i, c, x, y, step_size_sums={"w": 0.0})


def test_one_local_step_moves_the_live_parameters_by_the_corrected_gradient(tmp_path):
    before, _, _, _ = _with_recorders(tmp_path, num_rounds=3, local_steps=1)
    corrected_rounds = 0
    for rec in before.records:
        assert rec["K"] == 1
        correction_size = 0.0
        for name, grad in rec["grad"].items():
            correction = rec["c"][name] - rec["c_i"][name]
            expected = rec["x"][name] - LR * (grad + correction)
            torch.testing.assert_close(rec["y"][name], expected, rtol=0, atol=1e-6)
            correction_size += float(correction.abs().max())
            # A correction applied to a copy (the rFedAvg repo's SCAFFOLD) would leave plain SGD's x - lr*g.
            if correction.abs().max() > 1e-3:
                assert not torch.allclose(rec["y"][name], rec["x"][name] - LR * grad, rtol=0, atol=1e-6)
        corrected_rounds += correction_size > 1e-3
    assert corrected_rounds >= 4  # rounds 2 and 3, both clients: the test exercised a non-zero correction


def test_zero_controls_make_the_first_round_fedavg_exactly(tmp_path):
    fedavg, _ = _fit(tmp_path / "fedavg", num_rounds=1, local_epochs=1)
    scaffold, _ = _fit(tmp_path / "scaffold", callbacks=[Scaffold()], num_rounds=1, local_epochs=1)
    for name, tensor in global_weights(fedavg).items():
        assert torch.equal(global_weights(scaffold)[name], tensor), name
    fedavg, _ = _fit(tmp_path / "fedavg2", num_rounds=2, local_epochs=1)
    scaffold, _ = _fit(tmp_path / "scaffold2", callbacks=[Scaffold()], num_rounds=2, local_epochs=1)
    assert not all(torch.equal(global_weights(scaffold)[n], t) for n, t in global_weights(fedavg).items())


def _expected_steps(num_samples, batch_size, epochs, accumulate):
    batches = math.ceil(num_samples / batch_size)
    return epochs * math.ceil(batches / accumulate)


@pytest.mark.parametrize(
    ("schedule", "accumulate"),
    [(dict(local_steps=3), 1), (dict(local_epochs=2), 1), (dict(local_epochs=2), 3)],
)
def test_controls_follow_option_ii_with_k_the_optimizer_steps_taken(tmp_path, schedule, accumulate):
    num_clients = 4
    before, after, _, trainer = _with_recorders(
        tmp_path,
        num_clients=num_clients,
        clients_per_round=2,
        num_rounds=2,
        accumulate_grad_batches=accumulate,
        **schedule,
    )
    server = {n: torch.zeros_like(c) for n, c in before.records[0]["c"].items()}
    for round_idx in range(2):
        delta_sum = {n: torch.zeros_like(c) for n, c in server.items()}
        for rec, stored in list(zip(before.records, after.client_controls))[2 * round_idx : 2 * round_idx + 2]:
            expected_k = 3 if "local_steps" in schedule else _expected_steps(rec["n"], 16, 2, accumulate)
            assert rec["K"] == expected_k
            for name, c in server.items():
                assert torch.equal(rec["c"][name], c)
                c_plus = rec["c_i"][name] - c + (rec["x"][name] - rec["y"][name]) / (expected_k * LR)
                torch.testing.assert_close(stored[name], c_plus, rtol=1e-5, atol=1e-6)
                assert stored[name].device.type == "cpu"
                delta_sum[name] += c_plus - rec["c_i"][name]
        server = {n: c + delta_sum[n] / num_clients for n, c in server.items()}  # c + (|S|/N) mean(delta c)
        for name, c in server.items():
            torch.testing.assert_close(after.server_controls[round_idx][name], c, rtol=1e-5, atol=1e-6)
        assert any(c.abs().max() > 0 for c in server.values())


class StepParams(FedCallback):
    """The parameters after each optimizer step: placed before Scaffold, before its after-step correction; placed
    after it, with the correction applied."""

    def __init__(self):
        self.steps = []

    def on_client_after_optimizer_step(self, trainer, pl_module, step):
        self.steps.append({n: p.detach().clone() for n, p in pl_module.named_parameters()})


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["sgd", "momentum"])
def test_under_one_cycle_the_control_divides_by_the_sum_of_the_step_sizes_taken(tmp_path, momentum):
    """With a step-interval OneCycleLR the rate changes at every local step: option II's K*lr is the sum of the
    rates of the steps the client took (from a plain OneCycleLR run of the same length, computed here), and with
    momentum the after-step correction uses each step's own rate."""
    scaffold = Scaffold()
    before, after = Before(scaffold), After(scaffold)
    pre, post = StepParams(), StepParams()
    torch.manual_seed(0)
    module = OneCycleClassifier(momentum=momentum)
    trainer = fast_trainer(
        tmp_path,
        callbacks=[before, pre, scaffold, post, after],
        aggregator=FedAvg(weighting="uniform"),
        client_eval="none",
        eval_every_n_rounds=0,
        seed=0,
        num_rounds=2,
        clients_per_round=2,
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=2))
    steps = {rec["K"] for rec in before.records}
    assert len(steps) == 1  # clients of equal size: round r's schedule starts at r * K
    (k,) = steps
    lrs = one_cycle_lrs(module.total_steps)
    assert len(lrs) == 2 * k
    server = {n: torch.zeros_like(c) for n, c in before.records[0]["c"].items()}
    corrected = 0
    for index, (rec, stored) in enumerate(zip(before.records, after.client_controls)):
        round_idx = index // 2
        taken = lrs[round_idx * k : (round_idx + 1) * k]
        assert sum(taken) != pytest.approx(k * taken[-1], rel=1e-2)  # the last rate times K is not the sum
        for name, c in server.items():
            c_plus = rec["c_i"][name] - c + (rec["x"][name] - rec["y"][name]) / sum(taken)
            torch.testing.assert_close(stored[name], c_plus, rtol=1e-5, atol=1e-6)
        if momentum:
            # y <- y - lr_k (c - c_i) after each of the client's steps, at the rate that step took.
            for step, lr in enumerate(taken):
                got, stepped = post.steps[index * k + step], pre.steps[index * k + step]
                for name in server:
                    expected = stepped[name] - lr * (rec["c"][name] - rec["c_i"][name])
                    torch.testing.assert_close(got[name], expected, rtol=0, atol=1e-7)
                    corrected += bool((rec["c"][name] - rec["c_i"][name]).abs().max() > 1e-4)
        if index % 2 == 1:
            server = after.server_controls[round_idx]
    assert not momentum or corrected > 0


def test_fp16_loss_scaling_is_refused():
    module = BoringClassifier()
    fake = SimpleNamespace(
        lightning_module=module,
        optimizers=[object()],
        lr_scheduler_configs=[],
        callbacks=[Scaffold()],
        strategy=SimpleNamespace(precision_plugin=SimpleNamespace(scaler=object())),
        datamodule=SimpleNamespace(num_clients=2),
    )
    with pytest.raises(ValueError, match="Scaffold"):
        check_module_setup(fake, module)


def test_misconfigured_aggregator_raises_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="weighting: uniform"):
        _fit(tmp_path / "a", callbacks=[Scaffold()], aggregator=FedAvg(), num_rounds=1)


def test_communication_is_twice_fedavg(tmp_path):
    _, fedavg = _fit(tmp_path / "fedavg", num_rounds=2, local_steps=1, num_clients=3, clients_per_round=2)
    _, scaffold = _fit(
        tmp_path / "scaffold", callbacks=[Scaffold()], num_rounds=2, local_steps=1, num_clients=3, clients_per_round=2
    )
    for key in ("comm/bytes_up", "comm/bytes_down"):
        plain = [entry[key] for entry in fedavg.federation_state.history]
        assert plain[0] > 0
        assert [entry[key] for entry in scaffold.federation_state.history] == [2 * v for v in plain]


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    result = assert_resume_bit_identical(
        tmp_path,
        "--callback",
        "lightning_fed.callbacks.Scaffold",
        "--aggregator",
        'lightning_fed.aggregators.FedAvg={"weighting": "uniform"}',
        "--momentum",
        "0",
    )
    assert result["store"]["scaffold"], "the client controls were not checkpointed"
    assert any(state.get("server_control") for state in result["callback_states"])
