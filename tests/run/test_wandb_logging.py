"""W&B logging, always offline: credential detection, the logger's offline fallback and what a fit sends to W&B."""

import json
from pathlib import Path

import pytest
import wandb
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from lightning_fed.loggers import WandbLogger, has_wandb_credentials


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No W&B settings and an empty netrc, whatever the developer's machine holds."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("")
    monkeypatch.setenv("NETRC", str(netrc_file))
    return netrc_file


def test_no_credentials(clean_env, monkeypatch, tmp_path):
    assert has_wandb_credentials() is False
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    assert has_wandb_credentials() is False
    clean_env.write_text("machine github.com login me password token\n")
    monkeypatch.setenv("NETRC", str(clean_env))
    assert has_wandb_credentials() is False


def test_api_key_in_the_environment(clean_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert has_wandb_credentials() is True


def test_netrc_entry_for_wandb_or_the_custom_host(clean_env, monkeypatch):
    clean_env.write_text("machine api.wandb.ai login user password secret\n")
    assert has_wandb_credentials() is True
    clean_env.write_text("machine ml.example.com login user password secret\n")
    assert has_wandb_credentials() is False
    monkeypatch.setenv("WANDB_BASE_URL", "https://ml.example.com")
    assert has_wandb_credentials() is True


@pytest.mark.parametrize("mode", ["offline", "disabled", "OFFLINE"])
def test_offline_mode_wins_over_credentials(clean_env, monkeypatch, mode):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    clean_env.write_text("machine api.wandb.ai login user password secret\n")
    monkeypatch.setenv("WANDB_MODE", mode)
    assert has_wandb_credentials() is False


def test_logger_goes_offline_without_credentials(clean_env, monkeypatch, tmp_path):
    # Constructing the logger starts no run (the experiment is created lazily), so nothing here can reach W&B.
    assert WandbLogger(save_dir=str(tmp_path), project="t")._offline is True
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbLogger(save_dir=str(tmp_path), project="t")._offline is False
    assert WandbLogger(save_dir=str(tmp_path), project="t", offline=True)._offline is True


@pytest.fixture
def finish_wandb():
    yield
    wandb.finish()


def test_fit_logs_round_metrics_partition_and_client_table(tmp_path, monkeypatch, finish_wandb):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    logger = WandbLogger(save_dir=str(tmp_path), project="t")
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, logger=logger, client_table_every_n_rounds=1)
    trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=3))

    run = logger.experiment
    assert logger._offline is True
    files = Path(run.dir)
    assert files.is_dir() and files.is_relative_to(tmp_path)
    assert list(files.parent.glob("*.wandb")), "the offline run's record file is missing"

    summary = dict(run.summary)
    assert summary["round"] == 2
    assert summary["global/test_acc"] == pytest.approx(trainer.federation_state.history[-1]["global/test_acc"])
    for key in ("train/loss", "client/test_acc_mean", "comm/bytes_up", "partition/mean_emd", "client/results"):
        assert key in summary, key

    images = list((files / "media" / "images").rglob("label_histogram*.png"))
    assert len(images) == 1 and images[0].read_bytes()[:4] == b"\x89PNG"

    tables = [json.loads(path.read_text()) for path in (files / "media" / "table").rglob("results*.table.json")]
    assert len(tables) == 2  # one per round
    for table in tables:
        assert table["columns"][:2] == ["client", "num_train_samples"]
        assert {"test_acc", "test_loss"} <= set(table["columns"])
        assert [row[0] for row in table["data"]] == [0, 1, 2]


def test_no_anonymous_argument_reaches_wandb_unless_given(tmp_path):
    # W&B warns "The anonymous setting has no effect" for any value, the `None` Lightning passes by default included.
    from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger

    from lightning_fed.loggers.wandb import place_wandb_run

    assert "anonymous" not in WandbLogger(save_dir=str(tmp_path), project="t", offline=True)._wandb_init
    lightnings_own = LightningWandbLogger(save_dir=str(tmp_path), project="t", offline=True)
    place_wandb_run(lightnings_own, tmp_path / "run", "run")
    assert "anonymous" not in lightnings_own._wandb_init
    assert WandbLogger(save_dir=str(tmp_path), project="t", offline=True, anonymous=True)._wandb_init["anonymous"]


def test_wandb_starts_in_a_directory_that_exists(tmp_path, monkeypatch):
    # W&B looks for the git repository from its `dir` before creating it, and warns "git root ... does not exist".
    seen = {}

    def fake_init(**kwargs):
        seen["dir_existed"] = Path(kwargs["dir"]).is_dir()
        return object()

    monkeypatch.setattr(wandb, "init", fake_init)
    logger = WandbLogger(save_dir=str(tmp_path / "fresh" / "runs"), project="t", offline=True)
    logger.experiment
    assert seen == {"dir_existed": True}
