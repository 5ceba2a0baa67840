"""Lightning features that must keep working under FederatedTrainer, and the promised input errors."""

import lightning.pytorch as L
import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_fed import FedCallback, FederatedTrainer


def test_model_checkpoint_and_early_stopping_on_validation_metrics(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss", mode="min", save_top_k=1)
    # A threshold no model reaches stops the run after `patience` rounds without improvement.
    stopper = EarlyStopping(monitor="val_acc", mode="max", patience=1, min_delta=2.0)
    trainer = fast_trainer(tmp_path, num_rounds=6, callbacks=[checkpoint, stopper], enable_checkpointing=True)
    trainer.fit(BoringClassifier(), datamodule=make_datamodule(val_fraction=0.2))
    assert trainer.current_epoch == 2 and len(trainer.federation_state.history) == 2
    assert checkpoint.best_model_path and checkpoint.best_model_score is not None
    assert "val_acc" in trainer.federation_state.history[-1]


def test_bf16_mixed_precision_trains_with_autocast(tmp_path):
    dtypes = []

    class Spy(FedCallback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            dtypes.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)

    module = BoringClassifier()
    fast_trainer(tmp_path, num_rounds=1, precision="bf16-mixed", callbacks=[Spy()]).fit(
        module, datamodule=make_datamodule()
    )
    assert dtypes and set(dtypes) == {None}  # batch hooks run outside autocast, as in Lightning
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in module.parameters())


def test_training_step_runs_under_the_precision_context(tmp_path):
    seen = []

    class Probe(BoringClassifier):
        def training_step(self, batch, batch_idx):
            seen.append(torch.is_autocast_enabled("cpu"))
            return super().training_step(batch, batch_idx)

    fast_trainer(tmp_path, num_rounds=1, precision="bf16-mixed").fit(Probe(), datamodule=make_datamodule())
    assert seen and all(seen)


def test_gradient_clipping_bounds_every_step(tmp_path):
    norms = []

    class Record(FedCallback):
        def on_before_zero_grad(self, trainer, pl_module, optimizer):
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    fast_trainer(tmp_path, num_rounds=1, gradient_clip_val=1e-3, callbacks=[Record()]).fit(
        BoringClassifier(), datamodule=make_datamodule()
    )
    assert norms and max(norms) <= 1e-3 * (1 + 1e-4)


def test_epoch_lr_scheduler_steps_once_per_round(tmp_path):
    lrs = []

    class Decaying(BoringClassifier):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.5)}

    class Record(FedCallback):
        def on_client_start(self, trainer, pl_module, client_ctx):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    fast_trainer(tmp_path, num_rounds=3, clients_per_round=2, callbacks=[Record()]).fit(
        Decaying(), datamodule=make_datamodule()
    )
    assert lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])


def test_csv_logger_receives_round_metrics(tmp_path):
    logger = CSVLogger(tmp_path, name="csv")
    fast_trainer(tmp_path, num_rounds=2, logger=logger).fit(BoringClassifier(), datamodule=make_datamodule())
    text = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text()
    header = text.splitlines()[0].split(",")
    for key in ("round", "global/test_acc", "client/test_acc_mean", "train/loss", "comm/bytes_up", "time/round_s"):
        assert key in header, key


def test_kept_optimizer_state_survives_between_participations(tmp_path):
    momenta = {}

    class Record(FedCallback):
        def on_client_start(self, trainer, pl_module, client_ctx):
            momenta[(client_ctx.round_idx, client_ctx.client_id)] = client_ctx.store.get(
                "optimizer", client_ctx.client_id
            )

    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, keep_optimizer_state=True, callbacks=[Record()])
    trainer.fit(BoringClassifier(momentum=0.9), datamodule=make_datamodule(num_clients=2))
    assert momenta[(0, 0)] is None and momenta[(1, 0)] is not None
    assert all(t.device.type == "cpu" for t in momenta[(1, 0)][0].values())


def test_seed_everything_seeds_the_federation(tmp_path):
    L.seed_everything(123)
    trainer = fast_trainer(tmp_path, num_rounds=1)
    trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    assert trainer.federation_state.seed == 123


# ---------------------------------------------------------------- bad input


def test_more_clients_per_round_than_clients(tmp_path):
    with pytest.raises(ValueError, match="clients_per_round"):
        fast_trainer(tmp_path, clients_per_round=9).fit(BoringClassifier(), datamodule=make_datamodule(num_clients=4))
    assert not (tmp_path / "runs").exists(), "nothing may be written before the error"


def test_more_clients_than_samples(tmp_path):
    with pytest.raises(ValueError, match="num_partitions|clients"):
        fast_trainer(tmp_path).fit(BoringClassifier(), datamodule=make_datamodule(num_clients=50, num_samples=20))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"local_epochs": 1, "local_steps": 3}, "either `local_epochs` or `local_steps`"),
        ({"local_epochs": 0}, "local_epochs"),
        ({"num_rounds": 0}, "num_rounds"),
        ({"max_epochs": 5}, "max_epochs.*num_rounds"),
        ({"client_eval": "some"}, "client_eval"),
        ({"on_client_divergence": "ignore"}, "on_client_divergence"),
    ],
)
def test_bad_trainer_arguments_name_the_argument(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fast_trainer(tmp_path, **kwargs)


def test_plain_dataloaders_are_refused_with_a_hint(tmp_path):
    dm = make_datamodule()
    dm.setup()
    with pytest.raises(TypeError, match="DatasetFederated"):
        fast_trainer(tmp_path).fit(BoringClassifier(), dm.train_dataloader())


def test_fp16_loss_scaling_is_refused_for_algorithms_that_count_steps(tmp_path):
    from types import SimpleNamespace

    from lightning_fed.run.module_checks import check_module_setup

    class CountsSteps(FedCallback):
        supports_loss_scaling = False

    module = BoringClassifier()
    fake = SimpleNamespace(
        lightning_module=module,
        optimizers=[object()],
        lr_scheduler_configs=[],
        callbacks=[CountsSteps()],
        strategy=SimpleNamespace(precision_plugin=SimpleNamespace(scaler=object())),
        datamodule=SimpleNamespace(num_clients=2),
    )
    with pytest.raises(ValueError, match="bf16-mixed.*|.*CountsSteps"):
        check_module_setup(fake, module)
    fake.callbacks = [FedCallback()]
    check_module_setup(fake, module)  # plain FedAvg accepts loss scaling


def test_trainer_is_a_lightning_trainer():
    assert issubclass(FederatedTrainer, L.Trainer)


def test_timestamped_run_dir_is_resolved_once_per_fit(tmp_path, monkeypatch):
    """The config (saved at setup) and the summary (written after each round) share one timestamped directory, even
    when the clock moves on between them."""
    import itertools

    from lightning_fed.run import identity as run_identity
    from lightning_fed.run import reporting

    stamps = (f"stamp{i}" for i in itertools.count())
    monkeypatch.setattr(run_identity.time, "strftime", lambda fmt: next(stamps))
    trainer = FederatedTrainer(
        num_rounds=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    first = reporting.resolve_run_dir(trainer)
    assert reporting.resolve_run_dir(trainer) == first
    trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    assert trainer.fed_run_dir is not None and (trainer.fed_run_dir / "summary.json").exists()
    assert trainer.fed_run_dir != first, "a new fit must get a directory of its own"
    assert reporting.resolve_run_dir(trainer) == trainer.fed_run_dir
