"""``lightning-fed flower-app`` writes a Flower app directory from the fit's YAML, or refuses a bad one in one line
without writing anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from helpers.flower_configs import write_config

from lightning_fed.cli.main import extra_commands, run_extra_command
from lightning_fed.deploy.app import main
from lightning_fed.deploy.config import build_from_config

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")


def test_the_app_directory_holds_the_components_the_run_config_and_the_resolved_config(tmp_path, monkeypatch, capsys):
    pytest.importorskip("cryptography", reason="a roster's keys need the `flower` extra (cryptography)")
    from lightning_fed.deploy.keys import write_keys
    from lightning_fed.deploy.roster import Roster

    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, "fedprox")
    keys = write_keys(tmp_path / "keys", [[0], [1], [2]])
    assert (
        main(["--config", str(config), "--out", "my_app", "--round-timeout", "30", "--roster", str(keys.roster)]) == 0
    )
    app = tmp_path / "my_app"
    assert sorted(p.name for p in app.iterdir()) == ["README.md", "config.yaml", "pyproject.toml", "roster.json"]
    project = tomllib.loads((app / "pyproject.toml").read_text())
    assert project["project"]["name"] == "my-app" and project["project"]["version"]
    flwr = project["tool"]["flwr"]["app"]
    assert flwr["components"] == {
        "serverapp": "lightning_fed.deploy.flower:server_app",
        "clientapp": "lightning_fed.deploy.flower:client_app",
    }
    assert flwr["config"] == {
        "round-timeout": 30.0,
        "resume": False,
        "workdir": "",
        "state-dir": "",
        "roster": "roster.json",
    }
    assert Roster.load(app / "roster.json").keys == Roster.load(keys.roster).keys
    resolved = yaml.safe_load((app / "config.yaml").read_text())
    assert resolved["trainer"]["callbacks"][0]["class_path"] == "lightning_fed.callbacks.FedProx"
    assert resolved["data"]["init_args"]["num_samples"] == 300
    # The resolved file builds the same fit as the user's.
    _, _, trainer = build_from_config([app / "config.yaml"], save_config_callback=None)
    assert trainer.num_rounds == 3 and trainer.client_eval == "none"
    captured = capsys.readouterr()
    assert "flwr run" in captured.out and captured.err == ""
    # The app's README runs the SuperLink with TLS and authenticated SuperNodes, and never --insecure.
    readme = (app / "README.md").read_text()
    assert "--insecure" not in readme
    for flag in ("--ssl-certfile", "--enable-supernode-auth", "--root-certificates", "--auth-supernode-private-key"):
        assert flag in readme, flag
    assert "flwr supernode register" in readme and "site-key=" in readme and "root-certificates =" in readme


def test_a_deployment_app_needs_a_roster_and_insecure_says_it_is_a_local_trial_in_one_line(tmp_path, capsys):
    config = write_config(tmp_path)
    assert main(["--config", str(config), "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "name the deployment's roster with --roster" in err[0] and "--insecure" in err[0]
    assert not (tmp_path / "none").exists()
    assert main(["--config", str(config), "--out", str(tmp_path / "trial"), "--insecure"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--insecure: a local trial only" in err[0]
    settings = tomllib.loads((tmp_path / "trial" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert settings["roster"] == "" and not (tmp_path / "trial" / "roster.json").exists()
    # The trial app's README has one --insecure command, the one it marks as a local trial.
    readme = (tmp_path / "trial" / "README.md").read_text()
    (line,) = [line for line in readme.splitlines() if "--insecure" in line and "flower-" in line]
    assert "local trial" in readme.split(line)[0].splitlines()[-2]


def test_a_bad_roster_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    pytest.importorskip("cryptography", reason="a roster's keys need the `flower` extra (cryptography)")
    config = write_config(tmp_path)
    (tmp_path / "roster.json").write_text('{"clients": {"0": "ssh-ed25519 AAAA"}}')
    assert (
        main(["--config", str(config), "--out", str(tmp_path / "app"), "--roster", str(tmp_path / "roster.json")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lightning-fed flower-app: The roster ") and "client 0" in err[0]
    assert not (tmp_path / "app").exists()


def test_a_config_a_deployment_cannot_run_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    config = write_config(tmp_path)
    fedamp = "  callbacks:\n    - class_path: lightning_fed.callbacks.FedAMP\n"
    config.write_text(config.read_text().replace("  callbacks: []\n", fedamp))
    assert main(["--config", str(config), "--out", str(tmp_path / "app")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lightning-fed flower-app: ") and "FedAMP" in err[0]
    assert not (tmp_path / "app").exists()


def test_an_unknown_key_is_refused_in_one_line(tmp_path, capsys):
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("num_rounds: 3", "num_roundz: 3"))
    assert main(["--config", str(config), "--out", str(tmp_path / "app")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_roundz" in err[0]
    assert not (tmp_path / "app").exists()


def test_secagg_turns_secure_aggregation_on_in_the_run_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, "scaffold")
    assert main(["--config", str(config), "--out", "app", "--secagg", "--insecure"]) == 0
    settings = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert settings["secagg"] is True and settings["secagg-clipping-range"] == 8.0
    assert settings["secagg-quantization-range"] == 2**22


def test_a_used_directory_is_refused(tmp_path, capsys):
    config = write_config(tmp_path)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("x")
    assert main(["--config", str(config), "--out", str(tmp_path / "used")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["keep.txt"]


def test_the_command_is_registered_for_the_cli():
    """`lightning-fed flower-app` reaches the writer through the `lightning_fed.commands` entry points."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["lightning_fed.commands"] == {
        "flower-app": "lightning_fed.deploy.app:main",
        "deploy-keys": "lightning_fed.deploy.keys:main",
    }
    installed = extra_commands().get("flower-app")
    if installed is None:
        pytest.skip("the installed lightning-fed predates the flower-app entry point: `pip install -e .` again")
    assert installed.value == "lightning_fed.deploy.app:main"


@pytest.mark.parametrize(
    ("command", "argv"),
    [("deploy-keys", ["--out", "keys", "--sites", "2"]), ("flower-app", ["--roster", "roster.json"])],
)
def test_without_the_flower_extra_the_key_commands_say_which_extra_in_one_line(
    tmp_path, monkeypatch, capsys, command, argv
):
    # cryptography as if not installed (the base install): the commands that need it name the extra, no traceback.
    for name in [name for name in sys.modules if name.split(".")[0] == "cryptography"] + ["cryptography"]:
        monkeypatch.setitem(sys.modules, name, None)
    for module in ("lightning_fed.deploy.keys", "lightning_fed.deploy.roster"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    config = write_config(tmp_path)
    (tmp_path / "roster.json").write_text('{"clients": {"0": "ecdsa-sha2-nistp384 AAAA"}}')
    monkeypatch.chdir(tmp_path)
    extra = ["--config", str(config), "--out", str(tmp_path / "app")] if command == "flower-app" else []
    assert run_extra_command(command, [*extra, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"lightning-fed {command}: "), err
    assert "`cryptography`" in err[0] and "pip install 'lightning-fed[flower]'" in err[0], err
    assert not (tmp_path / "keys").exists() and not (tmp_path / "app").exists()
