"""The CIFAR-10 and LEAF presets run end to end through the CLI on tiny data the tests write (no download): one round
of FedAvg and one of FedProx per reference model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torchvision
from helpers.tiny_data import write_cifar10, write_femnist, write_sent140, write_shakespeare

from lightning_fed.cli.main import FederatedCLI

CONFIGS = Path(__file__).parents[2] / "configs"
FEDPROX = "trainer:\n  callbacks:\n    - class_path: lightning_fed.callbacks.FedProx\n      init_args: {mu: 0.01}\n"


def _leaf_args(root: Path) -> list[str]:
    return ["--data.init_args.leaf_dir", str(root), "--data.init_args.num_clients", "3"]


# preset, data writer, overrides that shrink the model and data to test size
CASES = {
    "sent140_lstm": (
        "leaf/sent140_lstm.yaml",
        lambda root: _leaf_args(write_sent140(root)),
        ["--data.init_args.vocab_size", "40", "--model.init_args.backbone.init_args.vocab_size", "40"]
        + ["--model.init_args.backbone.init_args.embedding_dim", "8"]
        + ["--model.init_args.backbone.init_args.hidden_dim", "8"],
    ),
    "shakespeare_char_lstm": (
        "leaf/shakespeare_char_lstm.yaml",
        lambda root: _leaf_args(write_shakespeare(root, seq_length=12)),
        ["--data.init_args.seq_length", "12", "--model.init_args.backbone.init_args.hidden_dim", "16"],
    ),
    "femnist_cnn": ("leaf/femnist_cnn.yaml", lambda root: _leaf_args(write_femnist(root)), []),
    "cifar10_vgg16": (
        "cifar10/fedavg_vgg16_shards.yaml",
        lambda root: ["--data.init_args.data_dir", str(write_cifar10(root)), "--data.init_args.download", "false"],
        ["--data.init_args.partitioner.init_args.num_partitions", "3"]
        + ["--model.init_args.backbone.init_args.width_multiplier", "0.0625"],
    ),
    "cifar10_cnn": (
        "cifar10/fedavg_cnn_dirichlet.yaml",
        lambda root: ["--data.init_args.data_dir", str(write_cifar10(root)), "--data.init_args.download", "false"],
        ["--data.init_args.partitioner.init_args.num_partitions", "3"]
        + ["--data.init_args.partitioner.init_args.min_partition_size", "5"],
    ),
}


@pytest.fixture
def unchecked_md5(monkeypatch):
    """torchvision verifies CIFAR's real MD5 sums, which small test files cannot match; keep the existence check."""
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())


# Each reference model (VGG-16, the Sent140 LSTM, the char-LSTM) under FedAvg and FedProx; the presets of the
# models that other tests already train (FedAvg's CNN) under FedAvg only.
RUNS = [
    (case, algorithm)
    for case in ("cifar10_vgg16", "sent140_lstm", "shakespeare_char_lstm")
    for algorithm in ("fedavg", "fedprox")
]
RUNS += [("femnist_cnn", "fedavg"), ("cifar10_cnn", "fedavg")]


@pytest.mark.usefixtures("unchecked_md5")
@pytest.mark.parametrize(("case", "algorithm"), RUNS)
def test_preset_runs_one_round_on_tiny_data(case: str, algorithm: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["lightning-fed"])  # LightningCLI warns when pytest's own arguments are there
    preset, write, shrink = CASES[case]
    configs = ["--config", str(CONFIGS / preset)]
    if algorithm == "fedprox":
        (tmp_path / "fedprox.yaml").write_text(FEDPROX)
        configs += ["--config", str(tmp_path / "fedprox.yaml")]
    run_dir = tmp_path / "run"
    FederatedCLI(
        args=[
            "fit",
            *configs,
            *write(tmp_path / "data"),
            *shrink,
            "--data.init_args.batch_size",
            "4",
            "--trainer.num_rounds",
            "1",
            "--trainer.clients_per_round",
            "2",
            "--trainer.accelerator",
            "cpu",
            "--trainer.logger",
            "false",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.run_dir",
            str(run_dir),
        ]
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed_rounds"] == 1
    assert 0.0 <= summary["final"]["global/test_acc"] <= 1.0
    history = summary["history"][0]
    assert math.isfinite(history["train/loss"]) and history["clients/sampled"] == 2 and history["clients/rejected"] == 0
    # FedProx logs its proximal term; in round 0 each client starts at w_g, so it is small but present.
    assert ("train/fedprox_proximal" in history) == (algorithm == "fedprox")
