"""Configs are code: a config may name functions and classes, but not ones that run commands, change files or load
code (jsonargparse's import deny-list, enforced by ``FederatedCLI``). The refused command must never run."""

from pathlib import Path

import pytest
from helpers.cli_config import BASE

from lightning_fed.cli.errors import TRACEBACK_ENV
from lightning_fed.cli.main import FederatedCLI, main

CALLS = ["--trainer.callbacks+=helpers.calling.CallsOnBuild", "--trainer.callbacks.call"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(BASE.format(logger="false"))
    return path


@pytest.mark.parametrize("function", ["os.system", "subprocess.getoutput", "posix.system"])
def test_a_config_that_would_run_a_command_is_refused_before_it_runs(function, config, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    marker, root = tmp_path / "marker", tmp_path / "root"
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["fit", "--config", str(config), "--trainer.default_root_dir", str(root), *CALLS, function]
            + ["--trainer.callbacks.argument", f"touch {marker}"]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "`trainer.callbacks.init_args.call`" in err and f"got '{function}'" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert not marker.exists(), "the command ran"
    assert not root.exists()


def test_the_same_config_slot_takes_an_allowed_function(config, capsys):
    # The refusal comes from the deny-list, not from the slot: a harmless function is called as given.
    FederatedCLI(
        args=["--config", str(config), "--trainer.logger", "false", *CALLS, "builtins.print"]
        + ["--trainer.callbacks.argument", "called from the config"],
        run=False,
    )
    assert "called from the config" in capsys.readouterr().out
