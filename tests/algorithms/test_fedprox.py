"""FedProx: (mu/2)||w - w_g||^2 over trainable parameters, gradient mu (w - w_g) injected into .grad."""

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule, make_tensors

from lightning_fed import ClientContext, ClientStateStore, FedCallback
from lightning_fed.callbacks import FedProx
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.hooks import GroupStep


def _perturbed(seed: int = 0, batch_norm: bool = True):
    """A module moved away from its own snapshot, and a client context whose global model is that snapshot."""
    torch.manual_seed(seed)
    module = BoringClassifier(batch_norm=batch_norm)
    global_params = {n: t.detach().clone() for n, t in module.state_dict().items()}
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module, ClientContext(0, 1, global_params, global_params, 10, ClientStateStore())


def _grads_after_hook(callback, module, ctx, x, y) -> dict[str, torch.Tensor]:
    module.zero_grad()
    F.cross_entropy(module(x), y).backward()
    with buffered_logging(module, LogBuffer()):
        callback.on_client_before_optimizer_step(None, module, GroupStep.for_client(module, ctx, None))
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def test_injected_gradient_equals_autograd_of_the_documented_loss():
    module, ctx = _perturbed()
    x, y = make_tensors(16)
    mu = 0.3
    injected = _grads_after_hook(FedProx(mu), module, ctx, x, y)
    module.zero_grad()
    params = dict(module.named_parameters())
    prox = sum(((p - ctx.global_params[n]) ** 2).sum() for n, p in params.items())
    (F.cross_entropy(module(x), y) + mu / 2 * prox).backward()
    for name, param in params.items():
        torch.testing.assert_close(injected[name], param.grad, rtol=1e-6, atol=1e-7)


def test_value_is_half_mu_times_the_squared_norm_and_gradient_is_linear_in_the_offset():
    """Catches the missing square: ||w - w_g|| (unsquared) has a unit-norm gradient and a value linear in the offset."""
    module, ctx = _perturbed()
    mu = 0.5
    prox = FedProx(mu)
    params = {n: p.detach() for n, p in module.named_parameters()}
    offset = {n: p - ctx.global_params[n] for n, p in params.items()}
    expected_value = mu / 2 * sum((o**2).sum() for o in offset.values())
    torch.testing.assert_close(prox.penalty(params, ctx), expected_value)
    gradient = prox.penalty_gradient(params, ctx)
    for name, o in offset.items():
        torch.testing.assert_close(gradient[name], mu * o)
    doubled = {n: ctx.global_params[n] + 2 * o for n, o in offset.items()}
    torch.testing.assert_close(prox.penalty(doubled, ctx), 4 * expected_value)
    for name, g in prox.penalty_gradient(doubled, ctx).items():
        torch.testing.assert_close(g, 2 * gradient[name])


class _UnsquaredProx(FedProx):
    """The pitfall: (mu/2)||w - w_g|| without the square, gradient from autograd."""

    def penalty(self, params, client_ctx):
        return 0.5 * self.mu * torch.sqrt(super().penalty(params, client_ctx) * 2 / self.mu)

    def penalty_gradient(self, params, client_ctx):
        return None


def test_the_linearity_check_rejects_an_unsquared_norm():
    module, ctx = _perturbed()
    wrong = _UnsquaredProx(0.5)
    params = {n: p.detach() for n, p in module.named_parameters()}
    doubled = {n: 2 * p - ctx.global_params[n] for n, p in params.items()}
    once, twice = wrong.gradient(params, ctx), wrong.gradient(doubled, ctx)
    # The unsquared norm's gradient has a fixed length: doubling the offset leaves it unchanged instead of doubled.
    for name in once:
        torch.testing.assert_close(twice[name], once[name])
        assert not torch.allclose(twice[name], 2 * once[name])


def test_gradient_is_not_lost_to_a_detached_term():
    """Catches PFLlib's `.data` bug: a term built from detached tensors adds nothing to the gradient."""
    module, ctx = _perturbed()
    x, y = make_tensors(16)
    mu = 0.3
    injected = _grads_after_hook(FedProx(mu), module, ctx, x, y)
    module.zero_grad()
    wrong = sum(((p.data - ctx.global_params[n]) ** 2).sum() for n, p in module.named_parameters())
    (F.cross_entropy(module(x), y) + mu / 2 * wrong).backward()
    wrong_grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    for name, param in module.named_parameters():
        difference = injected[name] - wrong_grads[name]
        assert difference.abs().sum() > 0, name
        torch.testing.assert_close(difference, mu * (param.detach() - ctx.global_params[name]))


def test_buffers_are_not_penalised():
    module, ctx = _perturbed(batch_norm=True)
    gradient = FedProx(1.0).penalty_gradient(dict(module.named_parameters()), ctx)
    buffers = {n for n, _ in module.named_buffers()}
    assert buffers and not buffers & gradient.keys()


class _FirstStepSpy(FedCallback):
    """Runs after FedProx and records the penalty gradient's norm at every local step."""

    def __init__(self, prox: FedProx) -> None:
        self.prox = prox
        self.norms: list[tuple[int, int, float]] = []

    def on_client_before_optimizer_step(self, trainer, pl_module, step):
        (client_ctx,) = step.contexts
        params = {n: p for n, p in pl_module.named_parameters() if p.requires_grad}
        grads = self.prox.gradient(params, client_ctx)
        total = float(sum(g.abs().sum() for g in grads.values()))
        self.norms.append((client_ctx.round_idx, client_ctx.num_steps, total))


def test_gradient_is_zero_at_the_first_local_step_and_not_after(tmp_path):
    L.seed_everything(0)
    prox = FedProx(1.0)
    spy = _FirstStepSpy(prox)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=[prox, spy])
    trainer.fit(BoringClassifier(momentum=0.5), datamodule=make_datamodule(num_clients=3))
    first = [norm for _, step, norm in spy.norms if step == 0]
    later = [norm for _, step, norm in spy.norms if step > 0]
    assert len(first) == 4 and all(norm == 0.0 for norm in first)
    assert later and all(norm > 0.0 for norm in later)


def _fit(tmp_path, callbacks):
    L.seed_everything(0)
    module = BoringClassifier(momentum=0.9)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, local_epochs=2, callbacks=callbacks)
    trainer.fit(module, datamodule=make_datamodule(num_clients=3))
    return global_weights(module), trainer.federation_state.history


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("fedavg"), [])


def test_mu_zero_is_exactly_fedavg(tmp_path, fedavg_run):
    plain, plain_history = fedavg_run
    zero, zero_history = _fit(tmp_path, [FedProx(0.0)])
    for name, tensor in plain.items():
        assert torch.equal(zero[name], tensor), name
    assert zero_history[-1]["train/fedprox_proximal"] == 0.0
    assert zero_history[-1]["train/loss"] == plain_history[-1]["train/loss"]


def test_task_loss_and_proximal_term_are_logged_separately(tmp_path, fedavg_run):
    plain, _ = fedavg_run
    strong, history = _fit(tmp_path, [FedProx(1.0)])
    assert history[-1]["train/fedprox_proximal"] > 0.0 and history[-1]["train/loss"] > 0.0
    assert any(not torch.equal(strong[n], t) for n, t in plain.items())


@pytest.mark.parametrize("mu", [-0.1, float("nan"), float("inf"), True, "0.1"])
def test_invalid_mu_is_refused_with_the_argument_named(mu):
    with pytest.raises(ValueError, match="`mu`"):
        FedProx(mu)
