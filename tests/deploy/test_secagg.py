"""Secure aggregation: Flower's SecAgg+ (its real client mod and server workflow, in this process) carries the round's
sums; the deployed model stays within the fixed point's error of the plain fit, repeats to the bit, and algorithms
that need more than sums are refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.flower_configs import fitted_model, write_config

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from flwr.supercore.task_identity import TaskIdentity

from lightning_fed.deploy.app import main, write_app
from lightning_fed.deploy.config import build_from_config
from lightning_fed.deploy.flower import GridTransport, InProcessGrid, SecureGridTransport, client_app, server_context
from lightning_fed.deploy.secure_sum import quantisation_bound
from lightning_fed.deploy.server import serve

NUM_CLIENTS = 3
CLIP, LEVELS = 8.0, 2**22


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Flower builds messages inside a task (the ServerApp process sets its identity): pretend to be one."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def _config(tmp_path: Path, algorithm: str, rounds: int) -> Path:
    config = write_config(tmp_path, algorithm)
    config.write_text(config.read_text().replace("num_rounds: 3", f"num_rounds: {rounds}"))
    return config


def _deployed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Path, name: str, **transport: Any
) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any]:
    """The model, summary.json and datamodule of a deployment of ``config`` over SecAgg+ (``plain=True``: without)
    with 3 in-process sites."""
    app = write_app([config], tmp_path / f"{name}-app", secagg=True)
    monkeypatch.syspath_prepend(str(app))  # where the ClientApp finds the app's config.yaml
    server = tmp_path / f"{name}-server"
    server.mkdir()
    monkeypatch.chdir(server)
    module, datamodule, trainer = build_from_config([app / "config.yaml"], save_config_callback=None)
    grid: Any = InProcessGrid(client_app, NUM_CLIENTS, tmp_path / f"{name}-sites", transport.pop("failing", ()))
    plain = transport.pop("plain", False)
    serve(
        trainer,
        module,
        datamodule,
        GridTransport(grid) if plain else SecureGridTransport(grid, server_context(), **transport),
    )
    (run_dir,) = (server / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    return _model(module), summary, datamodule


def _model(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in a)


def _accuracy(state: dict[str, torch.Tensor], config: Path, datamodule: Any) -> float:
    module, _, _ = build_from_config([config], save_config_callback=None)
    module.load_state_dict(state)
    module.eval()
    correct = total = 0
    with torch.no_grad():
        for inputs, labels in datamodule.test_dataloader():
            correct += int((module(inputs).argmax(dim=1) == labels).sum())
            total += len(labels)
    return 100.0 * correct / total


def test_one_round_is_within_the_quantisation_bound_of_the_plain_fit(tmp_path, monkeypatch):
    config = _config(tmp_path, "fedavg", rounds=1)
    secure, summary, _ = _deployed(tmp_path, monkeypatch, config, "secagg")
    plain = fitted_model(config, tmp_path / "fit")
    assert summary["completed_rounds"] == 1 and summary["rejected_clients_total"] == 0
    # Each client's p_i * w_i moves by less than one grid step, and so does its weight p_i, by which FedAvg divides.
    step_error = quantisation_bound(NUM_CLIENTS, CLIP, LEVELS)
    largest_weight = max(float(value.abs().max()) for value in plain.values() if value.is_floating_point())
    difference = _largest_difference(secure, plain)
    assert 0.0 < difference <= step_error * (1.0 + largest_weight) * 1.01


def test_three_rounds_stay_within_1e4_and_half_an_accuracy_point_and_repeat_to_the_bit(tmp_path, monkeypatch):
    config = _config(tmp_path, "fedavg", rounds=3)
    first, _, datamodule = _deployed(tmp_path, monkeypatch, config, "first")
    second, _, _ = _deployed(tmp_path, monkeypatch, config, "second")
    plain = fitted_model(config, tmp_path / "fit")
    assert all(torch.equal(first[name], second[name]) for name in first), "two seeded runs differ"
    assert _largest_difference(first, plain) <= 1e-4
    assert abs(_accuracy(first, config, datamodule) - _accuracy(plain, config, datamodule)) <= 0.5


def test_scaffold_s_control_sums_travel_masked(tmp_path, monkeypatch):
    config = _config(tmp_path, "scaffold", rounds=2)
    secure, summary, _ = _deployed(tmp_path, monkeypatch, config, "scaffold")
    plain = fitted_model(config, tmp_path / "fit")
    assert summary["completed_rounds"] == 2 and summary["rejected_clients_total"] == 0
    assert _largest_difference(secure, plain) <= 1e-4


def test_a_site_beyond_the_fixed_point_range_rejects_its_update_and_says_which_setting(tmp_path, monkeypatch, capsys):
    config = _config(tmp_path, "fedavg", rounds=1)
    initial, _, _ = build_from_config([config], save_config_callback=None)
    before = _model(initial)
    secure, summary, _ = _deployed(tmp_path, monkeypatch, config, "clipped", clipping_range=1e-3)
    # Every site's weights exceed ±0.001: all reject, nothing is aggregated, and none was clipped into the model.
    assert summary["rejected_clients_total"] == NUM_CLIENTS
    assert all(torch.equal(secure[name], before[name]) for name in before)
    printed = capsys.readouterr()
    assert "beyond secure aggregation's fixed-point range ±0.001; raise `secagg-clipping-range`" in printed.err
    # The server says why each was rejected.
    assert "Client 0's update of round 0 was rejected: `_sum` of aggregator reaches" in printed.out


def test_a_site_that_fails_while_training_is_dropped_and_the_others_are_still_summed(tmp_path, monkeypatch):
    """SecAgg+ rebuilds the failed node's masks from the others' shares, so the two live sites' sum is exact."""
    config = _config(tmp_path, "fedavg", rounds=1)
    secure, summary, _ = _deployed(tmp_path, monkeypatch, config, "down", failing=[2])
    plain, _, _ = _deployed(tmp_path, monkeypatch, config, "plain", failing=[2], plain=True)
    initial, _, _ = build_from_config([config], save_config_callback=None)
    assert summary["rejected_clients_total"] == 1
    assert summary["history"][-1]["clients/dropped"] == 1.0
    assert _largest_difference(secure, _model(initial)) > 1e-3  # the two live sites moved the model...
    assert _largest_difference(secure, plain) <= 1e-4  # ...as they do without secure aggregation


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        (
            "  aggregator:\n    class_path: lightning_fed.aggregators.Krum\n    init_args:\n      num_byzantine: 0\n"
            "  callbacks: []\n",
            "Krum (aggregator) cannot run under secure aggregation",
        ),
        (
            "  callbacks:\n    - class_path: lightning_fed.callbacks.FedAMP\n",
            "FedAMP (callback-0-FedAMP) cannot be deployed",
        ),
    ],
)
def test_algorithms_that_need_more_than_sums_are_refused_before_anything_is_written(
    tmp_path, capsys, snippet, expected
):
    config = write_config(tmp_path, "fedavg")
    config.write_text(config.read_text().replace("  callbacks: []\n", snippet))
    assert main(["--config", str(config), "--out", str(tmp_path / "app"), "--secagg"]) == 2
    error = capsys.readouterr().err.strip()
    assert expected in error and len(error.splitlines()) == 1
    assert not (tmp_path / "app").exists()
