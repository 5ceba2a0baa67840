"""LightningModules written for Lightning, unchanged: step-interval LR schedulers sized by
``trainer.estimated_stepping_batches``, and manual optimisation (Lightning's GAN pattern)."""

from typing import Any

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import NUM_FEATURES, BoringClassifier, fast_trainer, make_datamodule
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_fed import FedCallback
from lightning_fed.callbacks import FedProx

# 4 IID clients of 80 training samples (a fifth of each is its test split), batches of 16: 5 optimizer steps per
# client and round.
STEPS_PER_CLIENT = 5
ROUNDS = 3


class OneCycle(BoringClassifier):
    """Sizes OneCycleLR by the run's stepping batches, as Lightning's docs do."""

    def __init__(self) -> None:
        super().__init__(momentum=0.9)
        self.total_steps: int | None = None

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        self.total_steps = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class StepLrs(FedCallback):
    """The lr (and momentum) each client's optimizer steps with, by (round, client)."""

    def __init__(self) -> None:
        self.lrs: dict[tuple[int, int], list[tuple[float, float]]] = {}
        self._key = (0, 0)

    def on_client_start(self, trainer: Any, pl_module: Any, client_ctx: Any) -> None:
        self._key = (client_ctx.round_idx, client_ctx.client_id)
        self.lrs[self._key] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        group = optimizer.param_groups[0]
        self.lrs[self._key].append((group["lr"], group["momentum"]))


def reference_schedule(total_steps: int) -> list[tuple[float, float]]:
    """The (lr, momentum) OneCycleLR gives each step of a plain run of ``total_steps`` steps."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=total_steps)
    values = []
    for _ in range(total_steps):
        values.append((optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["momentum"]))
        optimizer.step()
        scheduler.step()
    return values


def test_one_cycle_sized_by_estimated_stepping_batches_spans_the_run(tmp_path):
    module, record = OneCycle(), StepLrs()
    trainer = fast_trainer(tmp_path, num_rounds=ROUNDS, clients_per_round=2, callbacks=[record])
    trainer.fit(module, datamodule=make_datamodule())
    total = ROUNDS * STEPS_PER_CLIENT
    assert module.total_steps == total == trainer.estimated_stepping_batches
    reference = reference_schedule(total)
    assert len(record.lrs) == ROUNDS * 2
    for (round_idx, _), seen in record.lrs.items():
        # Every client of a round starts where the round's schedule stands and walks its own steps: no client's
        # steps leak into the next client's (lr and the momentum OneCycle cycles).
        start = round_idx * STEPS_PER_CLIENT
        expected = reference[start : start + STEPS_PER_CLIENT]
        assert [lr for lr, _ in seen] == pytest.approx([lr for lr, _ in expected], rel=1e-12)
        assert [m for _, m in seen] == pytest.approx([m for _, m in expected], rel=1e-12)
    first, *_, last = sorted(record.lrs)
    assert record.lrs[first][0][0] == pytest.approx(0.5 / 25)  # the start: max_lr / div_factor
    peak = max(lr for seen in record.lrs.values() for lr, _ in seen)
    assert peak == pytest.approx(max(lr for lr, _ in reference)) and peak == pytest.approx(0.5, rel=1e-2)
    assert record.lrs[last][-1][0] == pytest.approx(reference[-1][0]) and reference[-1][0] < 1e-4  # the end
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == total  # exactly at the end: a further step would make OneCycleLR raise


def test_estimated_stepping_batches_counts_epochs_accumulation_and_uneven_clients(tmp_path):
    from lightning_fed.engine.step_counter import client_steps, run_steps, steps_per_round

    assert client_steps(7, local_epochs=2, local_steps=None, accumulate=2) == 8  # an epoch's last batch ends a step
    assert client_steps(7, local_epochs=None, local_steps=5, accumulate=1) == 5
    assert client_steps(0, local_epochs=1, local_steps=None, accumulate=1) == 0
    assert steps_per_round([2, 3]) == 3 and steps_per_round([2, 2, 3]) == 2
    assert run_steps([2, 3, 10], num_rounds=4) == 3 * 5 + 10  # no client steps past the end
    trainer = fast_trainer(tmp_path, num_rounds=5, local_steps=3)
    module = OneCycle()
    trainer.fit(module, datamodule=make_datamodule())
    assert module.total_steps == 15


def test_step_scheduler_with_frequency_advances_by_the_average_client(tmp_path):
    class EveryThird(BoringClassifier):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            config = {"scheduler": scheduler, "interval": "step", "frequency": 3}
            return {"optimizer": optimizer, "lr_scheduler": config}

    record = StepLrs()
    module = EveryThird(momentum=0.0)
    trainer = fast_trainer(tmp_path, num_rounds=2, callbacks=[record])
    trainer.fit(module, datamodule=make_datamodule())
    # Positions 1..5 in round 0 (a scheduler step after 3), 6..10 in round 1 (after 6 and 9); the lr a step sees
    # is 0.1 * 0.5 ** (scheduler steps before it).
    expected = {0: [0, 0, 0, 1, 1], 1: [1, 2, 2, 2, 3]}
    for (round_idx, _), seen in record.lrs.items():
        assert [lr for lr, _ in seen] == pytest.approx([0.1 * 0.5**k for k in expected[round_idx]])
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 10 // 3


def test_step_scheduler_run_resumes_bit_identical(tmp_path):
    def run(root: Any, ckpt_path: Any = None) -> tuple[OneCycle, StepLrs, Any]:
        L.seed_everything(0)
        record = StepLrs()
        every_round = ModelCheckpoint(dirpath=tmp_path / "ckpts", filename="{epoch}", save_top_k=-1)
        trainer = fast_trainer(root, num_rounds=ROUNDS, callbacks=[record, every_round], enable_checkpointing=True)
        module = OneCycle()
        trainer.fit(module, datamodule=make_datamodule(), ckpt_path=ckpt_path)
        return module, record, trainer

    full, full_lrs, full_trainer = run(tmp_path / "a")
    resumed, resumed_lrs, resumed_trainer = run(tmp_path / "b", ckpt_path=tmp_path / "ckpts" / "epoch=0.ckpt")
    for name, tensor in full.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    assert {k: v for k, v in full_lrs.lrs.items() if k[0] > 0} == resumed_lrs.lrs
    full_scheduler = full_trainer.lr_scheduler_configs[0].scheduler.state_dict()
    assert resumed_trainer.lr_scheduler_configs[0].scheduler.state_dict() == full_scheduler


def test_a_step_scheduler_falls_back_from_batched_clients(tmp_path):
    with pytest.warns(UserWarning, match="interval='step'"):
        fast_trainer(tmp_path, num_rounds=1, client_parallelism=2).fit(OneCycle(), datamodule=make_datamodule())


def test_plateau_scheduler_on_steps_is_refused_in_one_line(tmp_path):
    class Plateau(BoringClassifier):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            config = {"scheduler": scheduler, "interval": "step", "monitor": "train_loss"}
            return {"optimizer": optimizer, "lr_scheduler": config}

    with pytest.raises(ValueError, match="interval='epoch'") as error:
        fast_trainer(tmp_path).fit(Plateau(), datamodule=make_datamodule())
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------- manual optimisation


class TinyGAN(L.LightningModule):
    """Lightning's GAN example pattern: two optimizers stepped in ``training_step`` with ``toggle_optimizer`` and
    ``manual_backward``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, NUM_FEATURES))
        self.discriminator = nn.Sequential(nn.Linear(NUM_FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
        self.state_sizes: list[tuple[int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        opt_g, opt_d = self.optimizers()
        noise = torch.randn(real.shape[0], 4)
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(noise)), ones)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        fake = self.generator(noise).detach()
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), zeros)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        self.log("val_real_score", torch.sigmoid(self.discriminator(real)).mean())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=1e-3)
        return [opt_g, opt_d], []


class TinyGANWithoutBatchIdx(TinyGAN):
    """Lightning's GAN example exactly as written: ``training_step(self, batch)``, no batch index."""

    def training_step(self, batch: Any) -> None:  # type: ignore[override]
        super().training_step(batch, 0)


@pytest.mark.parametrize("gan", [TinyGAN, TinyGANWithoutBatchIdx], ids=["batch_idx", "batch_only"])
def test_gan_with_two_optimizers_trains_federated_with_fedavg(tmp_path, gan):
    class OptimizerStates(FedCallback):
        def __init__(self) -> None:
            self.at_start: list[list[int]] = []
            self.steps: list[int] = []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                self.at_start.append([len(o.state) for o in trainer.optimizers])

        def on_client_end(self, trainer: Any, pl_module: Any, client_ctx: Any, update: Any) -> None:
            self.steps.append(client_ctx.num_steps)

    module, record = gan(), OptimizerStates()
    before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=[record])
    trainer.fit(module, datamodule=make_datamodule())
    assert len(trainer.federation_state.history) == 2
    assert all(not torch.equal(before[n], t) for n, t in module.state_dict().items() if n.endswith("weight"))
    assert all(torch.isfinite(t).all() for t in module.state_dict().values())
    # Every optimizer starts each client with fresh state; every optimizer step the module takes counts.
    assert record.at_start == [[0, 0]] * 4
    assert record.steps == [2 * STEPS_PER_CLIENT] * 4
    assert trainer.global_step == 4 * 2 * STEPS_PER_CLIENT
    history = trainer.federation_state.history[-1]
    assert "train/g_loss" in history or any("g_loss" in key for key in history)


def test_fedprox_with_manual_optimisation_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="FedProx") as error:
        fast_trainer(tmp_path, callbacks=[FedProx(mu=0.01)]).fit(TinyGAN(), datamodule=make_datamodule())
    message = str(error.value)
    assert "\n" not in message and "manual optimisation" in message and "training step" in message


def test_manual_optimisation_refusal_names_the_setting(tmp_path):
    from lightning_fed.run.module_checks import manual_optimization_refusal

    trainer = fast_trainer(tmp_path, client_parallelism=2)
    message = manual_optimization_refusal(trainer, TinyGAN())
    assert message is not None and "client_parallelism" in message and "\n" not in message
    assert manual_optimization_refusal(trainer, BoringClassifier()) is None
