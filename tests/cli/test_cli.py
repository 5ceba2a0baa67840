import json
from pathlib import Path

import pytest

from benchmarks.reproduce.experiments import REGISTRIES, TUNED_DIRS
from lightning_fed import FederatedTrainer
from lightning_fed.cli.main import FederatedCLI

# W&B sweep files (`*.sweep.yaml`) drive `lightning-fed fit`; they are not CLI configs themselves.
CONFIGS = sorted(
    p for p in (Path(__file__).parents[2] / "configs").rglob("*.yaml") if not p.name.endswith(".sweep.yaml")
)
# Composable presets are a setting file followed by a method file; a method file alone is not a config.
# Each folder of them maps to the setting its method files are checked on, and the setting files themselves.
CONFIG_ROOT = Path(__file__).parents[2] / "configs"
PERSONALIZED = CONFIG_ROOT / "fmnist" / "personalized"
FMNIST_CLAIMS = CONFIG_ROOT / "experiments" / "fmnist"
COMPOSABLE = {
    PERSONALIZED: (PERSONALIZED / "pathological.yaml", {"pathological", "practical", "iid"}),
    FMNIST_CLAIMS: (FMNIST_CLAIMS / "shards_e10.yaml", {"shards_e10", "sim0"}),
}


def config_args(config: Path) -> list[str]:
    for protocol, tuned_dir in TUNED_DIRS.items():
        if config.parent == CONFIG_ROOT.parent / tuned_dir:
            # A tuned preset holds only the searched settings; its run composes it after the run's own presets.
            composed = REGISTRIES[protocol][config.stem].configs
            return [arg for path in composed for arg in ("--config", str(CONFIG_ROOT.parent / path))]
    if config.parent in COMPOSABLE:
        setting, setting_names = COMPOSABLE[config.parent]
        if config.stem not in setting_names:
            return ["--config", str(setting), "--config", str(config)]
    return ["--config", str(config)]


QUICKSTART = Path(__file__).parents[2] / "configs" / "quickstart.yaml"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_config_parses_and_instantiates(config, tmp_path):
    if config.parent == CONFIG_ROOT / "llm":
        for module in ("transformers", "peft"):
            pytest.importorskip(module, reason="the foundation-model presets need the `llm` extra")
    cli = FederatedCLI(
        args=[*config_args(config), "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)], run=False
    )
    assert isinstance(cli.trainer, FederatedTrainer)
    assert cli.datamodule.num_clients >= 1
    assert cli.trainer.num_rounds >= 1


def test_quickstart_end_to_end_with_offline_wandb(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    FederatedCLI(
        args=[
            "fit",
            "--config",
            str(QUICKSTART),
            "--trainer.num_rounds",
            "2",
            "--trainer.local_epochs",
            "1",
            "--data.init_args.num_samples",
            "1000",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ]
    )
    printed = capsys.readouterr().out
    assert "[lightning_fed] final after 2 rounds: global/test_acc=" in printed
    summary_line = next(line for line in printed.splitlines() if line.startswith("[lightning_fed] summary: "))
    summary = json.loads(Path(summary_line.split(": ", 1)[1]).read_text())
    assert summary["completed_rounds"] == 2 and 0.0 <= summary["final"]["global/test_acc"] <= 1.0
    run_dir = Path(summary["run_dir"])
    assert run_dir.is_relative_to(tmp_path)
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B should have written an offline run in the run dir"
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    # The resolved config goes with the run, not into the working directory that every run shares.
    assert (Path(summary["run_dir"]) / "config.yaml").exists()
    assert not (tmp_path / "config.yaml").exists()


def test_print_config_shows_the_merged_settings(capsys):
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", "--config", str(QUICKSTART), "--trainer.num_rounds", "7", "--print_config"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "num_rounds: 7" in printed and "MNIST1DFederated" in printed


def test_unknown_yaml_key_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(QUICKSTART.read_text() + "\n  num_roundz: 3\n".replace("\n  ", "\ntrainer:\n  ", 1))
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", "--config", str(bad)])
    assert exit_info.value.code != 0
    assert "num_roundz" in capsys.readouterr().err


def test_aggregator_and_callbacks_are_configurable_from_yaml(tmp_path):
    extra = tmp_path / "algo.yaml"
    extra.write_text(
        "trainer:\n"
        "  aggregator:\n"
        "    class_path: lightning_fed.aggregators.FedAvg\n"
        "    init_args: {weighting: uniform, server_lr: 0.5}\n"
        "  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args: {monitor: val_loss, patience: 3}\n"
    )
    cli = FederatedCLI(
        args=["--config", str(QUICKSTART), "--config", str(extra), "--trainer.logger", "false"], run=False
    )
    assert cli.trainer.aggregator.weighting == "uniform" and cli.trainer.aggregator.server_lr == 0.5
    assert any(type(cb).__name__ == "EarlyStopping" for cb in cli.trainer.callbacks)
