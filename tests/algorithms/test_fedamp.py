"""FedAMP / HeurFedAMP callbacks: cloud models, exact proximal gradient, personalised evaluation, heatmap, resume."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule, make_tensors
from helpers.resume import assert_resume_bit_identical
from torch import nn

from lightning_fed import ClientContext, ClientStateStore, FedCallback, RoundContext
from lightning_fed.callbacks import FedAMP, HeurFedAMP
from lightning_fed.engine.evaluation import evaluate
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.functional.state_dict import state_nbytes
from lightning_fed.hooks import GroupStep


class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))


def _round(callback, module, store, num_clients, client_ids, round_idx=0, global_params=None):
    """Runs the callback's round start outside a trainer; returns the client contexts after on_client_start."""
    trainer = SimpleNamespace(datamodule=SimpleNamespace(num_clients=num_clients))
    global_params = global_params or {k: v.detach().clone() for k, v in module.state_dict().items()}
    callback.on_round_start(trainer, module, RoundContext(round_idx, client_ids, global_params, {}, store))
    contexts = []
    for cid in client_ids:
        ctx = ClientContext(cid, round_idx, global_params, global_params, 10, store)
        callback.on_client_start(trainer, module, ctx)
        contexts.append(ctx)
    return contexts


def test_cloud_model_is_the_hand_computed_convex_combination_of_all_clients():
    module, store = _Scalar(), ClientStateStore()
    callback = FedAMP(alpha_k=0.5, lam=1.0, sigma=2.0)
    _round(callback, module, store, 3, [0])  # round 0: w_0 = 0 for everyone
    for cid, value in [(1, 1.0), (2, 3.0)]:  # client 0 never trained: it still holds w_0 = 0
        callback.save_personal(store, cid, {"w": torch.tensor([value])})
    (ctx,) = _round(callback, module, store, 3, [0], round_idx=1)
    # d_01 = 1, d_02 = 9;  xi_0j = (alpha_k / sigma) exp(-d_0j / sigma);  u_0 = xi_01 * 1 + xi_02 * 3.
    xi_01, xi_02 = 0.25 * math.exp(-0.5), 0.25 * math.exp(-4.5)
    torch.testing.assert_close(ctx.initial_params["w"], torch.tensor([xi_01 * 1.0 + xi_02 * 3.0]))
    torch.testing.assert_close(callback.xi[0], torch.tensor([1 - xi_01 - xi_02, xi_01, xi_02], dtype=torch.float64))


def test_start_from_local_starts_at_the_clients_own_model_and_keeps_the_cloud_as_centre():
    module, store = _Scalar(), ClientStateStore()
    callback = FedAMP(alpha_k=0.5, sigma=2.0, start_from="local")
    _round(callback, module, store, 2, [0, 1])
    callback.save_personal(store, 0, {"w": torch.tensor([1.0])})
    ctx, _ = _round(callback, module, store, 2, [0, 1], round_idx=1)
    assert ctx.initial_params["w"].item() == 1.0
    expected_cloud = 1.0 - 0.25 * math.exp(-0.5)  # u_0 = (1 - xi_01) w_0 + xi_01 * 0
    torch.testing.assert_close(ctx.extras["fedamp_cloud"]["w"], torch.tensor([expected_cloud]))


def _perturbed_client(callback, batch_norm=True):
    """A BoringClassifier moved away from its cloud model u_i, and the client's context holding u_i."""
    torch.manual_seed(0)
    module, store = BoringClassifier(batch_norm=batch_norm), ClientStateStore()
    _round(callback, module, store, 3, [0])
    other = {k: v + 0.3 * torch.randn_like(v) if v.is_floating_point() else v for k, v in module.state_dict().items()}
    callback.save_personal(store, 1, other)
    (ctx,) = _round(callback, module, store, 3, [0], round_idx=1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module, ctx


def _grads_after_hook(callback, module, ctx, x, y):
    module.zero_grad()
    F.cross_entropy(module(x), y).backward()
    with buffered_logging(module, LogBuffer()):
        callback.on_client_before_optimizer_step(None, module, GroupStep.for_client(module, ctx, None))
    return {n: p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("cls", [FedAMP, HeurFedAMP])
def test_injected_gradient_equals_autograd_of_the_documented_loss_and_is_not_zero(cls):
    lam, alpha_k = 0.7, 0.2
    callback = cls(alpha_k=alpha_k, lam=lam, sigma=50.0)
    module, ctx = _perturbed_client(callback)
    cloud = ctx.extras["fedamp_cloud"]
    x, y = make_tensors(16)
    injected = _grads_after_hook(callback, module, ctx, x, y)
    module.zero_grad()
    params = dict(module.named_parameters())
    prox = sum(((p - cloud[n]) ** 2).sum() for n, p in params.items())
    (F.cross_entropy(module(x), y) + lam / (2 * alpha_k) * prox).backward()
    # PFLlib's pitfall: the same term built from `.data` contributes nothing to the gradient.
    module_data_grads = {n: torch.autograd.grad(F.cross_entropy(module(x), y), p)[0] for n, p in params.items()}
    for name, param in params.items():
        torch.testing.assert_close(injected[name], param.grad, rtol=1e-6, atol=1e-7)
        prox_grad = injected[name] - module_data_grads[name]
        torch.testing.assert_close(prox_grad, lam / alpha_k * (param.detach() - cloud[name]), rtol=1e-5, atol=1e-6)
        assert prox_grad.abs().sum() > 0, name


def test_penalty_is_half_lam_over_alpha_times_the_squared_norm():
    """Catches PFLlib's unsquared norm: doubling the offset must quadruple the value and double the gradient."""
    callback = FedAMP(alpha_k=0.25, lam=0.5, sigma=50.0)
    module, ctx = _perturbed_client(callback, batch_norm=False)
    cloud = ctx.extras["fedamp_cloud"]
    params = {n: p.detach() for n, p in module.named_parameters()}
    offset = {n: p - cloud[n] for n, p in params.items()}
    torch.testing.assert_close(callback.penalty(params, ctx), 0.5 * 2.0 * sum((o**2).sum() for o in offset.values()))
    doubled = {n: cloud[n] + 2 * o for n, o in offset.items()}
    torch.testing.assert_close(callback.penalty(doubled, ctx), 4 * callback.penalty(params, ctx))
    for name, gradient in callback.penalty_gradient(doubled, ctx).items():
        torch.testing.assert_close(gradient, 2 * callback.penalty_gradient(params, ctx)[name])


class _EvaluationSpy(FedCallback):
    """Runs after FedAMP: records which model each evaluated client got, and each client's start point."""

    def __init__(self, fedamp: FedAMP) -> None:
        self.fedamp = fedamp
        self.evaluated: list[tuple[int, int, dict]] = []
        self.starts: list[tuple[int, int, dict]] = []

    def on_client_train_start(self, trainer, pl_module, client_ctx, dataloader):
        self.starts.append(
            (client_ctx.round_idx, client_ctx.client_id, {k: v.clone() for k, v in pl_module.state_dict().items()})
        )

    def on_client_evaluate_start(self, trainer, pl_module, client_ctx):
        expected = self.fedamp.client_model(client_ctx.store, client_ctx.client_id)
        same = all(
            torch.equal(client_ctx.initial_params[k], expected[k].to(client_ctx.initial_params[k].device))
            for k in expected
        )
        global_ = client_ctx.initial_params is client_ctx.global_params
        self.evaluated.append((client_ctx.round_idx, client_ctx.client_id, {"personal": same, "global": global_}))


@pytest.fixture(scope="module")
def partial_participation_run(tmp_path_factory):
    """4 clients, 2 per round, 3 rounds: some clients are evaluated before they ever train."""
    L.seed_everything(0)
    fedamp = FedAMP(alpha_k=0.1, lam=1.0, sigma=1.0, heatmap_every_n_rounds=2)
    spy = _EvaluationSpy(fedamp)
    datamodule = make_datamodule(num_clients=4)
    module = BoringClassifier(batch_norm=True)
    trainer = fast_trainer(
        tmp_path_factory.mktemp("fedamp"), num_rounds=3, clients_per_round=2, callbacks=[fedamp, spy]
    )
    trainer.fit(module, datamodule=datamodule)
    return SimpleNamespace(trainer=trainer, fedamp=fedamp, spy=spy, module=module, datamodule=datamodule)


def test_every_client_is_evaluated_with_its_personalised_model_every_round(partial_participation_run):
    run = partial_participation_run
    by_round: dict[int, list[int]] = {}
    for round_idx, cid, checks in run.spy.evaluated:
        by_round.setdefault(round_idx, []).append(cid)
        assert checks == {"personal": True, "global": False}, (round_idx, cid)
    assert by_round == {r: [0, 1, 2, 3] for r in range(3)}
    history = run.trainer.federation_state.history
    assert all("personal/test_acc_mean" in entry and "personal/bmta" in entry for entry in history)
    assert not any(key.startswith("client/") for key in history[-1])


def test_personal_metrics_are_the_stored_personalised_models_accuracies(partial_participation_run):
    run = partial_participation_run
    store = run.trainer.federation_state.store
    module = BoringClassifier(batch_norm=True)
    accuracies = []
    for cid in range(4):
        module.load_state_dict(run.fedamp.client_model(store, cid))
        result = evaluate(run.trainer, module, run.datamodule.client_test_dataloader(cid), LogBuffer())
        assert result["test_acc"] == run.trainer.last_round_result.client_results[cid]["test_acc"]
        accuracies.append(result["test_acc"])
    assert run.trainer.federation_state.history[-1]["personal/test_acc_mean"] == pytest.approx(sum(accuracies) / 4)
    # The global (FedAvg) model is a different model: the personalised evaluation did not use it.
    global_state = run.module.state_dict()
    assert any(not torch.equal(global_state[k], run.fedamp.client_model(store, 0)[k]) for k in global_state)


def test_clients_start_from_their_cloud_model_and_store_their_result(partial_participation_run):
    run = partial_participation_run
    store = run.trainer.federation_state.store
    assert store.clients("fedamp") == sorted({cid for _, cid, _ in run.spy.starts})
    first_round = [start for round_idx, _, start in run.spy.starts if round_idx == 0]
    initial = run.fedamp.initial_params
    assert all(torch.equal(start[k], initial[k]) for start in first_round for k in initial)
    later = [(cid, start) for round_idx, cid, start in run.spy.starts if round_idx > 0]
    assert any(not torch.equal(start["net.0.weight"], initial["net.0.weight"]) for _, start in later)


def test_bytes_count_one_model_down_and_one_up_per_client(partial_participation_run):
    run = partial_participation_run
    model_bytes = state_nbytes(run.fedamp.initial_params)
    final = run.trainer.federation_state.history[-1]
    assert final["comm/bytes_down"] == final["comm/bytes_up"] == 3 * 2 * model_bytes


def test_xi_heatmap_png_is_written_every_n_rounds_and_at_the_end(partial_participation_run):
    xi_dir = partial_participation_run.trainer.fed_run_dir / "xi"
    assert sorted(p.name for p in xi_dir.glob("*.png")) == ["round_0002.png", "round_0003.png"]
    assert (xi_dir / "round_0003.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = partial_participation_run.trainer.federation_state.history
    assert all(0 <= entry["fedamp/xi_self_mean"] <= 1 for entry in history)


def test_evaluate_cloud_uses_the_cloud_models(tmp_path):
    L.seed_everything(0)
    fedamp = FedAMP(alpha_k=0.1, sigma=1.0, evaluate="cloud", heatmap_every_n_rounds=0)
    spy = _EvaluationSpy(fedamp)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=3, callbacks=[fedamp, spy])
    trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=3))
    last = [checks for round_idx, _, checks in spy.evaluated if round_idx == 1]
    assert len(last) == 3 and not any(c["personal"] or c["global"] for c in last)
    assert not (trainer.fed_run_dir / "xi").exists()


def test_heurfedamp_weights_in_a_run_have_the_configured_self_weight(tmp_path):
    L.seed_everything(0)
    heur = HeurFedAMP(alpha_k=0.1, sigma=50.0, self_weight=0.3, heatmap_every_n_rounds=0)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=3, callbacks=[heur])
    trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=3))
    torch.testing.assert_close(heur.xi.diagonal(), torch.full((3,), 0.3, dtype=torch.float64))
    torch.testing.assert_close(heur.xi.sum(1), torch.ones(3, dtype=torch.float64))
    assert trainer.federation_state.store.clients("heurfedamp") == [0, 1, 2]
    assert trainer.federation_state.history[-1]["train/heurfedamp_proximal"] > 0


@pytest.mark.slow
def test_resume_is_bit_identical_with_personalised_state(tmp_path):
    # HeurFedAMP keeps the same state (it only overrides the weights), so one run covers both.
    spec = 'lightning_fed.callbacks.FedAMP={"alpha_k": 0.1, "sigma": 1.0, "heatmap_every_n_rounds": 1}'
    result = assert_resume_bit_identical(tmp_path, "--callback", spec)
    assert len(result["store"]["fedamp"]) == 5
    fedamp_state = next(state for state in result["callback_states"] if "xi" in state)
    assert fedamp_state["xi"].shape == (5, 5) and fedamp_state["initial_params"] is not None


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha_k": 0.0}, "alpha_k"),
        ({"lam": -1.0}, "lam"),
        ({"sigma": float("nan")}, "sigma"),
        ({"start_from": "global"}, "start_from"),
        ({"evaluate": "global"}, "evaluate"),
        ({"heatmap_every_n_rounds": -1}, "heatmap_every_n_rounds"),
        ({"heatmap_every_n_rounds": 2.0}, "heatmap_every_n_rounds"),
        ({"alpha_k": True}, "alpha_k"),
        ({"log_every_n_steps": 0}, "log_every_n_steps"),
    ],
)
def test_invalid_arguments_are_refused_with_the_argument_named(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        FedAMP(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"self_weight": 1.5}, "self_weight"), ({"sigma": -1.0}, "sigma"), ({"self_weight": None}, "self_weight")],
)
def test_heurfedamp_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        HeurFedAMP(**kwargs)
    HeurFedAMP(sigma=0.0, self_weight=0.0)
