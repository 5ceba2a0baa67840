import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, MetricModule, fast_trainer, global_weights, make_datamodule
from helpers.resume import assert_resume_bit_identical
from torch.func import functional_call

from lightning_fed import ClientContext, FedCallback
from lightning_fed.callbacks import APFL

LR = 0.1


class BatchRecorder(FedCallback):
    """Records every training batch and every client's final local model."""

    def __init__(self) -> None:
        self.batches, self.local_models = [], {}

    def client_loss(self, trainer, pl_module, ctx, batch, batch_idx):
        self.batches.append(batch)
        return

    def on_client_end(self, trainer, pl_module, ctx, update):
        self.local_models[ctx.client_id] = {n: t.clone() for n, t in update.params.items()}


def _reference(w0: dict, batches: list, alpha0: float, accumulate: int) -> tuple[dict, dict, float]:
    """The paper's recurrence with every gradient from autograd: grad_v and d/d alpha of f(alpha v + (1 - alpha) w)."""
    module = BoringClassifier()

    def loss_at(params, batch):
        return F.cross_entropy(functional_call(module, params, (batch[0],)), batch[1]) / accumulate

    w = {n: t.clone() for n, t in w0.items()}
    v = {n: t.clone() for n, t in w0.items()}
    alpha = torch.tensor(alpha0, dtype=torch.float64)
    for start in range(0, len(batches), accumulate):
        group = batches[start : start + accumulate]
        w_leaves = {n: t.clone().requires_grad_(True) for n, t in w.items()}
        v_leaves = {n: t.clone().requires_grad_(True) for n, t in v.items()}
        a_leaf = alpha.clone().requires_grad_(True)
        w_loss = sum(loss_at(w_leaves, b) for b in group)
        mixed = {n: a_leaf * v_leaves[n] + (1 - a_leaf) * w[n] for n in v}
        v_loss = sum(loss_at(mixed, b) for b in group)
        grad_w = torch.autograd.grad(w_loss, list(w_leaves.values()))
        *grad_v, grad_a = torch.autograd.grad(v_loss, [*v_leaves.values(), a_leaf])
        w = {n: w[n] - LR * g for n, g in zip(w, grad_w)}
        v = {n: v[n] - LR * g for n, g in zip(v, grad_v)}
        alpha = (alpha - LR * grad_a).clamp(0.0, 1.0)
    return w, v, float(alpha)


def _one_client_run(tmp_path, accumulate: int, num_samples: int = 400, **schedule):
    """One client, one round of APFL(alpha=0.3); returns the module, the recorded batches, the stored entry and the
    paper's recurrence on those batches."""
    L.seed_everything(0)
    module = BoringClassifier(lr=LR)
    w0 = {n: p.detach().clone() for n, p in module.named_parameters()}
    recorder, apfl = BatchRecorder(), APFL(alpha=0.3)
    trainer = fast_trainer(
        tmp_path,
        num_rounds=1,
        clients_per_round=1,
        accumulate_grad_batches=accumulate,
        callbacks=[recorder, apfl],
        **schedule,
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=1, num_samples=num_samples))
    reference = _reference(w0, recorder.batches, 0.3, accumulate)
    return module, recorder.batches, trainer.federation_state.store.get("apfl", 0), reference


def _assert_matches_recurrence(module, entry, reference) -> None:
    w, v, alpha = reference
    assert entry["alpha"].item() == pytest.approx(alpha, rel=1e-5, abs=1e-7)
    for name, tensor in module.named_parameters():
        torch.testing.assert_close(tensor.detach(), w[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(entry["v"][name], v[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_one_client_follows_the_papers_recurrence_with_autograd_gradients(tmp_path, accumulate):
    module, batches, entry, reference = _one_client_run(tmp_path, accumulate, local_steps=4)
    w, _, alpha = reference
    assert len(batches) == 4 * accumulate
    assert alpha != 0.3
    _assert_matches_recurrence(module, entry, reference)
    assert any(not torch.allclose(entry["v"][n], w[n]) for n in w), "v must have moved away from w"


def test_side_pass_follows_the_recurrence_when_an_epoch_ends_mid_accumulation(tmp_path):
    # The epoch's last step holds fewer than `accumulate` batches; the side pass must scale them as the client's
    # step does (each batch's loss over `accumulate`, as Lightning does), or v and alpha drift from the recurrence.
    module, batches, entry, reference = _one_client_run(tmp_path, 4, num_samples=120, local_epochs=1)
    assert len(batches) % 4 != 0
    _assert_matches_recurrence(module, entry, reference)


def _fit(tmp_path, callbacks, module_cls=MetricModule, rounds=2):
    L.seed_everything(0)
    module = module_cls(lr=LR, batch_norm=True, dropout=0.2, momentum=0.9)
    trainer = fast_trainer(tmp_path, num_rounds=rounds, clients_per_round=2, local_epochs=1, callbacks=callbacks)
    trainer.fit(module, datamodule=make_datamodule(num_clients=3))
    return trainer, module


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("fedavg"), [])


def test_global_model_and_train_metrics_are_exactly_fedavgs(tmp_path, fedavg_run):
    plain_trainer, plain = fedavg_run
    apfl = APFL(alpha=0.5)
    trainer, module = _fit(tmp_path, [apfl])
    for name, tensor in global_weights(plain).items():
        assert torch.equal(global_weights(module)[name], tensor), name
    for plain_round, apfl_round in zip(plain_trainer.federation_state.history, trainer.federation_state.history):
        assert apfl_round["train/loss"] == plain_round["train/loss"]
        assert apfl_round["train/metric_mean"] == plain_round["train/metric_mean"]
        assert apfl_round["train/apfl_personal_loss"] > 0.0
        assert 0.0 <= apfl_round["train/apfl_alpha"] <= 1.0
    last = trainer.federation_state.history[-1]
    assert "personal/test_acc_mean" in last and "client/test_acc_mean" not in last
    # The personalised models differ from the global one, so their accuracies are not the global model's.
    assert trainer.last_round_result.client_results != plain_trainer.last_round_result.client_results
    alphas = [apfl.mixing_weight(trainer, cid) for cid in range(3)]
    assert all(a is None or 0.0 <= a <= 1.0 for a in alphas) and any(a is not None and a != 0.5 for a in alphas)


def test_alpha_stays_fixed_without_learning_while_v_trains(tmp_path):
    apfl = APFL(alpha=0.7, learn_alpha=False)
    trainer, module = _fit(tmp_path, [apfl], module_cls=BoringClassifier)
    store = trainer.federation_state.store
    assert store.clients("apfl")
    for _, entry in store.items("apfl"):
        assert entry["alpha"].item() == 0.7
        assert any(not torch.equal(entry["v"][n], entry["w"][n]) for n in entry["v"])


def _evaluation_params(apfl, trainer, module, client_id):
    live = {n: t.detach().clone() for n, t in module.state_dict().items()}
    ctx = ClientContext(client_id, 1, live, live, 1, trainer.federation_state.store)
    return apfl.evaluation_params(trainer, module, ctx)


def test_alpha_zero_evaluates_exactly_the_clients_local_model(tmp_path):
    recorder, apfl = BatchRecorder(), APFL(alpha=0.0, learn_alpha=False)
    trainer, module = _fit(tmp_path, [recorder, apfl], module_cls=BoringClassifier)
    assert recorder.local_models
    parameter_names = {name for name, _ in module.named_parameters()}
    for cid, local in recorder.local_models.items():
        evaluated = _evaluation_params(apfl, trainer, module, cid)
        buffers = trainer.federation_state.store.get("apfl", cid)["buffers"]
        for name, tensor in local.items():
            # Parameters are mixed; BatchNorm statistics are v-bar's own, tracked by its forward passes.
            expected = tensor if name in parameter_names else buffers[name]
            assert torch.equal(evaluated[name], expected), (cid, name)


def test_alpha_zero_with_global_mixing_evaluates_exactly_the_global_model(tmp_path, fedavg_run):
    apfl = APFL(alpha=0.0, learn_alpha=False, evaluate_with="global")
    trainer, module = _fit(tmp_path, [apfl], module_cls=BoringClassifier)
    for cid in trainer.federation_state.store.clients("apfl"):
        evaluated = _evaluation_params(apfl, trainer, module, cid)
        for name, tensor in module.named_parameters():
            assert torch.equal(evaluated[name], tensor.detach()), (cid, name)


def test_a_client_that_never_trained_is_evaluated_with_the_global_model(tmp_path):
    apfl = APFL()
    trainer, module = _fit(tmp_path, [apfl], module_cls=BoringClassifier, rounds=1)
    untrained = [cid for cid in range(3) if not trainer.federation_state.store.has("apfl", cid)]
    assert len(untrained) == 1
    assert _evaluation_params(apfl, trainer, module, untrained[0]) is None


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    result = assert_resume_bit_identical(tmp_path, "--callback", 'lightning_fed.callbacks.APFL={"alpha": 0.5}')
    assert result["store"]["apfl"], "APFL kept no per-client state"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"learn_alpha": "yes"}, "learn_alpha"),
        ({"evaluate_with": "mean"}, "evaluate_with"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        APFL(**kwargs)
