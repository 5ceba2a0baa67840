import signal
import subprocess

import pytest
import torch
from helpers.resume import assert_resume_bit_identical, run_script


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_script(*args)


def _assert_identical(resumed: dict, reference: dict) -> None:
    for name, tensor in reference["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), f"{name} differs after resume"
    assert resumed["clients_seen"] == reference["clients_seen"]
    stripped = [{k: v for k, v in entry.items() if not k.startswith("time/")} for entry in resumed["history"]]
    assert stripped == [{k: v for k, v in entry.items() if not k.startswith("time/")} for entry in reference["history"]]
    assert torch.equal(resumed["store"]["counter"]["0"]["visits"], reference["store"]["counter"]["0"]["visits"])
    assert resumed["store"]["optimizer"].keys() == reference["store"]["optimizer"].keys()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("uninterrupted")
    done = _run(str(root), str(root / "out.pt"))
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(root / "out.pt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize(("kill_round", "client_index"), [(0, 1), (1, 0), (3, 2)])
def test_sigkilled_run_resumes_bit_identical(tmp_path, reference, kill_round, client_index):
    killed = _run(
        str(tmp_path),
        str(tmp_path / "never.pt"),
        "--kill-round",
        str(kill_round),
        "--kill-client-index",
        str(client_index),
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "never.pt").exists()
    resumed = _run(str(tmp_path), str(tmp_path / "out.pt"), "--resume")
    if kill_round == 0:
        # Killed before its first checkpoint: `last` has nothing to resume and says so rather than start afresh;
        # the run is started again.
        assert resumed.returncode != 0 and "nothing to resume" in resumed.stderr
        resumed = _run(str(tmp_path), str(tmp_path / "out.pt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = torch.load(tmp_path / "out.pt", weights_only=True)
    # Killed in round k, the last checkpoint holds rounds 0..k-1: only rounds k.. run again.
    assert result["rounds_run_here"] == 4 - kill_round
    _assert_identical(result, reference)


def test_checkpoint_loads_with_weights_only(tmp_path, reference):
    killed = _run(str(tmp_path), str(tmp_path / "never.pt"), "--kill-round", "1", "--kill-client-index", "0")
    assert killed.returncode == -signal.SIGKILL
    (run_dir,) = (tmp_path / "runs").iterdir()
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # links to round0000.ckpt
    federated = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["federated"]
    assert federated["state"]["completed_rounds"] == 1
    assert set(federated["state"]["store"]) == {"counter", "optimizer"}
    assert federated["sampler"]["seed"] == 0


@pytest.mark.slow
def test_resume_with_a_stateful_aggregator_and_penalty(tmp_path):
    result = assert_resume_bit_identical(
        tmp_path, "--aggregator", 'lightning_fed.aggregators.FedAvg={"server_lr": 0.7}', kill_round=2, client_index=0
    )
    assert result["aggregator_state"] == {}
