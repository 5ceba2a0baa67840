"""A robust aggregator (NormBound over Multi-Krum) sharded over 2 CPU processes (``strategy="ddp"``, gloo) against
the same run in 1 process: the ranks gather every client's update, so they keep the same clients and reach the
same model as one process."""

from __future__ import annotations

from test_ddp_rounds import _assert_same_run, _launch, _one_process, _ranks, _wait

from lightning_fed.aggregators.normbound import CLIPPED_KEY
from lightning_fed.aggregators.robust import SKIPPED_KEY


def test_robust_aggregation_two_processes_equal_one(tmp_path):
    two_process = _launch(tmp_path / "ddp", "--algorithm", "robust")
    one = _one_process(tmp_path / "one", "robust")
    assert _wait(two_process) == 0, (tmp_path / "ddp" / "stderr.txt").read_text()[-4000:]
    two = _ranks(tmp_path / "ddp")
    _assert_same_run(two, one)
    # Each rank trained half of the clients, yet every rank selected from all six, as one process did.
    assert set(two[0]["client_models"]).isdisjoint(two[1]["client_models"])
    selected = two[0]["callback_states"][0]["selected"]
    assert selected == one["callback_states"][0]["selected"] and all(len(s) == 3 for s in selected)
    history = two[0]["history"]
    assert all(entry[SKIPPED_KEY] == 0.0 for entry in history)
    assert any(0.0 < entry[CLIPPED_KEY] < 1.0 for entry in history), [e[CLIPPED_KEY] for e in history]
