import pytest
import torch
import torch.nn.functional as F
from helpers.boring import (
    BoringClassifier,
    OneCycleClassifier,
    fast_trainer,
    global_weights,
    make_datamodule,
    one_cycle_lrs,
)

from lightning_fed import ClientStateStore, FedCallback
from lightning_fed.aggregators import FedAvg, QFedAvg
from lightning_fed.aggregators.qfedavg import LIPSCHITZ_KEY, LOSS_KEY
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.functional.qfedavg import apply_step, client_terms

LR = 0.1
EPS = 1e-10


def reference(global_params, local_models, losses, q, lipschitz, param_names, inside_norm=False):
    """Li et al. 2020, Alg. 2 / qffedavg.py, written out per client over flat vectors."""
    floats = [n for n, t in global_params.items() if t.is_floating_point()]
    flat = lambda state, names: torch.cat([state[n].double().flatten() for n in names])  # noqa: E731
    total_delta, total_h = torch.zeros_like(flat(global_params, floats)), 0.0
    for local, loss in zip(local_models, losses):
        grad = lipschitz * (flat(global_params, floats) - flat(local, floats))
        grad_params = lipschitz * (flat(global_params, param_names) - flat(local, param_names))
        weight = (loss + EPS) ** q
        norm_term = (weight * grad_params).pow(2).sum() if inside_norm else grad_params.pow(2).sum()
        total_delta += weight * grad
        total_h += q * (loss + EPS) ** (q - 1) * float(norm_term) + lipschitz * weight
    new_flat = flat(global_params, floats) - total_delta / total_h
    result, offset = {}, 0
    for name in floats:
        size = global_params[name].numel()
        result[name] = new_flat[offset : offset + size].view_as(global_params[name]).to(global_params[name].dtype)
        offset += size
    return result


def _hand_built():
    global_params = {"w": torch.tensor([1.0, 2.0, -1.0]), "b": torch.tensor([0.5]), "bn.mean": torch.tensor([0.0])}
    locals_ = [
        {"w": torch.tensor([0.8, 2.2, -1.1]), "b": torch.tensor([0.45]), "bn.mean": torch.tensor([0.2])},
        {"w": torch.tensor([1.3, 1.5, -0.7]), "b": torch.tensor([0.9]), "bn.mean": torch.tensor([-0.4])},
        {"w": torch.tensor([0.9, 2.1, -1.0]), "b": torch.tensor([0.4]), "bn.mean": torch.tensor([0.1])},
    ]
    return global_params, locals_, [0.5, 2.0, 1.2]


def _aggregate(agg, global_params, locals_, losses, client_ids=None, num_clients=None):
    num_clients = num_clients or len(locals_)
    round_ctx = RoundContext(
        0, list(range(num_clients)), global_params, dict.fromkeys(range(num_clients), 10), ClientStateStore()
    )
    agg.reset(global_params, round_ctx)
    for cid in client_ids if client_ids is not None else range(len(locals_)):
        agg.update(ClientUpdate(cid, 10, 5, locals_[cid], extras={LOSS_KEY: losses[cid], LIPSCHITZ_KEY: 1 / LR}))
    return agg.compute(global_params)


def test_aggregate_matches_the_reference_formula_and_catches_f_q_inside_the_norm():
    global_params, locals_, losses = _hand_built()
    agg = QFedAvg(q=2.0)
    agg._norm_names = {"w", "b"}  # what on_round_start reads from the module's trainable parameters
    result = _aggregate(agg, global_params, locals_, losses)
    expected = reference(global_params, locals_, losses, 2.0, 1 / LR, ["w", "b"])
    wrong = reference(global_params, locals_, losses, 2.0, 1 / LR, ["w", "b"], inside_norm=True)
    for name in global_params:
        torch.testing.assert_close(result[name], expected[name], rtol=0, atol=1e-6)
    # F^q inside the norm (two public repos) changes the step by far more than the tolerance used above.
    assert max(float((wrong[n] - expected[n]).abs().max()) for n in global_params) > 1e-3
    # Hand check of one client's terms: F=0.5, q=2, L=10, dw = 10*(w_g - w_1).
    deltas, h = client_terms(global_params, locals_[0], 0.5, 2.0, 10.0, ["w", "b"])
    dw = torch.tensor([2.0, -2.0, 1.0, 0.5], dtype=torch.float64)
    assert h == pytest.approx(2 * 0.5 * float(dw.pow(2).sum()) + 10 * 0.25)
    torch.testing.assert_close(deltas["w"], 0.25 * dw[:3])


def test_q_zero_gives_the_unweighted_mean_of_the_local_models():
    global_params, locals_, losses = _hand_built()
    agg = QFedAvg(q=0.0)
    agg._norm_names = {"w", "b"}
    result = _aggregate(agg, global_params, locals_, losses)
    for name in global_params:
        mean = torch.stack([local[name] for local in locals_]).mean(0)
        torch.testing.assert_close(result[name], mean, rtol=0, atol=1e-6)


def test_rejected_clients_are_left_out():
    global_params, locals_, losses = _hand_built()
    agg = QFedAvg(q=1.0)
    agg._norm_names = {"w", "b"}
    result = _aggregate(agg, global_params, locals_, losses, client_ids=[0, 2], num_clients=3)
    expected = reference(global_params, [locals_[0], locals_[2]], [losses[0], losses[2]], 1.0, 1 / LR, ["w", "b"])
    for name in global_params:
        torch.testing.assert_close(result[name], expected[name], rtol=0, atol=1e-6)
    assert apply_step(global_params, {}, 1.0) == {}
    with pytest.raises(ValueError, match="loss at the global model"):
        agg.update(ClientUpdate(0, 10, 5, locals_[0]))


def _fit(tmp_path, aggregator, callbacks=(), num_rounds=1, **module_kwargs):
    torch.manual_seed(0)
    module = BoringClassifier(lr=LR, **module_kwargs)
    start = global_weights(module)
    datamodule = make_datamodule(num_clients=3, batch_size=16)
    trainer = fast_trainer(
        tmp_path,
        aggregator=aggregator,
        callbacks=list(callbacks),
        num_rounds=num_rounds,
        clients_per_round=3,
        local_epochs=1,
        client_eval="none",
        eval_every_n_rounds=0,
        seed=0,
    )
    trainer.fit(module, datamodule=datamodule)
    return module, start, datamodule, trainer


def test_q_zero_end_to_end_equals_uniform_fedavg_with_batch_norm(tmp_path):
    qfed, _, _, q_trainer = _fit(tmp_path / "q", QFedAvg(q=0.0), num_rounds=2, batch_norm=True, dropout=0.3)
    fedavg, _, _, f_trainer = _fit(
        tmp_path / "f", FedAvg(weighting="uniform"), num_rounds=2, batch_norm=True, dropout=0.3
    )
    for name, tensor in global_weights(fedavg).items():
        torch.testing.assert_close(global_weights(qfed)[name], tensor, rtol=0, atol=1e-6)
    up = [trainer.federation_state.history[-1]["comm/bytes_up"] for trainer in (q_trainer, f_trainer)]
    assert up[0] == up[1] + 4 * 3 * 2  # one float32 F_k per client and round


class Poison(FedCallback):
    """Client 1 diverges; records the accepted local models."""

    def __init__(self):
        self.locals = {}

    def on_client_train_start(self, trainer, pl_module, ctx, dataloader):
        pl_module.poison = ctx.client_id == 1

    def on_client_end(self, trainer, pl_module, ctx, update):
        self.locals[ctx.client_id] = {n: t.clone() for n, t in update.params.items()}


class Locals(FedCallback):
    """Records every client's local model."""

    def __init__(self):
        self.locals = {}

    def on_client_end(self, trainer, pl_module, ctx, update):
        self.locals[ctx.client_id] = {n: t.clone() for n, t in update.params.items()}


def _client_loss(module, weights, datamodule, client_id):
    module.load_state_dict(weights)
    module.eval()
    batches = list(datamodule.client_dataloader(client_id, seed=123))
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert len(y) == datamodule.client_num_samples(client_id)
    with torch.no_grad():
        return float(F.cross_entropy(module(x), y))


def test_loss_is_measured_at_the_global_model_over_all_client_data_and_rejected_clients_drop_out(tmp_path):
    poison, agg = Poison(), QFedAvg(q=1.0)
    module, start, datamodule, trainer = _fit(tmp_path, agg, callbacks=[poison], batch_norm=True, dropout=0.5)
    assert sorted(poison.locals) == [0, 2] and trainer.federation_state.history[-1]["clients/rejected"] == 1
    probe = BoringClassifier(batch_norm=True, dropout=0.5)
    for cid in (0, 2):
        at_global = _client_loss(probe, start, datamodule, cid)
        assert agg.client_losses[cid] == pytest.approx(at_global, rel=1e-5)
        at_local = _client_loss(probe, poison.locals[cid], datamodule, cid)
        assert agg.client_losses[cid] != pytest.approx(at_local, rel=1e-3)
    names = [n for n, p in probe.named_parameters()]
    expected = reference(
        start, [poison.locals[0], poison.locals[2]], [agg.client_losses[0], agg.client_losses[2]], 1.0, 1 / LR, names
    )
    for name, tensor in expected.items():
        torch.testing.assert_close(global_weights(module)[name], tensor, rtol=0, atol=1e-6)
    # Integer buffers are copied from the last accepted client; measuring F_k left w_g's BN statistics alone.
    tracked = "net.1.num_batches_tracked"
    assert torch.equal(global_weights(module)[tracked], poison.locals[2][tracked])
    assert trainer.federation_state.history[-1][LOSS_KEY] > 0


def test_under_one_cycle_the_lipschitz_estimate_is_k_over_the_sum_of_the_step_sizes_taken(tmp_path):
    """With a step-interval OneCycleLR the rate changes at every local step: L = 1/lr is K over the sum of the rates
    of the client's steps (from a plain OneCycleLR run of the same length, computed here), not 1/lr at the start."""
    recorder = Locals()
    torch.manual_seed(0)
    module = OneCycleClassifier()
    start = global_weights(module)
    agg = QFedAvg(q=1.0)
    trainer = fast_trainer(
        tmp_path,
        aggregator=agg,
        callbacks=[recorder],
        num_rounds=1,
        clients_per_round=2,
        client_eval="none",
        eval_every_n_rounds=0,
        seed=0,
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=2))
    k = trainer.global_step // 2
    lrs = one_cycle_lrs(module.total_steps)
    assert len(lrs) == k
    lipschitz = k / sum(lrs)
    assert lipschitz != pytest.approx(1 / lrs[0], rel=1e-2)
    names = [n for n, _ in module.named_parameters()]
    locals_ = [recorder.locals[0], recorder.locals[1]]
    expected = reference(start, locals_, [agg.client_losses[0], agg.client_losses[1]], 1.0, lipschitz, names)
    for name, tensor in expected.items():
        torch.testing.assert_close(global_weights(module)[name], tensor, rtol=0, atol=1e-6)


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="`q`"):
        QFedAvg(q=-1.0)
    with pytest.raises(ValueError, match="`lipschitz`"):
        QFedAvg(lipschitz=0.0)
