"""Every fit has its own run directory, <root>/runs/<run id>/, holding everything it writes; fits started together
into one root (a sweep) never mix their files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from lightning_fed.loggers import WandbLogger
from lightning_fed.run import identity as run_identity

ROOT = Path(__file__).parents[2]
SWEEP_BASE = ROOT / "configs" / "sweeps" / "mnist1d_fedavg.yaml"
SWEEP = ROOT / "configs" / "sweeps" / "fedavg_lr_seed.sweep.yaml"


def test_fits_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(run_identity.time, "strftime", lambda fmt: "20250101-000000")
    runs = []
    for lr in (0.1, 0.2):
        trainer = fast_trainer(tmp_path, num_rounds=1, enable_checkpointing=True, limit_val_batches=0)
        trainer.fit(BoringClassifier(lr=lr), datamodule=make_datamodule())
        runs.append(trainer.fed_run_dir)
    assert runs[0] != runs[1] and all(run.parent == tmp_path / "runs" for run in runs)
    assert all(run.name.startswith("20250101-000000-") for run in runs)
    for run, lr in zip(runs, (0.1, 0.2)):
        summary = json.loads((run / "summary.json").read_text())
        assert summary["run_id"] == run.name and summary["fingerprint"]["model.lr"] == lr
        assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["last.ckpt", "round0000.ckpt"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs"], "nothing outside the run directories"


def test_an_explicit_run_dir_wins(tmp_path):
    trainer = fast_trainer(tmp_path, num_rounds=1, enable_checkpointing=True, run_dir=str(tmp_path / "mine"))
    trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    assert trainer.fed_run_dir == tmp_path / "mine"
    assert (tmp_path / "mine" / "checkpoints" / "last.ckpt").exists() and not (tmp_path / "runs").exists()


def test_the_wandb_run_lives_in_the_run_directory_and_shares_its_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    logger = WandbLogger(project="t", save_dir=str(tmp_path / "elsewhere"), offline=True)
    trainer = fast_trainer(tmp_path / "root", num_rounds=1, logger=logger)
    trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    run_dir = trainer.fed_run_dir
    assert logger.version == trainer.fed_run_id == run_dir.name
    assert list((run_dir / "wandb").glob(f"offline-run-*-{run_dir.name}"))
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "wandb").exists()


def test_a_sweep_agents_run_id_names_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "agentrun1")
    trainer = fast_trainer(tmp_path, num_rounds=1, logger=WandbLogger(project="t", offline=True))
    trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    assert trainer.fed_run_id == "agentrun1" and trainer.logger.version == "agentrun1"


def test_the_sweep_drives_the_cli_with_its_base_config():
    sweep = yaml.safe_load(SWEEP.read_text())
    assert sweep["program"] == "lightning-fed" and sweep["command"][1:5] == [
        "lightning-fed",
        "fit",
        "--config",
        str(SWEEP_BASE.relative_to(ROOT)),
    ]
    assert set(sweep["parameters"]) == {"model.init_args.lr", "seed_everything"}


@pytest.mark.slow
def test_four_concurrent_fits_into_one_root_keep_their_runs_apart(tmp_path):
    """A sweep on one machine: four CLI fits started at once into one root, without a logger (no logger id)."""
    settings = [(0, 0.01), (1, 0.03), (2, 0.1), (3, 0.3)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lightning_fed.cli.main",
                "fit",
                "--config",
                str(SWEEP_BASE),
                f"--seed_everything={seed}",
                f"--model.init_args.lr={lr}",
                "--trainer.default_root_dir",
                str(tmp_path),
                "--trainer.logger",
                "false",
                "--trainer.num_rounds",
                "2",
                "--trainer.local_epochs",
                "1",
                "--trainer.clients_per_round",
                "3",
                "--data.init_args.num_samples",
                "400",
                "--data.init_args.partitioner.init_args.num_partitions",
                "3",
                "--trainer.enable_progress_bar",
                "false",
                "--trainer.enable_model_summary",
                "false",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed, lr in settings
    ]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    run_dirs = sorted((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 4
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs"], "nothing outside the run directories"
    found = set()
    for run_dir in run_dirs:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        seed, lr = config["seed_everything"], config["model"]["init_args"]["lr"]
        assert summary["seed"] == seed and summary["fingerprint"]["model.lr"] == lr, run_dir
        assert summary["run_dir"] == str(run_dir) and summary["completed_rounds"] == 2
        checkpoints = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
        assert checkpoints == ["last.ckpt", "round0000.ckpt", "round0001.ckpt"], run_dir
        found.add((seed, lr))
    assert found == set(settings)
