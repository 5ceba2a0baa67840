"""Canaries for the private Lightning API that lightning_fed/loop.py and lightning_fed/cli/main.py rely on.

If one fails after a Lightning upgrade, the round loop must be adapted before anything else is trusted.
"""

import inspect

import lightning
from lightning.pytorch import Trainer
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from packaging.version import Version


def test_lightning_is_a_supported_version():
    assert Version("2.6") <= Version(lightning.__version__) < Version("2.7")


def test_fit_loop_runs_the_epoch_loop_with_a_data_fetcher():
    source = inspect.getsource(_FitLoop.advance)
    assert "self.epoch_loop.run(self._data_fetcher)" in source
    assert "_num_ready_batches_reached" in inspect.getsource(_FitLoop.on_advance_end)
    assert 'update_lr_schedulers("epoch"' in inspect.getsource(_FitLoop.on_advance_end)


def test_epoch_loop_steps_non_plateau_epoch_schedulers_itself():
    source = inspect.getsource(_TrainingEpochLoop.advance)
    assert 'self.update_lr_schedulers("epoch", update_plateau_schedulers=False)' in source
    assert "update_plateau_schedulers" in inspect.signature(_TrainingEpochLoop.update_lr_schedulers).parameters


def test_epoch_loop_internals_the_round_loop_uses():
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    loop = trainer.fit_loop.epoch_loop
    assert isinstance(loop, _TrainingEpochLoop)
    assert inspect.signature(_TrainingEpochLoop.__init__).parameters.keys() >= {"trainer", "min_steps", "max_steps"}
    for name in ("val_loop", "batch_progress", "automatic_optimization", "_batches_that_stepped"):
        assert hasattr(loop, name), name
    assert callable(loop._should_check_val_epoch)
    step = loop.automatic_optimization.optim_progress.optimizer.step
    before = loop.global_step
    step.increment_ready()
    step.increment_completed()
    assert loop.global_step == before + 1
    progress = loop.batch_progress
    for method in ("increment_ready", "increment_started", "increment_processed", "increment_completed"):
        assert callable(getattr(progress, method)), method
    assert hasattr(progress, "is_last_batch")


def test_loop_state_dict_nests_child_loop_checkpoint_state():
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    state = trainer.fit_loop.state_dict()
    assert "epoch_loop.state_dict" in state
    assert "on_save_checkpoint" in inspect.getsource(type(trainer.fit_loop.epoch_loop).state_dict)


def test_the_cli_reparses_a_checkpoint_only_in_the_method_federated_cli_overrides():
    # FederatedCLI replaces `_parse_ckpt_path` so that a checkpoint file never rewrites the config (nor picks the
    # class to import). If Lightning renames it, or re-parses from another place, a file would override the
    # command line again and the fingerprint check would see no change.
    from lightning.pytorch import cli as lightning_cli

    from lightning_fed.cli.main import FederatedCLI

    assert "self._parse_ckpt_path()" in inspect.getsource(lightning_cli.LightningCLI.__init__)
    assert '"hyper_parameters"' in inspect.getsource(lightning_cli.LightningCLI._parse_ckpt_path)
    module_source = inspect.getsource(lightning_cli)
    assert module_source.count("hyper_parameters") == 1, "Lightning reads checkpoint hyperparameters elsewhere too"
    assert module_source.count("torch.load(") == 1, "Lightning's CLI loads a checkpoint elsewhere too"
    assert FederatedCLI._parse_ckpt_path is not lightning_cli.LightningCLI._parse_ckpt_path


def test_the_optimizer_parsing_that_the_early_module_check_uses():
    """``run.setup_checks.check_optimization_setup`` parses ``configure_optimizers``'s output before the fit as
    ``_init_optimizers_and_lr_schedulers`` does, with the same private helpers."""
    from lightning.pytorch.core import optimizer

    source = inspect.getsource(optimizer._init_optimizers_and_lr_schedulers)
    for name in ("_configure_optimizers(", "_configure_schedulers_automatic_opt(", "_configure_schedulers_manual_opt("):
        assert name in source, name
    assert "_MockOptimizer()" in source
