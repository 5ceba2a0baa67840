"""Files a run writes are replaced whole or not at all: an interrupted write or a full disk leaves the old file."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from lightning_fed.run.checkpoint_io import AtomicCheckpointIO
from lightning_fed.utilities.atomic import DiskFullError, atomic_write, write_text_atomic


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_a_write_interrupted_before_its_rename_leaves_the_old_summary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_text_atomic(path, json.dumps({"round": 1}))
    monkeypatch.setattr(os, "replace", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, json.dumps({"round": 2}))
    assert json.loads(path.read_text()) == {"round": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left behind


def test_a_checkpoint_write_interrupted_before_its_rename_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "round0000.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state": torch.ones(3)}, path)
    monkeypatch.setattr(os, "replace", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state": torch.zeros(3)}, path)
    assert torch.equal(io.load_checkpoint(path)["state"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["round0000.ckpt"]


def test_a_new_file_gets_ordinary_permissions_and_a_replaced_one_keeps_its_own(tmp_path):
    path = atomic_write(tmp_path / "a" / "config.yaml", lambda stream: stream.write(b"x: 1\n"))
    assert path.read_text() == "x: 1\n" and path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o600)
    write_text_atomic(path, "x: 2\n")
    assert path.read_text() == "x: 2\n" and path.stat().st_mode & 0o777 == 0o600


def test_a_full_disk_keeps_the_previous_round_checkpoint_resumable(tmp_path, monkeypatch):
    dm = make_datamodule(num_clients=3)
    saves = []

    def save_until_the_disk_fills(obj, stream):
        saves.append(1)
        if len(saves) == 2:
            stream.write(b"partial checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, stream)

    real_save = torch.save
    monkeypatch.setattr(torch, "save", save_until_the_disk_fills)
    kwargs = dict(num_rounds=2, clients_per_round=3, enable_checkpointing=True, plugins=[AtomicCheckpointIO()])
    with pytest.raises(DiskFullError, match=r"The disk is full: writing round0001\.ckpt in .*checkpoints failed"):
        fast_trainer(tmp_path, **kwargs).fit(BoringClassifier(), datamodule=dm)
    monkeypatch.setattr(torch, "save", real_save)
    # The failed fit's run directory holds its checkpoints (one run in this root).
    (checkpoints,) = (tmp_path / "runs").glob("*/checkpoints")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "round0000.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["epoch"] == 0

    resumed = fast_trainer(tmp_path, **kwargs)
    resumed.fit(BoringClassifier(), datamodule=dm, ckpt_path="last")
    assert resumed.federation_state.completed_rounds == 2
    assert [entry["round"] for entry in resumed.federation_state.history] == [1.0, 2.0]
