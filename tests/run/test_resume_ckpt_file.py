"""A checkpoint file given to ``lightning-fed --ckpt_path`` resumes under the same rules as a run id.

Lightning's CLI re-parses the model's config from a checkpoint file's hyperparameters; ``FederatedCLI`` does not, so
the command line wins, a changed setting is refused by the fingerprint check naming the key, and a checkpoint never
chooses which class is imported. Each test runs ``lightning_fed.cli.main`` in-process on a tiny MNIST-1D config.
"""

import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.cli_config import BASE

from lightning_fed.cli.errors import TRACEBACK_ENV
from lightning_fed.cli.main import main

LR = "--model.init_args.lr"


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str]:
    """Runs the CLI; returns its exit status (0 when it returns) and stderr."""
    try:
        main(args)
        code: int | str | None = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def _tree(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in sorted(root.rglob("*"))}


@pytest.fixture
def finished(tmp_path, capsys, monkeypatch):
    """A root holding one finished 1-round run with lr 0.05: ``(args of the run, root, run dir, its last.ckpt)``."""
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    config = tmp_path / "base.yaml"
    config.write_text(BASE.format(logger="false"))
    root = tmp_path / "root"
    args = ["fit", "--config", str(config), "--trainer.default_root_dir", str(root)]
    code, err = _main(args, capsys)
    assert code == 0, err
    (run_dir,) = (root / "runs").iterdir()
    checkpoint = (run_dir / "checkpoints" / "last.ckpt").resolve()
    assert torch.load(checkpoint, weights_only=True)["hyper_parameters"]["lr"] == 0.05
    return args, root, run_dir, checkpoint


def test_a_changed_setting_is_refused_for_a_file_as_for_a_run_id(finished, tmp_path, capsys):
    args, root, run_dir, checkpoint = finished
    elsewhere = tmp_path / "copied.ckpt"  # a file outside any run directory
    shutil.copy(checkpoint, elsewhere)
    before = _tree(root)
    for ckpt_path in (run_dir.name, str(checkpoint), str(elsewhere)):
        code, err = _main([*args, LR, "0.2", "--trainer.num_rounds", "2", "--ckpt_path", ckpt_path], capsys)
        assert code == 2, f"{ckpt_path}: {err}"
        assert "Cannot resume" in err and "model.lr: 0.05 -> 0.2" in err, err
        assert "resume_allow_changes=['model.lr']" in err, err
        assert "Traceback" not in err
        assert _tree(root) == before, f"{ckpt_path}: a refused resume writes nothing"


def _resume_with_allowed_lr(args: list[str], run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """Resumes the run from its ``last.ckpt`` file with lr 0.2, allowed; returns the new ``last.ckpt``."""
    allow = ["--trainer.resume_allow_changes", "[model.lr]"]
    last = run_dir / "checkpoints" / "last.ckpt"
    with pytest.warns(UserWarning, match=r"model\.lr: 0\.05 -> 0\.2"):  # the allowed change is reported
        code, err = _main([*args, LR, "0.2", "--trainer.num_rounds", "2", *allow, "--ckpt_path", str(last)], capsys)
    assert code == 0, err
    return torch.load(last, weights_only=True)


def test_an_allowed_change_resumes_with_the_command_line_value(finished, capsys):
    args, _, run_dir, _ = finished
    resumed = _resume_with_allowed_lr(args, run_dir, capsys)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["init_args"]["lr"] == 0.2, "config.yaml records the command line, not the checkpoint"
    assert resumed["hyper_parameters"]["lr"] == 0.2
    assert resumed["loops"]["fit_loop"]["epoch_loop.state_dict"]["federated"]["fingerprint"]["model.lr"] == 0.2


def test_an_allowed_lr_change_is_the_lr_the_optimizer_steps_with(finished, capsys):
    args, _, run_dir, _ = finished
    resumed = _resume_with_allowed_lr(args, run_dir, capsys)
    assert resumed["optimizer_states"][0]["param_groups"][0]["lr"] == 0.2


def test_a_checkpoint_never_chooses_the_class_to_import(finished, tmp_path, capsys, monkeypatch):
    args, root, _, checkpoint = finished
    # A module that would leave a marker file if anything imported it, on the import path.
    modules, marker = tmp_path / "modules", tmp_path / "imported"
    modules.mkdir()
    (modules / "lf_chosen_by_checkpoint.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil: ...\n")
    monkeypatch.syspath_prepend(str(modules))
    hostile = torch.load(checkpoint, weights_only=True)
    hostile["hyper_parameters"]["_class_path"] = "lf_chosen_by_checkpoint.Evil"
    hostile_path = tmp_path / "hostile.ckpt"
    torch.save(hostile, hostile_path)
    code, err = _main([*args, "--trainer.num_rounds", "2", "--ckpt_path", str(hostile_path)], capsys)
    assert code == 0, err
    assert not marker.exists() and "lf_chosen_by_checkpoint" not in sys.modules
    for saved in (root / "runs").glob("*/config.yaml"):
        assert yaml.safe_load(saved.read_text())["model"]["class_path"] == "lightning_fed.models.ClassifierModule"


#: A ModelCheckpoint of the user's, given no directory (the run's `checkpoints/`), with Lightning's defaults
#: otherwise: `save_last=True` writes `last.ckpt` as a file, and the version counter is on.
USER_CHECKPOINT = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.init_args.filename=round{epoch:04d}",
    "--trainer.callbacks.init_args.auto_insert_metric_name=false",
    "--trainer.callbacks.init_args.monitor=epoch",
    "--trainer.callbacks.init_args.mode=max",
    "--trainer.callbacks.init_args.save_top_k=2",
    "--trainer.callbacks.init_args.save_last=true",
]


@pytest.mark.parametrize("callback", [[], USER_CHECKPOINT], ids=["default_checkpoint", "user_checkpoint"])
def test_a_kept_round_file_resumes_in_its_run_and_continues_last(tmp_path, capsys, callback):
    """``--ckpt_path <run>/checkpoints/round0000.ckpt`` of a run whose newest round is 1: the run continues in its
    directory and ``last.ckpt`` is the newest round again, with no ``last-v1.ckpt`` beside the kept files (round 0's
    checkpoint was saved before ``last.ckpt`` existed, so the state it restores names no last file)."""
    config = tmp_path / "base.yaml"
    config.write_text(BASE.format(logger="false"))
    root = tmp_path / "root"
    args = ["fit", "--config", str(config), "--trainer.default_root_dir", str(root), *callback]
    code, err = _main([*args, "--trainer.num_rounds", "2"], capsys)
    assert code == 0, err
    (run_dir,) = (root / "runs").iterdir()
    checkpoints = run_dir / "checkpoints"
    first = checkpoints / "round0000.ckpt"
    assert torch.load(first, weights_only=True)["epoch"] == 0
    code, err = _main([*args, "--trainer.num_rounds", "3", "--ckpt_path", str(first)], capsys)
    assert code == 0, err
    assert [path.name for path in (root / "runs").iterdir()] == [run_dir.name], "resumed in its own run"
    names = sorted(path.name for path in checkpoints.iterdir())
    assert "last-v1.ckpt" not in names, names
    if not callback:  # the default replaces a round trained again rather than writing a -v1 copy
        assert not [name for name in names if "-v" in name], names
        assert (checkpoints / "last.ckpt").readlink().name == "round0002.ckpt"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["epoch"] == 2
