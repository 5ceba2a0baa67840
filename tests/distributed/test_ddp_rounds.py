"""Rounds sharded over 2 CPU processes (``strategy="ddp"``, gloo) against the same run in 1 process.

Covered: FedAvg (momentum kept per client, BatchNorm with an integer buffer, dropout, a torchmetrics metric),
SCAFFOLD with FedCurv and rFedAvg v1 (per-client state and server sums), q-FedAvg with one declared round state of
each reduction, FedAMP (every w_j needed by every client), the "a little is enough" attack (the attackers' honest
updates gathered from every rank), clients trained side by side (``client_parallelism=2``, SCAFFOLD with momentum
and FedProx), a 2-process run SIGKILLed and resumed, and logging once.

The 2-process runs start as subprocesses of ``tests/helpers/distributed_run.py`` (Lightning relaunches the script
for rank 1), all at once, since most of their wall time is process start-up; the 1-process references run here.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.distributed_run import NUM_ROUNDS, fit, result
from helpers.resume import _equal

from lightning_fed.attacks import choose_malicious

# Two processes per test: the slow tier (`python -m pytest -q -m slow`, run by .ci/run).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "helpers" / "distributed_run.py"
ALGORITHMS = ("fedavg", "stateful", "qfedavg", "fedamp", "attacks", "batched")
KILL = ("2", "0")  # rank 0's first client of the last round: rounds 0 and 1 are checkpointed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(root: Path, *args: str) -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    log = open(root / "stderr.txt", "w")  # noqa: SIM115 - the child writes to it after this function returns
    # A session of its own: the kill test SIGKILLs its whole process group, as a crashed node would.
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(root), str(root / "out.pt"), "--devices", "2", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _wait(process: subprocess.Popen) -> int:
    try:
        return process.wait(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise


def _ranks(root: Path) -> list[dict[str, Any]]:
    return [torch.load(root / f"out.pt.rank{r}", weights_only=True) for r in range(2)]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ddp")
    launched = {name: _launch(base / name, "--algorithm", name) for name in ALGORITHMS}
    launched["killed"] = _launch(
        base / "killed", "--algorithm", "stateful", "--kill-round", KILL[0], "--kill-client-index", KILL[1]
    )
    codes = {name: _wait(process) for name, process in launched.items()}
    for name in ALGORITHMS:
        assert codes[name] == 0, (base / name / "stderr.txt").read_text()[-4000:]
    assert codes["killed"] == -signal.SIGKILL, (base / "killed" / "stderr.txt").read_text()[-4000:]
    killed_checkpoints = sorted(p.name for p in (base / "killed" / "run" / "checkpoints").iterdir())
    resumed = _launch(base / "killed", "--algorithm", "stateful", "--resume")
    assert _wait(resumed) == 0, (base / "killed" / "stderr.txt").read_text()[-4000:]
    runs = {name: _ranks(base / name) for name in ALGORITHMS}
    runs["resumed"] = _ranks(base / "killed")
    runs["killed_checkpoints"] = killed_checkpoints
    runs["base"] = base
    return runs


def _one_process(tmp_path: Path, name: str) -> dict[str, Any]:
    trainer, models = fit(str(tmp_path), 1, name)
    return result(trainer, models)


def _round_metrics(history: list[dict[str, float]]) -> list[dict[str, float]]:
    # Lightning's own validation loop logs per rank unless the module logs with sync_dist=True; wall time varies.
    return [{k: v for k, v in entry.items() if not k.startswith(("time/", "val_"))} for entry in history]


def _assert_close(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=where)
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            _assert_close(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a} != {b}"


def _assert_same_run(two: list[dict[str, Any]], one: dict[str, Any]) -> None:
    rank0, rank1 = two
    for key in ("weights", "store", "callback_states", "aggregator_state", "global_step"):
        assert _equal(rank0[key], rank1[key]), f"the ranks disagree on {key}"
    assert _equal(_round_metrics(rank0["history"]), _round_metrics(rank1["history"]))
    assert rank0["world_size"] == 2 and one["world_size"] == 1
    for key in ("weights", "store", "callback_states", "aggregator_state", "global_step"):
        _assert_close(rank0[key], one[key], key)
    _assert_close(_round_metrics(rank0["history"]), _round_metrics(one["history"]), "history")


def _assert_clients_split_and_unsynced(two: list[dict[str, Any]], one: dict[str, Any]) -> None:
    """Each client trained on exactly one rank, and round 0's local models are bit-identical to one process's.

    Round 0 starts every client from the same initial model with no collective before it, so any rank dependence
    of the data order or RNG, or a gradient all-reduce inside local training (DDP's reducer), would change them.
    """
    keys = [set(rank["client_models"]) for rank in two]
    assert keys[0] and keys[1] and not keys[0] & keys[1]
    assert keys[0] | keys[1] == set(one["client_models"])
    merged = {**two[0]["client_models"], **two[1]["client_models"]}
    round0 = [key for key in merged if key.startswith("0/")]
    assert len(round0) == 4
    for key in round0:
        for name, tensor in one["client_models"][key].items():
            assert torch.equal(merged[key][name], tensor), f"client {key} {name} differs from one process"


def test_fedavg_two_processes_equal_one(two_process_runs, tmp_path):
    one = _one_process(tmp_path, "fedavg")
    two = two_process_runs["fedavg"]
    _assert_same_run(two, one)
    _assert_clients_split_and_unsynced(two, one)
    # Momentum kept per client travels with the store to whichever rank trains the client next.
    assert len(two[0]["store"]["optimizer"]) == len(one["store"]["optimizer"]) > 4
    assert "client/test_metric_acc_mean" in two[0]["history"][-1]


def test_stateful_algorithms_two_processes_equal_one(two_process_runs, tmp_path):
    one = _one_process(tmp_path, "stateful")
    two = two_process_runs["stateful"]
    _assert_same_run(two, one)
    _assert_clients_split_and_unsynced(two, one)
    assert set(two[0]["store"]) == {"scaffold", "fedcurv", "rfedavg"}
    last = two[0]["history"][-1]
    assert last["scaffold/server_control_norm"] > 0 and last["train/fedcurv"] > 0 and last["train/rfedavg_reg"] > 0


def test_qfedavg_two_processes_equal_one(two_process_runs, tmp_path):
    one = _one_process(tmp_path, "qfedavg")
    _assert_same_run(two_process_runs["qfedavg"], one)
    assert "qfedavg/loss_at_global" in two_process_runs["qfedavg"][0]["history"][-1]
    # Declared round state (sum of tensors and numbers, merge, last) reduces to what one process holds, and that is
    # every client of the round, though each rank trained only some of them.
    reduced = two_process_runs["qfedavg"][0]["callback_states"][0]["reduced"]
    assert len(reduced) == NUM_ROUNDS and _equal(reduced, one["callback_states"][0]["reduced"])
    for entry in reduced:
        ids = entry["client_ids"]
        assert entry["count"] == len(ids) == 4 and sorted(entry["steps"]) == sorted(ids)
        assert entry["ids"].tolist() == [4.0, float(sum(ids))] and entry["weight"] == 0.5 * sum(ids)
        assert entry["last"][0] == 3 and entry["last"][1].item() == ids[-1]
        assert entry["samples"].dtype == torch.int64


def test_fedamp_two_processes_equal_one(two_process_runs, tmp_path):
    one = _one_process(tmp_path, "fedamp")
    two = two_process_runs["fedamp"]
    _assert_same_run(two, one)
    # Every client has its personalised model on every rank, and is evaluated with it.
    assert len(two[1]["store"]["fedamp"]) == 6
    assert "personal/test_acc_mean" in two[0]["history"][-1]


def test_alie_attack_two_processes_equal_one(two_process_runs, tmp_path):
    one = _one_process(tmp_path, "attacks")
    two = two_process_runs["attacks"]
    _assert_same_run(two, one)
    # In some round both ranks trained attackers, so each needed the other's honest updates for mu and sigma.
    malicious = set(choose_malicious(two[0]["seed"], 6, 0.5))
    by_rank = [{tuple(map(int, key.split("/"))) for key in rank["client_models"]} for rank in two]
    rounds_on_both = [
        r for r in range(NUM_ROUNDS) if all(any(rr == r and cid in malicious for rr, cid in keys) for keys in by_rank)
    ]
    assert rounds_on_both
    assert all(entry["attack/malicious_sampled"] >= 1 for entry in two[0]["history"])


def test_batched_clients_two_processes_equal_one(two_process_runs, tmp_path):
    one = _one_process(tmp_path, "batched")
    two = two_process_runs["batched"]
    assert one["client_group_size"] == two[0]["client_group_size"] == two[1]["client_group_size"] == 2
    _assert_same_run(two, one)


def test_killed_two_process_run_resumes_bit_identical(two_process_runs):
    assert two_process_runs["killed_checkpoints"] == ["last.ckpt", "round0000.ckpt", "round0001.ckpt"]
    resumed, reference = two_process_runs["resumed"], two_process_runs["stateful"]
    for rank in range(2):
        # Only the rounds after the checkpoint ran again.
        assert {key.split("/")[0] for key in resumed[rank]["client_models"]} == {KILL[0]}
        for key in ("weights", "store", "callback_states", "aggregator_state", "global_step"):
            assert _equal(resumed[rank][key], reference[rank][key]), f"rank {rank}: {key} differs after resume"
        assert _equal(_round_metrics(resumed[rank]["history"]), _round_metrics(reference[rank]["history"]))


def test_rounds_are_logged_and_summarised_once(two_process_runs):
    root = two_process_runs["base"] / "fedavg"
    logged = [[json.loads(line) for line in (root / f"log_rank{r}.jsonl").read_text().splitlines()] for r in range(2)]
    assert sum("round" in keys for keys in logged[0]) == NUM_ROUNDS
    assert not any("round" in keys for keys in logged[1])
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["completed_rounds"] == NUM_ROUNDS and len(summary["final_client_metrics"]) == 6
