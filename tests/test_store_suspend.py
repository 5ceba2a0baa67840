"""Suspended store transactions: clients started one after another and decided after training together."""

from __future__ import annotations

import pytest
import torch

from lightning_fed import ClientStateStore


def test_rolling_back_one_suspended_client_keeps_the_others_writes():
    store = ClientStateStore()
    store.put("ns", 1, {"v": torch.tensor(1.0)})
    store.take_changes()
    store.begin()
    store.put("ns", 1, {"v": torch.tensor(10.0)})
    first = store.suspend()
    assert not store.in_transaction
    store.begin()
    store.put("ns", 2, {"v": torch.tensor(20.0)})
    second = store.suspend()
    store.resume(first)
    store.rollback()
    store.resume(second)
    store.commit()
    assert store.get("ns", 1)["v"].item() == 1.0 and store.get("ns", 2)["v"].item() == 20.0
    # Only the kept write is a change other ranks must receive.
    assert store.take_changes()["put"] == {"ns": {2: store.get("ns", 2)}}


def test_suspend_and_resume_refuse_a_wrong_state():
    store = ClientStateStore()
    with pytest.raises(RuntimeError, match="No ClientStateStore transaction"):
        store.suspend()
    store.begin()
    suspended = store.suspend()
    store.begin()
    with pytest.raises(RuntimeError, match="already open"):
        store.resume(suspended)
