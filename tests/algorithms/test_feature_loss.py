import copy

import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule

from lightning_fed import FedCallback
from lightning_fed.callbacks import FeatureLossTerm, FeatureMixin
from lightning_fed.utilities.seeding import derive_seed

LAM = 0.7
SEED = 5


class SquaredFeatures(FeatureLossTerm):
    """lam * mean(phi^2) on the hooked layer's output."""

    def __init__(self, feature_layer="net.1", lam=LAM, log_name="feat_sq") -> None:
        super().__init__(feature_layer, log_name)
        self.lam = lam

    def loss_term(self, features, client_ctx, batch):
        return self.lam * (features**2).mean()


class FeatureClassifier(BoringClassifier):
    def features(self, x):
        return self.net[:2](x)


class HookCounter(FedCallback):
    """Counts the forward hooks on the layer at each federated hook (runs after the loss term)."""

    def __init__(self, term: FeatureLossTerm, layer: str = "net.1") -> None:
        self.term, self.layer, self.seen = term, layer, []

    def _count(self, pl_module, where):
        self.seen.append((where, len(pl_module.get_submodule(self.layer)._forward_hooks), self.term._features is None))

    def on_client_start(self, trainer, pl_module, client_ctx):
        self._count(pl_module, "start")

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        self._count(pl_module, "end")

    def on_client_evaluate_start(self, trainer, pl_module, client_ctx):
        self._count(pl_module, "evaluate")


def _one_step_fit(tmp_path, module, term):
    dm = make_datamodule(num_clients=1)
    trainer = fast_trainer(tmp_path, num_rounds=1, clients_per_round=1, local_steps=1, seed=SEED, callbacks=[term])
    trainer.fit(module, datamodule=dm)
    x, y = next(iter(dm.client_dataloader(0, seed=derive_seed(SEED, "data", 0, 0))))
    return trainer, x, y


def _reference_step(module, x, y):
    """One plain SGD step on CE + lam * mean(phi^2), phi = output of net.1 (ReLU); returns (params, term value)."""
    module.zero_grad()
    phi = module.net[:2](x)
    term = LAM * (phi**2).mean()
    (F.cross_entropy(module.net[2:](phi), y) + term).backward()
    with torch.no_grad():
        for p in module.parameters():
            p.sub_(module.lr * p.grad)
    return global_weights(module), term.item()


@pytest.mark.parametrize("hooked", [True, False], ids=["hook", "feature_mixin"])
def test_one_step_equals_autograd_of_loss_plus_feature_term_and_value_is_logged(tmp_path, hooked):
    torch.manual_seed(0)
    module = FeatureClassifier(lr=0.1)
    reference = copy.deepcopy(module)
    term = SquaredFeatures("net.1" if hooked else None)
    trainer, x, y = _one_step_fit(tmp_path, module, term)
    expected, value = _reference_step(reference, x, y)
    for name, tensor in global_weights(module).items():
        torch.testing.assert_close(tensor, expected[name], msg=name)
    history = trainer.federation_state.history
    assert history[-1]["train/feat_sq"] == pytest.approx(value, rel=1e-5)
    assert value > 0


def test_feature_term_changes_the_update(tmp_path):
    torch.manual_seed(0)
    base = BoringClassifier(lr=0.1)
    with_term, without = copy.deepcopy(base), copy.deepcopy(base)
    _one_step_fit(tmp_path, with_term, SquaredFeatures(lam=LAM))
    _one_step_fit(tmp_path, without, SquaredFeatures(lam=0.0))
    assert not torch.equal(global_weights(with_term)["net.0.weight"], global_weights(without)["net.0.weight"])
    # The last layer is downstream of the hooked ReLU, so the term leaves its gradient unchanged.
    torch.testing.assert_close(global_weights(with_term)["net.3.weight"], global_weights(without)["net.3.weight"])


def test_hook_lives_only_while_a_client_trains_and_evaluation_does_not_capture(tmp_path):
    term = SquaredFeatures()
    counter = HookCounter(term)
    module = BoringClassifier()
    dm = make_datamodule(num_clients=3, val_fraction=0.1)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=[term, counter])
    trainer.fit(module, datamodule=dm)
    assert [s for s in counter.seen if s[0] == "start"] == [("start", 1, True)] * 4
    assert [s for s in counter.seen if s[0] == "end"] == [("end", 0, True)] * 4
    assert [s for s in counter.seen if s[0] == "evaluate"] == [("evaluate", 0, True)] * 6
    assert len(module.net[1]._forward_hooks) == 0
    assert term._features is None
    # Even while registered, an eval-mode or no-grad forward leaves the capture alone.
    term.on_client_start(trainer, module, None)
    module.eval()
    module(torch.randn(4, 8))
    module.train()
    with torch.no_grad():
        module(torch.randn(4, 8))
    assert term._features is None
    module(torch.randn(4, 8))
    assert term._features is not None
    term.on_client_end(trainer, module, None, None)
    assert len(module.net[1]._forward_hooks) == 0 and term._features is None


def test_hook_is_removed_for_rejected_clients_and_when_training_raises(tmp_path):
    class PoisonAll(FedCallback):
        def on_client_start(self, trainer, pl_module, client_ctx):
            pl_module.poison = True

    term = SquaredFeatures()
    module = BoringClassifier()
    trainer = fast_trainer(tmp_path, num_rounds=1, clients_per_round=2, callbacks=[term, PoisonAll()])
    trainer.fit(module, datamodule=make_datamodule(num_clients=2))
    assert trainer.federation_state.rejected_total == 2  # on_client_end never ran
    assert len(module.net[1]._forward_hooks) == 0

    class Boom(BoringClassifier):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    term, module = SquaredFeatures(), Boom()
    with pytest.raises(RuntimeError, match="boom"):
        fast_trainer(tmp_path, num_rounds=1, callbacks=[term]).fit(module, datamodule=make_datamodule(num_clients=2))
    assert len(module.net[1]._forward_hooks) == 0


def test_unknown_layer_name_is_a_clear_error(tmp_path):
    trainer = fast_trainer(tmp_path, num_rounds=1, callbacks=[SquaredFeatures("net.fc9")])
    with pytest.raises(ValueError, match=r"feature_layer='net.fc9'.*BoringClassifier.*'net\.0'.*'net\.1'"):
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=2))


def test_feature_layer_none_needs_a_features_method(tmp_path):
    assert isinstance(FeatureClassifier(), FeatureMixin) and not isinstance(BoringClassifier(), FeatureMixin)
    trainer = fast_trainer(tmp_path, num_rounds=1, callbacks=[SquaredFeatures(None)])
    with pytest.raises(TypeError, match="must define `features\\(x\\)`"):
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=2))


def test_a_feature_term_without_loss_term_cannot_be_built():
    class NoTerm(FeatureLossTerm):
        pass

    with pytest.raises(TypeError, match="abstract.*loss_term"):
        NoTerm("net.1", "none")


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"feature_layer": 1}, "feature_layer"), ({"log_name": None}, "log_name")]
)
def test_constructor_arguments_are_checked_with_the_argument_named(kwargs, name):
    with pytest.raises(ValueError, match=rf"`{name}` must be"):
        SquaredFeatures(**kwargs)
