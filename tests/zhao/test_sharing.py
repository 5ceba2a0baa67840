"""Zhao et al.'s data sharing (§4.2): the global set G, the clients' α shares, and the warm-up model."""

import copy

import pytest
import torch
from helpers.boring import BoringClassifier, FedCallback, fast_trainer, global_weights, make_datamodule
from helpers.reference_sgd import reference_epoch

from lightning_fed.callbacks.warmup import SharedDataWarmup
from lightning_fed.datamodules import DataSharing, IidPartitioner, ShardPartitioner
from lightning_fed.datamodules.sharing import global_set_size
from lightning_fed.utilities.seeding import derive_seed, seed_torch


def _datamodule(beta=0.1, alpha=0.5, warmup_epochs=2, partitioner=None, seed=0, **kwargs):
    sharing = None if beta is None else DataSharing(beta=beta, alpha=alpha, warmup_epochs=warmup_epochs)
    dm = make_datamodule(num_clients=4, num_samples=800, partitioner=partitioner, sharing=sharing, seed=seed, **kwargs)
    dm.setup()
    return dm


def test_global_set_is_disjoint_from_clients_and_class_balanced():
    dm = _datamodule(beta=0.1, val_fraction=0.1)
    split = dm._split
    client_data = torch.cat([split.clients.flat, split.client_tests.flat, split.val])
    assert not torch.isin(split.shared, client_data).any()
    counts = torch.bincount(split.labels[split.shared], minlength=4)
    assert int(counts.max() - counts.min()) <= 1
    # beta = |G| / |D|, D = the clients' data (training and test splits).
    clients_total = split.clients.flat.numel() + split.client_tests.flat.numel()
    assert split.shared.numel() == global_set_size(0.1, clients_total + split.shared.numel())
    assert split.shared.numel() / clients_total == pytest.approx(0.1, abs=2 / clients_total)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 1.0])
def test_shares_have_round_alpha_g_examples_of_g_and_are_counted(alpha):
    dm = _datamodule(alpha=alpha)
    split = dm._split
    size = int(alpha * split.shared.numel() + 0.5)
    for client_id in range(4):
        share = split.shares[client_id]
        assert share.numel() == size and share.unique().numel() == size
        assert torch.isin(share, split.shared).all()
        local = split.clients[client_id].numel()
        assert dm.client_num_samples(client_id) == local + size
        loader = dm.client_dataloader(client_id, seed=1)
        assert sum(len(batch[1]) for batch in loader) == local + size


def test_shares_are_deterministic_per_seed_and_enter_the_fingerprint():
    first, again, other = _datamodule(seed=0), _datamodule(seed=0), _datamodule(seed=1)
    assert torch.equal(first._split.shares.flat, again._split.shares.flat)
    assert not torch.equal(first._split.shares.flat, other._split.shares.flat)
    assert first.state_dict() == again.state_dict()
    changed = make_datamodule(num_clients=4, num_samples=800, sharing=DataSharing(beta=0.1, alpha=0.25))
    changed.load_state_dict(first.state_dict())
    with pytest.raises(ValueError, match="sharing"):
        changed.setup()


def test_sharing_lowers_the_emd_of_a_one_class_split():
    dm = _datamodule(beta=0.1, alpha=1.0, partitioner=ShardPartitioner(4, 1, seed=0))
    stats = dm.sharing_statistics()
    assert stats["sharing/emd_before"] == pytest.approx(float(dm.client_emd().mean()), abs=0.05)
    assert stats["sharing/emd_before"] > 1.2  # 4 roughly balanced classes: a pure client has 1.5
    assert stats["sharing/emd_after"] < stats["sharing/emd_before"]
    assert stats["sharing/global_set_size"] == dm._split.shared.numel()


@pytest.mark.parametrize("settings", [dict(beta=1.0), dict(beta=-0.1), dict(alpha=1.5), dict(warmup_epochs=-1)])
def test_bad_settings_name_the_field(settings):
    name = next(iter(settings))
    with pytest.raises(ValueError, match=f"sharing.{name}"):
        DataSharing(**settings)


class _InitialGlobal(FedCallback):
    def on_round_start(self, trainer, pl_module, round_ctx):
        if round_ctx.round_idx == 0:
            self.params = {name: tensor.clone() for name, tensor in round_ctx.global_params.items()}


def _manual_warmup(module, dm, seed, epochs):
    optimizer = module.configure_optimizers()
    module.train()
    for epoch in range(epochs):
        loader = dm.shared_dataloader(seed=derive_seed(seed, "warmup", epoch))
        seed_torch(derive_seed(seed, "warmup", "torch", epoch))
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(module(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def test_warmup_model_is_the_initial_global_model(tmp_path):
    dm = _datamodule(warmup_epochs=3, partitioner=IidPartitioner(4, seed=0))
    torch.manual_seed(0)
    module = BoringClassifier(lr=0.1, dropout=0.2)
    initial = global_weights(module)
    manual = copy.deepcopy(module)
    _manual_warmup(manual, dm, seed=7, epochs=3)
    recorder = _InitialGlobal()
    trainer = fast_trainer(tmp_path, num_rounds=1, seed=7, callbacks=[SharedDataWarmup(), recorder])
    trainer.fit(module, datamodule=dm)
    for name, tensor in manual.state_dict().items():
        assert torch.allclose(recorder.params[name], tensor, atol=1e-6), name
    assert any(not torch.equal(recorder.params[name], initial[name]) for name in initial)
    metrics = trainer.federation_state.history[0]
    assert metrics["sharing/global_set_size"] == dm._split.shared.numel()
    assert "warmup/train_loss" in metrics and "sharing/emd_after" in metrics


class _CountingWarmup(SharedDataWarmup):
    calls = 0

    def _train(self, *args, **kwargs):
        type(self).calls += 1
        return super()._train(*args, **kwargs)


def test_resume_skips_the_warmup(tmp_path):
    dm = _datamodule()
    settings = dict(seed=0, enable_checkpointing=True)
    first = fast_trainer(tmp_path, num_rounds=1, callbacks=[_CountingWarmup()], **settings)
    first.fit(BoringClassifier(), datamodule=dm)
    assert _CountingWarmup.calls == 1
    resumed = fast_trainer(tmp_path, num_rounds=2, callbacks=[_CountingWarmup()], **settings)
    resumed.fit(BoringClassifier(), datamodule=_datamodule(), ckpt_path="last")
    assert resumed.federation_state.completed_rounds == 2
    assert _CountingWarmup.calls == 1


def test_missing_warmup_callback_warns(tmp_path):
    with pytest.warns(UserWarning, match="SharedDataWarmup"):
        fast_trainer(tmp_path, num_rounds=1).fit(BoringClassifier(), datamodule=_datamodule(warmup_epochs=1))


def test_beta_zero_shares_nothing_and_skips_the_warmup(tmp_path):
    dm = _datamodule(beta=0.0, warmup_epochs=2)
    assert dm._split.shared.numel() == 0 and dm._split.shares.flat.numel() == 0
    torch.manual_seed(0)
    module = BoringClassifier()
    recorder = _InitialGlobal()
    initial = global_weights(module)
    trainer = fast_trainer(tmp_path, num_rounds=1, callbacks=[SharedDataWarmup(), recorder])
    trainer.fit(module, datamodule=dm)
    assert all(torch.equal(recorder.params[name], tensor) for name, tensor in initial.items())
    assert trainer.federation_state.history[0]["sharing/global_set_size"] == 0


def test_warmup_takes_a_clients_steps_with_clipping_and_accumulation(tmp_path):
    # G holds 80 examples: 5 batches of 16, so accumulating 2 also ends each epoch with a step of one batch.
    dm = _datamodule(warmup_epochs=2, partitioner=IidPartitioner(4, seed=0))
    torch.manual_seed(0)
    module = BoringClassifier(lr=0.5, dropout=0.2)
    expected, unclipped = copy.deepcopy(module), copy.deepcopy(module)
    for reference, clip, accumulate in ((expected, 0.05, 2), (unclipped, None, 1)):
        optimizer = reference.configure_optimizers()
        for epoch in range(2):
            loader = dm.shared_dataloader(seed=derive_seed(7, "warmup", epoch))
            seed_torch(derive_seed(7, "warmup", "torch", epoch))
            reference_epoch(reference, optimizer, loader, clip=clip, accumulate=accumulate)
    recorder = _InitialGlobal()
    trainer = fast_trainer(
        tmp_path,
        num_rounds=1,
        seed=7,
        gradient_clip_val=0.05,
        accumulate_grad_batches=2,
        callbacks=[SharedDataWarmup(), recorder],
    )
    trainer.fit(module, datamodule=dm)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(recorder.params[name], tensor), name
    assert any(not torch.allclose(expected.state_dict()[n], t) for n, t in unclipped.state_dict().items())


class _BatchCounter(FedCallback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1


def test_warmup_calls_no_batch_hooks_and_leaves_the_global_step(tmp_path):
    counter = _BatchCounter()
    trainer = fast_trainer(tmp_path, num_rounds=1, callbacks=[SharedDataWarmup(), counter])
    trainer.fit(BoringClassifier(), datamodule=_datamodule(warmup_epochs=2))
    assert "warmup/train_loss" in trainer.federation_state.history[0]
    # Only the clients' steps count: one batch per step without accumulation.
    assert counter.batches == trainer.global_step > 0


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"epochs": -1}, "epochs"), ({"epochs": 1.5}, "epochs"), ({"lr": 0}, "lr")]
)
def test_bad_warmup_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}` must be"):
        SharedDataWarmup(**kwargs)
