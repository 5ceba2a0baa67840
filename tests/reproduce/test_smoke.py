"""The whole pipeline on the smoke profile (one round, tiny data), the command's entry points and the W&B report."""

import importlib
import json
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from benchmarks.reproduce import command
from benchmarks.reproduce.claims import CLAIMS, NO_VERDICT
from benchmarks.reproduce.dashboard import log_report
from benchmarks.reproduce.report import Report
from benchmarks.reproduce.rules import Verdict
from benchmarks.reproduce.runner import WandbOptions

# The module, not the function `lightning_fed.cli.main` that the package re-exports under the same name.
cli = importlib.import_module("lightning_fed.cli.main")

ROOT = Path(__file__).parents[2]


def _benchmarks_project() -> dict:
    """``benchmarks/pyproject.toml``'s ``[project]``, which ``pip install -e benchmarks/`` installs."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    return tomllib.loads((ROOT / "benchmarks" / "pyproject.toml").read_text())["project"]


def _declared_reproduce() -> EntryPoint:
    """``reproduce`` as ``benchmarks/pyproject.toml`` declares it."""
    project = _benchmarks_project()
    value = project["entry-points"][cli.COMMANDS_GROUP]["reproduce"]
    return EntryPoint(name="reproduce", value=value, group=cli.COMMANDS_GROUP)


def _installed(monkeypatch, *commands: EntryPoint) -> None:
    """As if the distributions declaring ``commands`` (and no others) were installed."""
    monkeypatch.setattr(cli, "entry_points", lambda group: [c for c in commands if c.group == group])


@pytest.mark.slow
def test_smoke_profile_end_to_end(tmp_path, monkeypatch, capsys):
    # The FMNIST presets read `data/` relative to the working directory, as `lightning-fed fit` does from the root.
    monkeypatch.chdir(ROOT)
    code = command.main(["--profile", "smoke", "--in-process", "--no-wandb", "--out-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed

    report = (tmp_path / "REPRODUCTION.md").read_text()
    for claim in CLAIMS:
        assert f"| {claim.number} | {claim.text} |" in report
    assert "FAILED" not in report
    payload = json.loads((tmp_path / "reproduction.json").read_text())
    assert all(run["status"] == "ok" for run in payload["runs"])
    # One round cannot show round-to-round stability; every other claim gets a verdict from the smoke runs.
    no_verdict = {claim["key"] for claim in payload["claims"] if claim["verdict"] == NO_VERDICT}
    assert no_verdict == {"rfedavg_sim0"}
    expected = {f"curves_{claim.key}.png" for claim in CLAIMS if claim.curves} | {
        "accuracy_vs_emd.png",
        "accuracy_vs_beta.png",
        "client_accuracy_pathological.png",
        "client_accuracy_practical.png",
        "xi_pathological_fedamp.png",
        "xi_practical_fedamp.png",
    }
    drawn = {path.name for path in tmp_path.glob("*.png")}
    assert expected <= drawn
    assert all(f"]({name})" in report for name in expected)
    assert "[reproduce] report:" in printed


def test_lightning_fed_reproduce_dispatches_before_lightning_cli(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(ROOT)
    _installed(monkeypatch, _declared_reproduce())
    monkeypatch.setattr(
        sys,
        "argv",
        ["lightning-fed", "reproduce", "--profile", "small", "--claims", "5", "--list", "--out-dir", str(tmp_path)],
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    # Claim 5 reads two runs, each under the small profile's three seeds.
    assert len(lines) == 6 and all(line.startswith("lightning-fed fit --config configs/experiments/") for line in lines)
    assert sorted(line.split("--seed_everything ")[1].split()[0] for line in lines) == ["0", "0", "1", "1", "2", "2"]
    assert "--trainer.logger lightning_fed.loggers.WandbLogger" in lines[0]
    assert not (tmp_path / "runs").exists(), "--list must not start any run"


def test_reproduce_rejects_an_unknown_profile(capsys):
    with pytest.raises(SystemExit):
        command.main(["--profile", "huge"])
    assert "--profile" in capsys.readouterr().err


def test_report_is_logged_to_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    figure = tmp_path / "curves_x.png"
    from lightning_fed.plots import plot_round_curves, save_figure

    save_figure(plot_round_curves([{"round": 1, "acc": 0.5}], ["acc"]), figure)
    claims = CLAIMS[:1]
    report = Report(tmp_path / "REPRODUCTION.md", {claims[0].key: Verdict("partly", "x")}, [figure])
    log_report(report, claims, WandbOptions("lightning-fed-test", "smoke"), tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))


def test_the_benchmarks_distribution_declares_reproduce_and_its_console_script():
    project = _benchmarks_project()
    assert _declared_reproduce().load() is command.main
    module, _, function = project["scripts"]["lightning-fed-reproduce"].partition(":")
    assert getattr(importlib.import_module(module), function) is command.entry_point


def test_reproduce_without_the_benchmarks_installed_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _installed(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["lightning-fed", "reproduce", "--profile", "smoke"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "pip install -e benchmarks/" in err
    assert not (tmp_path / "runs").exists()


def test_an_extra_command_cannot_replace_a_lightning_subcommand(monkeypatch):
    _installed(monkeypatch, EntryPoint(name="fit", value="benchmarks.reproduce.command:main", group=cli.COMMANDS_GROUP))
    assert "fit" not in cli.extra_commands()
    assert cli.run_extra_command("fit", []) is None


def test_the_cli_never_imports_the_benchmarks():
    # `lightning-fed` finds `reproduce` through the entry points only; the suite imports the CLI, not the reverse.
    source = Path(cli.__file__).read_text()
    assert "benchmarks" not in source.replace("benchmarks/", "") and "sys.path" not in source


def test_benchmarks_script_runs_the_suite():
    import subprocess

    # Run as `python benchmarks/reproduce.py`, as the README shows; --list prints the commands without running.
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "reproduce.py"),
            "--profile",
            "small",
            "--claims",
            "5",
            "--list",
            "--no-wandb",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("lightning-fed fit --config configs/experiments/")
