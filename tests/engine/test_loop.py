import lightning.pytorch as L
import pytest
import torch
from helpers.boring import BoringClassifier, HookRecorder, fast_trainer, global_weights, make_datamodule

from lightning_fed import ClientDivergedError, FedCallback
from lightning_fed.utilities.seeding import derive_seed


def test_one_client_one_epoch_equals_centralised_lightning_training(tmp_path):
    dm = make_datamodule(num_clients=1)
    L.seed_everything(0)
    federated = BoringClassifier(lr=0.1, momentum=0.9, batch_norm=True)
    centralised = BoringClassifier(lr=0.1, momentum=0.9, batch_norm=True)
    centralised.load_state_dict(federated.state_dict())

    fast_trainer(tmp_path, num_rounds=1, clients_per_round=1, seed=5).fit(federated, datamodule=dm)

    loader = dm.client_dataloader(0, seed=derive_seed(5, "data", 0, 0))
    plain = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path),
    )
    plain.fit(centralised, train_dataloaders=loader)
    for name, tensor in centralised.state_dict().items():
        assert torch.equal(federated.state_dict()[name], tensor), name


def test_hook_order_over_two_rounds_and_two_clients(tmp_path):
    recorder = HookRecorder()
    dm = make_datamodule(num_clients=4, val_fraction=0.1)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, client_eval="sampled", callbacks=[recorder])
    trainer.fit(BoringClassifier(), datamodule=dm)
    expected = []
    for r in range(2):
        a, b = trainer.sampler.sample(r, 4)
        expected += [("on_train_epoch_start", r), ("on_round_start", r)]
        for c in (a, b):
            expected += [("on_client_start", r, c), ("on_client_train_start", r, c), ("on_client_end", r, c)]
        expected += [("on_aggregate", r), ("on_client_evaluate_start", r, a), ("on_client_evaluate_start", r, b)]
        expected += [("on_validation_end", r), ("on_round_end", r), ("on_train_epoch_end", r)]
    assert recorder.calls == expected


class _Poison(FedCallback):
    def __init__(self, client_id: int) -> None:
        self.client_id = client_id

    def on_client_start(self, trainer, pl_module, client_ctx):
        pl_module.poison = client_ctx.client_id == self.client_id


def test_diverging_client_is_rejected_and_does_not_poison_the_global_model(tmp_path):
    dm = make_datamodule(num_clients=3)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=3, callbacks=[_Poison(1)])
    module = BoringClassifier()
    trainer.fit(module, datamodule=dm)
    assert all(torch.isfinite(t).all() for t in global_weights(module).values())
    history = trainer.federation_state.history
    assert [entry["clients/rejected"] for entry in history] == [1.0, 1.0]
    assert trainer.federation_state.rejected_total == 2
    assert all(torch.isfinite(torch.tensor(entry["train/loss"])) for entry in history)


def test_diverging_client_stops_the_run_when_asked(tmp_path):
    dm = make_datamodule(num_clients=3)
    trainer = fast_trainer(tmp_path, clients_per_round=3, callbacks=[_Poison(2)], on_client_divergence="raise")
    with pytest.raises(
        ClientDivergedError,
        match="Client 2's update of round 0 was rejected: it holds NaN.*on_client_divergence='skip'",
    ):
        trainer.fit(BoringClassifier(), datamodule=dm)


class _PoisonOnce(FedCallback):
    """Makes one client's loss NaN in one round only, as a batch of bad data would."""

    def __init__(self, client_id: int, round_idx: int) -> None:
        self.client_id, self.round_idx = client_id, round_idx

    def on_client_start(self, trainer, pl_module, client_ctx):
        pl_module.poison = (client_ctx.client_id, client_ctx.round_idx) == (self.client_id, self.round_idx)


class _WritesBeforeTraining(FedCallback):
    """Writes the store in the hooks that run before the finiteness check, as a stateful algorithm might."""

    def on_client_start(self, trainer, pl_module, client_ctx):
        client_ctx.store.put("early", client_ctx.client_id, {"round": torch.tensor(client_ctx.round_idx)})

    def on_client_train_start(self, trainer, pl_module, client_ctx, dataloader):
        client_ctx.store.pop("seen", client_ctx.client_id)


def test_a_client_that_diverges_once_with_kept_momentum_is_accepted_again(tmp_path):
    dm = make_datamodule(num_clients=3)
    trainer = fast_trainer(
        tmp_path,
        num_rounds=3,
        clients_per_round=3,
        keep_optimizer_state=True,
        callbacks=[_PoisonOnce(client_id=1, round_idx=1)],
    )
    module = BoringClassifier(momentum=0.9)
    trainer.fit(module, datamodule=dm)
    history = trainer.federation_state.history
    # The NaN momentum of round 1 was never kept: client 1 resumes from its round-0 momentum and is accepted.
    assert [entry["clients/rejected"] for entry in history] == [0.0, 1.0, 0.0]
    kept = trainer.federation_state.store.get("optimizer", 1)
    assert kept and all(torch.isfinite(entry["momentum_buffer"]).all() for entry in kept.values())
    assert all(torch.isfinite(t).all() for t in global_weights(module).values())


def test_store_writes_made_before_a_rejected_update_are_undone(tmp_path):
    dm = make_datamodule(num_clients=3)
    trainer = fast_trainer(
        tmp_path, num_rounds=2, clients_per_round=3, callbacks=[_PoisonOnce(2, 1), _WritesBeforeTraining()]
    )
    trainer.federation_state.store.put("seen", 2, 7)
    trainer.fit(BoringClassifier(), datamodule=dm)
    store = trainer.federation_state.store
    # Clients 0 and 1 were accepted in both rounds; client 2's round-1 writes were rolled back to round 0's.
    assert {cid: int(store.get("early", cid)["round"]) for cid in range(3)} == {0: 1, 1: 1, 2: 0}
    assert store.clients("seen") == []


def test_a_run_with_many_rejected_updates_warns_at_its_end(tmp_path):
    from lightning_fed.engine.rejection import rejection_warning, warn_if_many_rejected

    dm = make_datamodule(num_clients=3)
    trainer = fast_trainer(tmp_path, num_rounds=3, clients_per_round=3, callbacks=[_PoisonOnce(0, 2)])
    trainer.fit(BoringClassifier(), datamodule=dm)
    with pytest.warns(UserWarning, match=r"1 of 9 client updates \(11%\) were rejected.*on_client_divergence="):
        warn_if_many_rejected(trainer)
    state = trainer.federation_state
    state.history.append({"clients/sampled": 1.0})  # 1 of 10: not more than 10 %
    assert rejection_warning(state) is None


def test_local_steps_counts_optimizer_steps_and_global_step(tmp_path):
    steps = []

    class Steps(FedCallback):
        def on_client_end(self, trainer, pl_module, client_ctx, update):
            steps.append(update.num_steps)

    dm = make_datamodule(num_clients=2, num_samples=100, batch_size=8)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, local_steps=9, callbacks=[Steps()])
    trainer.fit(BoringClassifier(), datamodule=dm)
    # 9 steps cycle past the end of a 5-batch client loader; global_step counts every client step.
    assert steps == [9, 9, 9, 9]
    assert trainer.global_step == 36


def test_local_epochs_take_every_batch(tmp_path):
    dm = make_datamodule(num_clients=2, num_samples=100, batch_size=8, client_test_fraction=0.2)
    trainer = fast_trainer(tmp_path, num_rounds=1, clients_per_round=2, local_epochs=3)
    trainer.fit(BoringClassifier(), datamodule=dm)
    expected = sum(3 * -(-dm.client_num_samples(c) // 8) for c in range(2))
    assert trainer.global_step == expected


def test_round_metrics_and_summary_are_recorded(tmp_path):
    dm = make_datamodule(num_clients=4)
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, run_dir=str(tmp_path / "run"))
    trainer.fit(BoringClassifier(), datamodule=dm)
    final = trainer.federation_state.history[-1]
    for key in (
        "global/test_acc",
        "global/test_loss",
        "client/test_acc_mean",
        "client/test_acc_std",
        "client/test_acc_min",
        "client/test_acc_worst10",
        "train/loss",
        "comm/bytes_up",
        "comm/bytes_down",
        "time/round_s",
    ):
        assert key in final, key
    model_bytes = sum(t.numel() * t.element_size() for t in BoringClassifier().state_dict().values())
    assert final["comm/bytes_up"] == final["comm/bytes_down"] == 2 * 2 * model_bytes
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_rounds"] == 2 and len(summary["history"]) == 2
    assert summary["final"]["global/test_acc"] == final["global/test_acc"]
    assert set(summary["final_client_metrics"]) == {"0", "1", "2", "3"}
    assert (tmp_path / "run" / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_client_train_start_hooks_cannot_shift_the_clients_data_order_or_rng(tmp_path):
    class Meddler(FedCallback):
        def on_client_train_start(self, trainer, pl_module, client_ctx, dataloader):
            for _ in dataloader:  # a full pass, as q-FedAvg and FedCurv do
                torch.rand(3)  # and a draw from the global RNG

    def fit(callbacks):
        L.seed_everything(0)
        module = BoringClassifier(dropout=0.3)
        fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=callbacks).fit(
            module, datamodule=make_datamodule()
        )
        return global_weights(module)

    plain, meddled = fit([]), fit([Meddler()])
    for name, tensor in plain.items():
        assert torch.equal(meddled[name], tensor), name
