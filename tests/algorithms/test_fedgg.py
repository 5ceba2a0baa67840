"""FedGG: CE + lambda_m (1 - cos(g, w - w^r)), g the server's last global update, adaptive lambda_m detached."""

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule
from helpers.resume import assert_resume_bit_identical

from lightning_fed import FedCallback
from lightning_fed.callbacks import FedGG
from lightning_fed.functional.fedgg import (
    adaptive_weight,
    cosine_loss,
    cosine_loss_gradient,
    flatten,
    safe_cosine,
    unflatten,
)
from lightning_fed.functional.state_dict import state_nbytes


def _vectors(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"a": scale * torch.randn(3, 4, generator=generator), "b": scale * torch.randn(5, generator=generator)}


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in d.values()])


# --- functional ---------------------------------------------------------------------------------------------------


def test_flatten_concatenates_every_tensor_and_unflatten_inverts_it():
    d = _vectors(0)
    flat = flatten(d.values())
    assert torch.equal(flat, torch.cat([d["a"].reshape(-1), d["b"]]))
    back = unflatten(flat, d)
    assert back.keys() == d.keys() and all(torch.equal(back[n], d[n]) for n in d)


def test_cosine_matches_torch_and_closed_form_gradient_equals_autograd():
    g, d = _flat(_vectors(0)), _flat(_vectors(1))
    torch.testing.assert_close(safe_cosine(g, d), F.cosine_similarity(g, d, dim=0))
    leaf = d.clone().requires_grad_(True)
    lam = torch.tensor(0.37)
    (auto,) = torch.autograd.grad(cosine_loss(g, leaf, lam), [leaf])
    closed = cosine_loss_gradient(g, d, lam)
    torch.testing.assert_close(closed, auto)
    assert torch.dot(closed, d).abs() < 1e-5  # the gradient of a cosine is orthogonal to d


@pytest.mark.parametrize("zero", ["g", "d", "both"])
def test_zero_vectors_give_zero_cosine_and_zero_gradient_without_nan(zero):
    g, d = _flat(_vectors(0)), _flat(_vectors(1))
    if zero in ("g", "both"):
        g = torch.zeros_like(g)
    if zero in ("d", "both"):
        d = torch.zeros_like(d)
    assert safe_cosine(g, d) == 0.0
    assert torch.isfinite(cosine_loss(g, d, 1.0))
    assert torch.equal(cosine_loss_gradient(g, d, 1.0), torch.zeros_like(d))


def test_adaptive_weight_cancels_the_blow_up_near_d_zero():
    g, step = _flat(_vectors(0)), _flat(_vectors(2, scale=1e-20))
    w_global = torch.zeros_like(g)
    # One tiny step from w^r: d = w(1) - w^r and w(1) - w(0) are both ~1e-20.
    lam = adaptive_weight(0.01, step, w_global, w_global)
    torch.testing.assert_close(lam, 0.01 * step.norm() ** 2)
    gradient = cosine_loss_gradient(g, step, lam)
    assert torch.isfinite(gradient).all()
    assert gradient.norm() <= 0.01 * step.norm() * (1 + 1e-5)  # ‖∇‖ = μ‖step‖ sin θ


# --- callback -----------------------------------------------------------------------------------------------------


class _Recorder(FedCallback):
    """Records parameters and .grad at each optimizer step of the first client of round 1 (placed around FedGG)."""

    def __init__(self, fedgg: FedGG | None = None) -> None:
        self.fedgg, self.steps, self.first = fedgg, [], None

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.first = round_ctx.client_ids[0]

    def on_client_before_optimizer_step(self, trainer, pl_module, step):
        (ctx,) = step.contexts
        if ctx.round_idx != 1 or ctx.client_id != self.first:
            return
        entry = {n: (p.detach().clone(), p.grad.clone()) for n, p in pl_module.named_parameters()}
        extra = {"weight": self.fedgg._weight, "ctx": ctx} if self.fedgg is not None else {}
        self.steps.append((ctx.num_steps, entry, extra))


def test_injected_gradient_and_adaptive_weight_match_the_paper_in_a_real_round(tmp_path):
    L.seed_everything(0)
    mu = 0.5
    fedgg = FedGG(mu)
    before, after = _Recorder(), _Recorder(fedgg)
    trainer = fast_trainer(tmp_path, num_rounds=2, callbacks=[before, fedgg, after])
    trainer.fit(BoringClassifier(momentum=0.9), datamodule=make_datamodule(num_clients=3))
    assert len(before.steps) == len(after.steps) > 3
    g = fedgg.global_update
    for index, ((m_1, plain, _), (_, total, extra)) in enumerate(zip(before.steps, after.steps)):
        w = {n: p for n, (p, _) in plain.items()}
        w_r = {n: extra["ctx"].global_params[n] for n in w}
        if m_1 == 0:
            assert extra["weight"] == 0.0  # λ_1 = 0
            assert all(torch.equal(total[n][1], plain[n][1]) for n in w)
            continue
        w_before = {n: p for n, (p, _) in before.steps[index - 1][1].items()}
        expected = mu * _flat(w).sub(_flat(w_r)).norm() * _flat(w).sub(_flat(w_before)).norm()
        torch.testing.assert_close(extra["weight"], expected)
        leaves = {n: p.clone().requires_grad_(True) for n, p in w.items()}
        loss = extra["weight"] * (1 - F.cosine_similarity(_flat(g), _flat(leaves) - _flat(w_r), dim=0))
        auto = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        injected = {n: total[n][1] - plain[n][1] for n in w}
        for name in w:
            # injected = (plain + penalty) - plain carries the rounding of that float32 addition.
            atol = 4 * torch.finfo(torch.float32).eps * total[name][1].abs().max()
            torch.testing.assert_close(injected[name], auto[name], rtol=1e-4, atol=atol)
        rounding = 4 * torch.finfo(torch.float32).eps * max(t[1].abs().max() for t in total.values())
        assert _flat(auto).norm() > 1e3 * rounding


class _GlobalSpy(FedCallback):
    """Placed after FedGG: records each round's global parameters, FedGG's g and the sampled clients."""

    def __init__(self, fedgg: FedGG) -> None:
        self.fedgg, self.rounds = fedgg, []

    def on_round_start(self, trainer, pl_module, round_ctx):
        names = [n for n, _ in pl_module.named_parameters()]
        weights = {n: round_ctx.global_params[n].clone() for n in names}
        g = None if self.fedgg.global_update is None else dict(self.fedgg.global_update)
        self.rounds.append((weights, g, list(round_ctx.client_ids), state_nbytes(round_ctx.global_params)))


def test_g_is_the_servers_last_global_update_under_partial_participation(tmp_path):
    L.seed_everything(0)
    fedgg = FedGG(0.5)
    spy = _GlobalSpy(fedgg)
    trainer = fast_trainer(tmp_path, num_rounds=4, clients_per_round=2, callbacks=[fedgg, spy], client_eval="none")
    trainer.fit(BoringClassifier(momentum=0.9), datamodule=make_datamodule(num_clients=5))
    assert spy.rounds[0][1] is None  # no g, no term in round 0
    expected_down = 2 * spy.rounds[0][3]
    for (previous, _, previous_ids, _), (current, g, ids, model_bytes) in zip(spy.rounds, spy.rounds[1:]):
        for name in current:
            assert torch.equal(g[name], current[name] - previous[name]), name
        newcomers = [cid for cid in ids if cid not in previous_ids]
        expected_down += len(ids) * model_bytes + len(newcomers) * state_nbytes(g)
    assert any(cid not in p for (_, _, p, _), (_, _, ids, _) in zip(spy.rounds, spy.rounds[1:]) for cid in ids)
    assert trainer.federation_state.history[-1]["comm/bytes_down"] == expected_down


def _fit(tmp_path, callbacks, num_rounds=3, lr=0.1):
    L.seed_everything(0)
    module = BoringClassifier(lr=lr, momentum=0.9)
    trainer = fast_trainer(
        tmp_path, num_rounds=num_rounds, clients_per_round=2, callbacks=callbacks, client_eval="none"
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=3))
    return global_weights(module), trainer.federation_state.history


@pytest.fixture(scope="module")
def fedavg_runs(tmp_path_factory):
    return {rounds: _fit(tmp_path_factory.mktemp(f"fedavg{rounds}"), [], rounds)[0] for rounds in (1, 3)}


def test_round_zero_is_exactly_fedavg(tmp_path, fedavg_runs):
    weights, history = _fit(tmp_path, [FedGG(10.0)], num_rounds=1)
    assert all(torch.equal(weights[n], t) for n, t in fedavg_runs[1].items())
    assert "train/fedgg_cosine" not in history[0]


def test_mu_zero_is_exactly_fedavg(tmp_path, fedavg_runs):
    zero, history = _fit(tmp_path, [FedGG(0.0)])
    assert all(torch.equal(zero[n], t) for n, t in fedavg_runs[3].items())
    assert history[-1]["train/fedgg_lambda"] == 0.0


def test_mu_positive_changes_training_from_round_one(tmp_path, fedavg_runs):
    guided, history = _fit(tmp_path, [FedGG(10.0)])
    assert any(not torch.equal(guided[n], t) for n, t in fedavg_runs[3].items())
    assert history[-1]["train/fedgg_cosine"] > 0.0 and history[-1]["train/fedgg_lambda"] > 0.0


def test_a_global_model_that_did_not_move_gives_no_nan(tmp_path):
    # lr = 0: every client returns w^r, so g = 0 in rounds >= 1 and d = 0 at every step; the fixed weight is on.
    weights, history = _fit(tmp_path, [FedGG(adaptive=False, lam=1.0)], num_rounds=2, lr=0.0)
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert history[-1]["clients/rejected"] == 0.0
    # λ (1 − 0) = 1 at steps m >= 2 (the cosine of a zero vector is defined as 0), 0 at m = 1.
    assert 0.5 < history[-1]["train/fedgg_cosine"] < 1.0


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    result = assert_resume_bit_identical(tmp_path, "--callback", 'lightning_fed.callbacks.FedGG={"mu": 1.0}')
    states = [s for s in result["callback_states"] if "previous_global" in s]
    assert len(states) == 1 and states[0]["previous_global"] is not None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mu": -1.0}, "`mu`"),
        ({"lam": 1e-8}, "`adaptive=False`"),
        ({"adaptive": False}, "`lam`"),
        ({"adaptive": False, "lam": float("nan")}, "`lam`"),
        ({"adaptive": 1}, "`adaptive`"),
    ],
)
def test_invalid_settings_are_refused_with_the_argument_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedGG(**kwargs)
