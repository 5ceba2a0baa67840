import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule, make_tensors

from lightning_fed import ClientContext, ClientStateStore, ParameterPenalty
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.hooks import GroupStep


class Prox(ParameterPenalty):
    """(mu/2)||w - w_g||^2, with an optional closed form."""

    def __init__(self, mu: float, closed_form: bool = True, log_every_n_steps: int = 1) -> None:
        super().__init__("prox", log_every_n_steps)
        self.mu, self.closed_form = mu, closed_form

    def penalty(self, params, ctx):
        return 0.5 * self.mu * sum(((p - ctx.global_params[n]) ** 2).sum() for n, p in params.items())

    def penalty_gradient(self, params, ctx):
        if not self.closed_form:
            return None
        return {n: self.mu * (p.detach() - ctx.global_params[n]) for n, p in params.items()}


def _context(module) -> ClientContext:
    global_params = {n: t.detach().clone() for n, t in module.state_dict().items()}
    return ClientContext(0, 0, global_params, global_params, 10, ClientStateStore())


def _injected_grads(penalty: ParameterPenalty, module, ctx, x, y) -> dict[str, torch.Tensor]:
    module.zero_grad()
    F.cross_entropy(module(x), y).backward()
    with buffered_logging(module, LogBuffer()):
        penalty.on_client_before_optimizer_step(None, module, GroupStep.for_client(module, ctx, None))
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def test_injected_gradient_equals_autograd_of_the_documented_loss():
    torch.manual_seed(0)
    module = BoringClassifier()
    ctx = _context(module)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))  # w != w_g, so the penalty gradient is non-zero
    x, y = make_tensors(16)
    for closed_form in (True, False):
        injected = _injected_grads(Prox(0.3, closed_form), module, ctx, x, y)
        module.zero_grad()
        params = dict(module.named_parameters())
        loss = F.cross_entropy(module(x), y) + 0.15 * sum(
            ((p - ctx.global_params[n]) ** 2).sum() for n, p in params.items()
        )
        loss.backward()
        for name, param in params.items():
            torch.testing.assert_close(injected[name], param.grad)
        penalty_only = {n: injected[n] - g for n, g in _plain_grads(module, x, y).items()}
        assert all(g.abs().sum() > 0 for g in penalty_only.values())


def _plain_grads(module, x, y) -> dict[str, torch.Tensor]:
    module.zero_grad()
    F.cross_entropy(module(x), y).backward()
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def _fit(tmp_path, callbacks) -> tuple[dict[str, torch.Tensor], list[dict]]:
    L.seed_everything(0)
    module = BoringClassifier(momentum=0.5)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, local_epochs=2, callbacks=callbacks)
    trainer.fit(module, datamodule=make_datamodule(num_clients=3))
    return global_weights(module), trainer.federation_state.history


def test_zero_penalty_is_exactly_fedavg_and_the_value_is_logged(tmp_path):
    plain, _ = _fit(tmp_path, [])
    zero, history = _fit(tmp_path, [Prox(0.0)])
    for name, tensor in plain.items():
        assert torch.equal(zero[name], tensor), name
    assert history[-1]["train/prox"] == 0.0
    strong, strong_history = _fit(tmp_path, [Prox(5.0)])
    assert strong_history[-1]["train/prox"] > 0.0
    assert any(not torch.equal(strong[n], t) for n, t in plain.items())


def test_a_penalty_without_penalty_cannot_be_built():
    class NoPenalty(ParameterPenalty):
        pass

    with pytest.raises(TypeError, match="abstract.*penalty"):
        NoPenalty("none")
    assert Prox(1.0).log_name == "prox"  # a complete subclass builds


@pytest.mark.parametrize("value", [0, 1.5, True])
def test_log_every_n_steps_is_checked_with_the_argument_named(value):
    with pytest.raises(ValueError, match=rf"`log_every_n_steps` must be an integer >= 1; got {value!r}\."):
        Prox(1.0, log_every_n_steps=value)
