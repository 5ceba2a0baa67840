"""The one local-training primitive: hook dispatch by Lightning's ``is_overridden``, ``step_gradient`` and
``isolated_pass``."""

import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, HookRecorder, OneCycleClassifier, fast_trainer, make_datamodule
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, Timer, TQDMProgressBar
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.model_helpers import is_overridden
from torchmetrics import MeanMetric

from lightning_fed.aggregators import FedAvg
from lightning_fed.callbacks import APFL, FedProx, Scaffold, WeightDivergence
from lightning_fed.engine.local_training import LocalTrainer, RoundSchedulers
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.engine.training_step import (
    _BATCH_HOOKS,
    _TRANSFER_HOOKS,
    isolated_pass,
    step_context,
    step_gradient,
)
from lightning_fed.hooks import FedCallback, GroupStep


def _by_identity(obj, base, hook):
    """The check LocalTrainer made for Lightning's hooks before it used Lightning's is_overridden."""
    return getattr(type(obj), hook, None) is not getattr(base, hook, None)


def _federated_by_identity(obj, hook):
    """The check it made for federated hooks, on callbacks and on the aggregator (which is no FedCallback)."""
    method = getattr(type(obj), hook, None)
    return method is not None and method is not getattr(FedCallback, hook)


class _Hooked(BoringClassifier):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        pass

    def on_before_batch_transfer(self, batch, dataloader_idx):
        return batch


class _Inherited(_Hooked):
    pass


class _BatchCallback(Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        pass


def _callbacks():
    return [
        ModelCheckpoint(),
        EarlyStopping(monitor="val_loss"),
        LearningRateMonitor(),
        Timer(),
        TQDMProgressBar(),
        HookRecorder(),
        _BatchCallback(),
        APFL(),
        FedProx(mu=0.1),
        Scaffold(),
        WeightDivergence(),
    ]


def test_is_overridden_answers_as_the_identity_check_did():
    for callback in _callbacks():
        for hook in _BATCH_HOOKS:
            assert is_overridden(hook, callback, Callback) == _by_identity(callback, Callback, hook), (callback, hook)
    for module in (BoringClassifier(), _Hooked(), _Inherited()):
        for hook in (*_BATCH_HOOKS, *_TRANSFER_HOOKS):
            expected = _by_identity(module, LightningModule, hook)
            assert is_overridden(hook, module, LightningModule) == expected, (module, hook)
    for obj in [*_callbacks(), FedAvg()]:
        for hook in ("client_loss", "on_client_before_optimizer_step"):
            assert is_overridden(hook, obj, FedCallback) == _federated_by_identity(obj, hook), (obj, hook)


def _trainer(callbacks=(), accumulate=1):
    strategy = SimpleNamespace(precision_plugin=Precision(), root_device=torch.device("cpu"))
    return SimpleNamespace(
        callbacks=list(callbacks), aggregator=FedAvg(), strategy=strategy, accumulate_grad_batches=accumulate
    )


def test_local_trainer_dispatches_to_overriders_only_and_not_at_all_without_hooks():
    batch, prox, _, apfl = callbacks = [_BatchCallback(), FedProx(mu=0.1), HookRecorder(), APFL()]
    local = LocalTrainer(_trainer(callbacks), _Hooked())
    assert local.hooks.lightning_targets("on_before_optimizer_step") == ([batch], False)
    assert local.hooks.lightning_targets("on_train_batch_end") == ([], True)
    assert not local.hooks.lightning_targets("on_train_batch_start")[1]
    assert local._loss_terms == [apfl] and local._grad_hooks == [prox, apfl]
    assert local._needs_transfer  # the module's own transfer hook must run, even on the CPU
    for mode in ("plain", "central"):
        # Beside a round no federated hook runs; beside the federation no hook at all.
        other = LocalTrainer(_trainer(callbacks), _Hooked(), mode=mode)
        assert other._loss_terms == other._grad_hooks == other._step_hooks == [] and other.steps is None
        expected = ([batch], False) if mode == "plain" else ([], False)
        assert other.hooks.lightning_targets("on_before_optimizer_step") == expected
        assert other.hooks.lightning_targets("on_train_batch_end")[1] == (mode == "plain")


def _batches(count):
    generator = torch.Generator().manual_seed(0)
    return [
        ((torch.randn(5, 8, generator=generator), torch.randint(0, 4, (5,), generator=generator)), i)
        for i in range(count)
    ]


def test_step_gradient_is_the_accumulated_steps_gradient_and_leaves_grad_alone():
    torch.manual_seed(0)
    module = BoringClassifier()
    params = dict(module.named_parameters())
    for p in params.values():
        p.grad = torch.full_like(p, 7.0)  # the local model's own gradient, mid-step
    batches = _batches(3)
    with buffered_logging(module, LogBuffer()):
        grads, loss = step_gradient(_trainer(accumulate=3), module, batches, params)
    losses = [F.cross_entropy(module(x), y) for (x, y), _ in batches]
    expected = torch.autograd.grad(sum(losses) / 3, list(params.values()))
    for (name, grad), reference in zip(grads.items(), expected):
        torch.testing.assert_close(grad, reference, msg=name)
    assert loss.item() == pytest.approx((sum(losses) / 3).item(), rel=1e-6)
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in params.values())


def test_step_gradient_skips_batches_whose_step_returns_none():
    class Skipping(BoringClassifier):
        def training_step(self, batch, batch_idx):
            return None

    module = Skipping()
    grads, loss = step_gradient(_trainer(), module, _batches(2), dict(module.named_parameters()))
    assert loss is None and all(not g.any() for g in grads.values())


def test_isolated_pass_restores_rng_metrics_and_logging():
    module = BoringClassifier()
    module.metric = MeanMetric()
    module.metric.update(torch.tensor(1.0))
    outer = LogBuffer()
    with buffered_logging(module, outer):
        torch.manual_seed(3)
        with isolated_pass(module):
            torch.rand(5)
            module.metric.update(torch.tensor(100.0))
            module.log("inside", 1.0)
        draw = torch.rand(1)
        module.log("outside", 2.0)
    torch.manual_seed(3)
    assert torch.equal(draw, torch.rand(1))
    assert module.metric.compute().item() == 1.0
    assert outer.compute() == {"outside": 2.0}


def test_a_client_alone_is_a_group_of_one_whose_views_reach_the_live_module():
    module = BoringClassifier()
    optimizer = module.configure_optimizers()
    ctx = SimpleNamespace(num_steps=0)
    step = GroupStep.for_client(module, ctx, optimizer)
    params = dict(module.named_parameters())
    assert step.contexts == [ctx] and step.everyone and step.optimizer is optimizer
    assert list(step.params) == list(step.grads) == list(params)
    first, other = list(params)[:2]
    assert step.params[first].shape == (1, *params[first].shape)
    before = params[first].detach().clone()
    step.params[first].sub_(1.0)
    torch.testing.assert_close(params[first].detach(), before - 1.0, rtol=0, atol=0)
    # Reading a gradient backward left as None creates the zero .grad that the edit must reach; unread ones stay None.
    step.grads[first].add_(2.0)
    assert torch.equal(params[first].grad, torch.full_like(params[first], 2.0))
    assert all(p.grad is None for name, p in params.items() if name != first)
    params[other].grad = torch.ones_like(params[other])
    step.grads[other].mul_(3.0)
    assert torch.equal(params[other].grad, torch.full_like(params[other], 3.0))
    buffer = LogBuffer()
    with buffered_logging(module, buffer):
        step.log(0, "value", torch.tensor(4.0))
    assert buffer.compute() == {"value": 4.0}


class _Counting(FedCallback):
    def on_client_after_optimizer_step(self, trainer, pl_module, step):
        self.steps = getattr(self, "steps", 0) + 1


@pytest.mark.parametrize("stepping", [False, True])
def test_the_group_of_one_view_is_built_once_per_client_and_only_for_per_step_hooks(tmp_path, monkeypatch, stepping):
    built = []
    for_client = GroupStep.for_client.__func__

    def counted(cls, module, ctx, optimizer):
        built.append(ctx.client_id)
        return for_client(cls, module, ctx, optimizer)

    monkeypatch.setattr(GroupStep, "for_client", classmethod(counted))
    callbacks = [_Counting()] if stepping else [HookRecorder()]
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=callbacks)
    trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=3))
    assert len(built) == (4 if stepping else 0)
    if stepping:
        assert callbacks[0].steps == trainer.global_step > 0


class _GroupHook(FedCallback):
    supports_batched_clients = True

    def on_group_before_optimizer_step(self, trainer, pl_module, step):
        pass


class _FourArguments(FedCallback):
    def on_client_after_optimizer_step(self, trainer, pl_module, client_ctx, optimizer):
        pass


@pytest.mark.parametrize(
    ("callback", "message"),
    [
        (
            _GroupHook(),
            "_GroupHook overrides `on_group_before_optimizer_step`, which no longer exists: write the step once as"
            " `on_client_before_optimizer_step(self, trainer, pl_module, step: GroupStep)`",
        ),
        (
            _FourArguments(),
            "_FourArguments.on_client_after_optimizer_step takes (trainer, pl_module, client_ctx, optimizer)",
        ),
    ],
)
def test_a_callback_written_for_the_old_step_hooks_is_refused_at_fit_start(tmp_path, callback, message):
    trainer = fast_trainer(tmp_path, callbacks=[callback])
    with pytest.raises(TypeError, match=re.escape(message)):
        trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    assert trainer.global_step == 0


class _CountingPrecision(Precision):
    """A precision plugin with a forward context of its own (as the mixed-precision ones have autocast)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0

    @contextmanager
    def forward_context(self) -> Iterator[None]:
        self.entered += 1
        yield


class _ZeroGradCounter(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        self.calls += 1


def _plain_pass(trainer, module, steps):
    local = LocalTrainer(trainer, module, mode="plain")
    called = []
    dispatch = local.hooks.call_lightning
    local.hooks.call_lightning = lambda hook, *args: called.append(hook) or dispatch(hook, *args)
    local.fit([batch for batch, _ in _batches(steps)], torch.optim.SGD(module.parameters(), lr=0.1))
    return called


def test_a_step_enters_the_precision_context_only_where_the_plugin_has_one():
    # Lightning's 32-bit plugin: its training-step context does nothing, so a step enters none.
    assert step_context(Precision()) is None
    trainer = _trainer()
    trainer.gradient_clip_val = None
    plugin = trainer.strategy.precision_plugin = _CountingPrecision()
    assert step_context(plugin) is not None
    _plain_pass(trainer, BoringClassifier(), steps=3)
    assert plugin.entered == 3  # once per step, as Lightning enters it


class _BatchEnd(BoringClassifier):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        pass


def test_a_step_dispatches_only_the_batch_hooks_someone_overrides():
    counter = _ZeroGradCounter()
    trainer = _trainer([counter, HookRecorder()])
    trainer.gradient_clip_val = None
    called = _plain_pass(trainer, _BatchEnd(), steps=4)
    # The callback's on_before_zero_grad and the module's on_train_batch_end, at every step; nothing else.
    assert counter.calls == 4
    assert sorted(set(called)) == ["on_before_zero_grad", "on_train_batch_end"] and len(called) == 8


@pytest.mark.parametrize("step_schedule", [False, True])
def test_a_client_steps_the_schedules_only_when_a_step_interval_one_exists(tmp_path, monkeypatch, step_schedule):
    positions = []
    after_step = RoundSchedulers.after_step

    def recorded(self, local_step):
        positions.append(local_step)
        after_step(self, local_step)

    monkeypatch.setattr(RoundSchedulers, "after_step", recorded)
    module = OneCycleClassifier() if step_schedule else BoringClassifier()
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2)
    # 64 examples per client at batch 16: 4 steps each.
    trainer.fit(module, datamodule=make_datamodule(num_clients=2, num_samples=128))
    # With a step schedule, after every local step of every client (1, 2, ... per client); else never.
    assert positions == ([1, 2, 3, 4] * 4 if step_schedule else [])
