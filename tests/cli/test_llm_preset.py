"""The foundation-model preset (configs/llm/lora_synthetic.yaml) trains unchanged through the CLI, its loss falling;
without the `llm` extra the CLI says, in one line, which extra to install."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from lightning_fed.cli.main import FederatedCLI, main

PRESET = Path(__file__).parents[2] / "configs" / "llm" / "lora_synthetic.yaml"
LLM_EXTRA = "needs the `llm` extra (pip install 'lightning-fed[llm]')"


def test_the_preset_trains_from_yaml_and_its_loss_falls(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("transformers", reason=LLM_EXTRA)
    pytest.importorskip("peft", reason=LLM_EXTRA)
    monkeypatch.setattr("sys.argv", ["lightning-fed"])  # LightningCLI warns when pytest's own arguments are there
    FederatedCLI(args=["fit", "--config", str(PRESET), "--trainer.default_root_dir", str(tmp_path)])
    printed = capsys.readouterr().out
    summary_line = next(line for line in printed.splitlines() if line.startswith("[lightning_fed] summary: "))
    summary = json.loads(Path(summary_line.split(": ", 1)[1]).read_text())
    losses = [entry["global/test_loss"] for entry in summary["history"]]
    assert summary["completed_rounds"] == 4 and len(losses) == 4
    # A random-init classifier of 4 classes starts near log 4 = 1.39; after the first round's 4 clients it is below,
    # and every later round lowers it further, to under a tenth of it.
    assert losses[0] < math.log(4)
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.1 * losses[0], losses
    assert summary["final"]["global/test_acc"] > 0.95


def test_a_datasets_dataset_saved_to_disk_trains_from_yaml(tmp_path, capsys, monkeypatch) -> None:
    datasets = pytest.importorskip("datasets", reason=LLM_EXTRA)
    pytest.importorskip("transformers", reason=LLM_EXTRA)
    pytest.importorskip("peft", reason=LLM_EXTRA)
    from lightning_fed.datamodules import IidPartitioner, TokenPatternsFederated

    monkeypatch.setattr("sys.argv", ["lightning-fed"])
    # A user's tokenised splits, saved with `save_to_disk`; the YAML names their directories.
    for split, dataset in zip(
        ("train", "test"), TokenPatternsFederated(IidPartitioner(1), num_samples=240)._load_datasets()
    ):
        rows = {"input_ids": dataset.input_ids.tolist(), "attention_mask": dataset.attention_mask.tolist()}
        datasets.Dataset.from_dict({**rows, "label": dataset.targets.tolist()}).save_to_disk(str(tmp_path / split))
    data = tmp_path / "data.yaml"
    data.write_text(
        "data:\n"
        "  class_path: lightning_fed.datamodules.HFDatasetFederated\n"
        "  init_args:\n"
        f"    train_dataset: {tmp_path / 'train'}\n"
        f"    test_dataset: {tmp_path / 'test'}\n"
        "    label_column: label\n"
        "    partitioner:\n"
        "      class_path: lightning_fed.datamodules.DirichletPartitioner\n"
        "      init_args: {num_partitions: 3, alpha: 1.0, seed: 0}\n"
    )
    FederatedCLI(
        args=["fit", "--config", str(PRESET), "--config", str(data), "--trainer.num_rounds", "2"]
        + ["--trainer.clients_per_round", "3", "--trainer.default_root_dir", str(tmp_path / "run")]
    )
    printed = capsys.readouterr().out
    summary_line = next(line for line in printed.splitlines() if line.startswith("[lightning_fed] summary: "))
    summary = json.loads(Path(summary_line.split(": ", 1)[1]).read_text())
    assert summary["completed_rounds"] == 2 and summary["num_clients"] == 3
    losses = [entry["global/test_loss"] for entry in summary["history"]]
    assert losses[1] < losses[0] < math.log(4), losses


def test_without_the_extra_the_cli_names_it_in_one_line(tmp_path, capsys, monkeypatch) -> None:
    # `import transformers` (the first the module needs) now fails as if it were not installed.
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(PRESET), "--trainer.default_root_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    first = err.splitlines()[0]
    assert first == (
        "lightning-fed fit: HFLoRAModule needs `transformers`, which is not installed: install the `llm` extra"
        " (`pip install 'lightning-fed[llm]'`)."
    ), err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists(), "nothing is written before the checks pass"
