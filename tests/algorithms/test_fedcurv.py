import copy

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule, make_tensors
from helpers.resume import assert_resume_bit_identical
from torch.utils.data import DataLoader, TensorDataset

from lightning_fed import ClientContext, ClientStateStore, FedCallback
from lightning_fed.callbacks import FedCurv
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.functional.fedcurv import (
    client_statistics,
    excluding_client,
    fedcurv_gradient,
    fedcurv_penalty,
    updated_sums,
)
from lightning_fed.hooks import GroupStep


def _random_stats(seed: int, shapes: dict[str, tuple[int, ...]]):
    g = torch.Generator().manual_seed(seed)
    fisher = {n: torch.rand(s, generator=g) for n, s in shapes.items()}
    theta = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    return fisher, theta, client_statistics(fisher, theta)


SHAPES = {"a": (3, 4), "b": (5,)}


def _sums_and_clients(n: int = 4):
    clients = [_random_stats(seed, SHAPES) for seed in range(n)]
    sums = None
    for _, _, stats in clients:
        sums = updated_sums(sums, stats)
    return sums, clients


def _explicit(theta, clients, s, lam):
    return lam * sum(
        (fisher[n] * (theta[n] - anchor[n]) ** 2).sum()
        for j, (fisher, anchor, _) in enumerate(clients)
        if j != s
        for n in theta
    )


def test_uvw_form_equals_the_explicit_quadratic_and_its_gradient_matches_autograd():
    sums, clients = _sums_and_clients()
    lam, s = 0.7, 1
    theta = {n: torch.randn(shape, requires_grad=True) for n, shape in SHAPES.items()}
    others = excluding_client(sums, clients[s][2], theta)
    torch.testing.assert_close(fedcurv_penalty(theta, others, lam), _explicit(theta, clients, s, lam))
    without_w = {**others, "w": {n: torch.zeros_like(t) for n, t in others["w"].items()}}
    shifted = {n: t.detach() + 1.0 for n, t in theta.items()}
    # Without W the u, v form is the quadratic up to a constant in θ.
    gap = [fedcurv_penalty(t, without_w, lam) - _explicit(t, clients, s, lam) for t in (theta, shifted)]
    torch.testing.assert_close(gap[0], gap[1])
    grads = torch.autograd.grad(_explicit(theta, clients, s, lam), list(theta.values()))
    closed = fedcurv_gradient(theta, others, lam)
    for (name, _), grad in zip(theta.items(), grads):
        torch.testing.assert_close(closed[name], grad)
        assert grad.abs().sum() > 0


def test_server_sums_are_sums_not_averages_and_replace_a_clients_old_statistics():
    sums, clients = _sums_and_clients(3)
    for key in ("u", "v", "w"):
        for name in SHAPES:
            expected = sum(stats[key][name].double() for _, _, stats in clients)
            torch.testing.assert_close(sums[key][name], expected)
    _, _, fresh = _random_stats(10, SHAPES)
    before = {n: t.clone() for n, t in sums["u"].items()}
    replaced = updated_sums(sums, fresh, clients[0][2])
    for name in SHAPES:
        assert torch.equal(sums["u"][name], before[name]), "updated_sums must not edit the old sums"
        expected = fresh["u"][name].double() + clients[1][2]["u"][name] + clients[2][2]["u"][name]
        torch.testing.assert_close(replaced["u"][name], expected)


def test_others_are_out_of_place_and_never_negative():
    sums, clients = _sums_and_clients(2)
    own = clients[0][2]
    like = {n: torch.zeros(s) for n, s in SHAPES.items()}
    # Round-off makes U - u_s slightly negative when only client s contributes curvature to a coordinate.
    sums["u"]["b"] = own["u"]["b"].double() - 1e-9
    before = {k: {n: t.clone() for n, t in part.items()} for k, part in sums.items()}
    others = excluding_client(sums, own, like)
    assert all((t >= 0).all() for t in others["u"].values())
    assert all((t >= 0).all() for t in others["w"].values())
    for key, part in before.items():
        for name, tensor in part.items():
            assert torch.equal(sums[key][name], tensor), f"{key}/{name}: the server sums were edited in place"
    again = excluding_client(sums, own, like)
    assert all(torch.equal(again["u"][n], others["u"][n]) for n in SHAPES)


def _loader(batch_size: int, num: int = 37) -> DataLoader:
    x, y = make_tensors(num)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def _batch_grad_sq(module, x, y):
    grads = torch.autograd.grad(F.cross_entropy(module(x), y), list(module.parameters()))
    return [g.square() for g in grads]


def test_empirical_fisher_accumulates_over_every_batch_not_the_last():
    torch.manual_seed(0)
    module = BoringClassifier()
    fisher = FedCurv(1.0).compute_fisher(None, module, _loader(10))
    x, y = make_tensors(37)
    reference = [torch.zeros_like(p) for p in module.parameters()]
    for start in range(0, 37, 10):
        xb, yb = x[start : start + 10], y[start : start + 10]
        for acc, sq in zip(reference, _batch_grad_sq(module, xb, yb)):
            acc += xb.shape[0] / 37 * sq
    last = _batch_grad_sq(module, x[30:], y[30:])
    for (name, _), ref, last_only in zip(module.named_parameters(), reference, last):
        torch.testing.assert_close(fisher[name], ref)
        assert not torch.allclose(fisher[name], last_only)


def test_per_sample_fisher_matches_a_loop_and_the_empirical_one_at_batch_size_one():
    torch.manual_seed(0)
    module = BoringClassifier(batch_norm=True)
    module.net[1].running_mean.normal_()  # eval-mode BatchNorm uses these, per sample
    per_sample = FedCurv(1.0, fisher="per_sample").compute_fisher(None, module, _loader(8, num=19))
    empirical_b1 = FedCurv(1.0).compute_fisher(None, module, _loader(1, num=19))
    module.eval()
    x, y = make_tensors(19)
    reference = [torch.zeros_like(p) for p in module.parameters()]
    for i in range(19):
        for acc, sq in zip(reference, _batch_grad_sq(module, x[i : i + 1], y[i : i + 1])):
            acc += sq / 19
    for (name, _), ref in zip(module.named_parameters(), reference):
        torch.testing.assert_close(per_sample[name], ref)
        torch.testing.assert_close(empirical_b1[name], ref)


@pytest.mark.parametrize("fisher", ["empirical", "per_sample"])
def test_fisher_is_taken_in_eval_mode_and_restores_train_mode(fisher):
    torch.manual_seed(0)
    module = BoringClassifier(dropout=0.5)
    no_dropout = copy.deepcopy(module)
    no_dropout.net[2].p = 0.0
    module.train()
    callback = FedCurv(1.0, fisher=fisher)
    first = callback.compute_fisher(None, module, _loader(8))
    second = callback.compute_fisher(None, module, _loader(8))
    reference = callback.compute_fisher(None, no_dropout, _loader(8))
    assert module.training
    for name in first:
        assert torch.equal(first[name], second[name])
        torch.testing.assert_close(first[name], reference[name])


def test_fisher_ignores_frozen_parameters_and_logging_inside_training_step():
    module = BoringClassifier()
    module.net[0].bias.requires_grad_(False)
    with buffered_logging(module, LogBuffer()) as outer:
        fisher = FedCurv(1.0).compute_fisher(None, module, _loader(8))
        assert module.log == outer.log, "the client's buffer must be back after the Fisher pass"
    assert "net.0.bias" not in fisher and "net.0.weight" in fisher


class _Spy(FedCallback):
    """Records what FedCurv holds and hands each client."""

    def __init__(self, fedcurv: FedCurv) -> None:
        self.fedcurv, self.seen = fedcurv, []

    def on_client_start(self, trainer, pl_module, ctx):
        sums = self.fedcurv.sums
        self.seen.append(
            (ctx.round_idx, ctx.client_id, None if sums is None else {n: t.clone() for n, t in sums["u"].items()})
        )

    def on_client_before_optimizer_step(self, trainer, pl_module, step):
        (ctx,) = step.contexts
        if ctx.num_steps == 0:
            self.seen[-1] += (self.fedcurv.is_active(ctx), ctx.extras.get("fedcurv"))


def _fit(tmp_path, callbacks, num_rounds=3, clients_per_round=3, num_clients=3):
    L.seed_everything(0)
    module = BoringClassifier(momentum=0.5, dropout=0.2)
    trainer = fast_trainer(
        tmp_path, num_rounds=num_rounds, clients_per_round=clients_per_round, local_epochs=2, callbacks=callbacks
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=num_clients))
    return global_weights(module), trainer


def test_in_a_fit_every_client_of_a_round_sees_the_same_sums_minus_its_own(tmp_path):
    fedcurv = FedCurv(0.5)
    spy = _Spy(fedcurv)
    _, trainer = _fit(tmp_path, [fedcurv, spy], num_rounds=3, clients_per_round=2, num_clients=4)
    by_round = {}
    for round_idx, client_id, sums_u, active, extras in spy.seen:
        by_round.setdefault(round_idx, []).append((client_id, sums_u, active, extras))
    assert not any(active for _, _, active, _ in by_round[0])  # round 0: no statistics anywhere
    for round_idx in (1, 2):
        first_sums = by_round[round_idx][0][1]
        for _, sums_u, _, extras in by_round[round_idx]:
            assert all(torch.equal(sums_u[n], first_sums[n]) for n in first_sums), "U changed within a round"
            assert all((t >= 0).all() for t in (extras or {"u": {}})["u"].values())
    store = trainer.federation_state.store
    # Server sums are the SUM over every client's latest statistics (not an average over clients).
    for name, total in fedcurv.sums["u"].items():
        expected = sum(stats["u"][name].double() for _, stats in store.items("fedcurv"))
        torch.testing.assert_close(total, expected)
    assert len(store.clients("fedcurv")) >= 2


def test_a_first_time_client_is_penalised_with_everybody_elses_statistics(tmp_path):
    # Eq. 3 sums over the other clients: a client joining after round 0 finds their statistics in U, V, W (and none
    # of its own), so it trains with the sums as they are. Only round 0, where nobody has statistics, is unpenalised.
    fedcurv = FedCurv(0.5)
    spy = _Spy(fedcurv)
    _fit(tmp_path, [fedcurv, spy], num_rounds=4, clients_per_round=1, num_clients=4)
    participated, first_timers = set(), 0
    for round_idx, client_id, sums_u, active, extras in spy.seen:
        assert active == (round_idx > 0), (round_idx, client_id)
        if round_idx > 0 and client_id not in participated:
            first_timers += 1
            for name, total in sums_u.items():
                assert torch.equal(extras["u"][name], total.to(extras["u"][name].dtype)), name
            assert any(t.abs().max() > 0 for t in extras["u"].values())
        participated.add(client_id)
    assert first_timers >= 1  # the seeded sampling brought a new client after round 0: the case was exercised


def test_lambda_zero_is_exactly_fedavg_and_lambda_positive_is_not(tmp_path):
    plain, plain_trainer = _fit(tmp_path, [], num_rounds=2)
    zero, _ = _fit(tmp_path, [FedCurv(0.0)], num_rounds=2)
    for name, tensor in plain.items():
        assert torch.equal(zero[name], tensor), name
    strong, strong_trainer = _fit(tmp_path, [FedCurv(50.0)], num_rounds=2)
    history = strong_trainer.federation_state.history
    assert "train/fedcurv" not in history[0] and history[-1]["train/fedcurv"] > 0
    assert any(not torch.equal(strong[n], t) for n, t in plain.items())
    # u, v, w up and U, V, W down: 3 float32 model-sized tensors each way per penalised client.
    model_bytes = sum(p.numel() * 4 for p in BoringClassifier().parameters())
    extra_up = history[-1]["comm/bytes_up"] - plain_trainer.federation_state.history[-1]["comm/bytes_up"]
    extra_down = history[-1]["comm/bytes_down"] - plain_trainer.federation_state.history[-1]["comm/bytes_down"]
    assert extra_up == 3 * model_bytes * 2 * 3  # 2 rounds x 3 clients upload
    assert extra_down == 3 * model_bytes * 1 * 3  # only round 1's clients hold statistics to be penalised with


def test_injected_gradient_equals_autograd_of_the_documented_local_loss():
    torch.manual_seed(0)
    module = BoringClassifier()
    sums, clients = None, []
    for seed in range(3):
        fisher, theta, _ = _random_stats(seed, {n: tuple(p.shape) for n, p in module.named_parameters()})
        clients.append((fisher, theta, client_statistics(fisher, theta)))
        sums = updated_sums(sums, clients[-1][2])
    store = ClientStateStore()
    store.put("fedcurv", 2, clients[2][2])
    fedcurv = FedCurv(0.3)
    fedcurv.sums = sums
    state = {n: t.detach().clone() for n, t in module.state_dict().items()}
    ctx = ClientContext(2, 1, state, state, 10, store)
    fedcurv.on_client_train_start(None, module, ctx, None)
    x, y = make_tensors(16)
    module.zero_grad()
    F.cross_entropy(module(x), y).backward()
    with buffered_logging(module, LogBuffer()):
        fedcurv.on_client_before_optimizer_step(None, module, GroupStep.for_client(module, ctx, None))
    injected = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad()
    params = dict(module.named_parameters())
    (F.cross_entropy(module(x), y) + _explicit(params, clients, 2, 0.3)).backward()
    for name, param in params.items():
        torch.testing.assert_close(injected[name], param.grad)


@pytest.mark.parametrize("kwargs", [{"lam": -1.0}, {"lam": float("nan")}, {"lam": 1.0, "fisher": "exact"}])
def test_bad_arguments_name_the_argument(kwargs):
    name = "fisher" if "fisher" in kwargs else "lam"
    with pytest.raises(ValueError, match=f"`{name}`"):
        FedCurv(**kwargs)


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    result = assert_resume_bit_identical(
        tmp_path, "--callback", 'lightning_fed.callbacks.FedCurv={"lam": 1.0}', "--momentum", "0"
    )
    assert any("sums" in state for state in result["callback_states"])
    assert "fedcurv" in result["store"]
