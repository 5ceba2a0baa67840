"""A checkpoint is verified before it is resumed: a truncated or bit-flipped file is refused or skipped for the
previous round's (the last two are kept); `last` skips a damaged run of another configuration; a run directory is
written by one process at a time."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from lightning_fed import FedCallback
from lightning_fed.run.integrity import CorruptCheckpointError, read_checkpoint
from lightning_fed.run.lock import LOCK_NAME, RunLock, RunLockedError
from lightning_fed.run.resume import ResumeError

HOLD_SCRIPT = Path(__file__).parents[1] / "helpers" / "hold_run.py"


def _fit(root, lr=0.1, ckpt_path=None, **kwargs):
    settings = dict(num_rounds=1, seed=0, enable_checkpointing=True, limit_val_batches=0)
    settings.update(kwargs)
    trainer = fast_trainer(root, **settings)
    trainer.fit(BoringClassifier(lr=lr), datamodule=make_datamodule(), ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory):
    """A root holding one finished 2-round run (lr 0.1): its two round checkpoints and `last.ckpt`."""
    root = tmp_path_factory.mktemp("root")
    return root, _fit(root, num_rounds=2).fed_run_dir


@pytest.fixture
def run(two_rounds, tmp_path):
    """A copy of the finished run in a root of its own, to damage."""
    root, run_dir = two_rounds
    copy = tmp_path / "runs" / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True)
    return tmp_path, copy


def _flip_a_weight_byte(path: Path) -> None:
    """Flips one byte inside the largest tensor entry (stored uncompressed), leaving the zip directory intact."""
    with zipfile.ZipFile(path) as archive:
        entry = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    # The local header: 30 bytes, then the name and the extra field, whose lengths it stores at offsets 26 and 28.
    start = entry.header_offset
    name_length = int.from_bytes(data[start + 26 : start + 28], "little")
    extra_length = int.from_bytes(data[start + 28 : start + 30], "little")
    offset = start + 30 + name_length + extra_length + entry.file_size // 2
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_the_last_two_rounds_are_kept(two_rounds):
    _, run_dir = two_rounds
    checkpoints = run_dir / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["last.ckpt", "round0000.ckpt", "round0001.ckpt"]
    assert (checkpoints / "last.ckpt").resolve() == (checkpoints / "round0001.ckpt").resolve()


def test_a_bit_flip_loads_silently_in_torch_but_fails_the_crc_check(run):
    _, run_dir = run
    newest = run_dir / "checkpoints" / "round0001.ckpt"
    _flip_a_weight_byte(newest)
    torch.load(newest, weights_only=True)  # what resumed silently before
    with pytest.raises(CorruptCheckpointError, match="fails its CRC check"):
        read_checkpoint(newest)


@pytest.mark.parametrize("damage", [_flip_a_weight_byte, _truncate], ids=["bit-flip", "truncated"])
def test_a_corrupt_newest_checkpoint_resumes_from_the_previous_round(run, damage):
    root, run_dir = run
    damage(run_dir / "checkpoints" / "round0001.ckpt")
    with pytest.warns(UserWarning, match=r"corrupt checkpoint .*round0001\.ckpt.*previous intact one, .*round0000"):
        trainer = _fit(root, num_rounds=2, ckpt_path="last")
    assert trainer.fed_run_dir == run_dir
    assert [entry["round"] for entry in trainer.federation_state.history] == [1.0, 2.0], "round 2 was trained again"


def test_a_corrupt_file_named_by_the_user_is_refused_in_one_line_offering_an_intact_one(run):
    root, run_dir = run
    newest = run_dir / "checkpoints" / "round0001.ckpt"
    _truncate(newest)
    before = sorted(path.name for path in run_dir.rglob("*"))
    with pytest.raises(ResumeError) as error:
        _fit(root, num_rounds=3, ckpt_path=str(newest))
    message = str(error.value)
    assert "\n" not in message and f"Cannot resume from {newest}: it cannot be read as a checkpoint" in message
    assert f"--ckpt_path {run_dir / 'checkpoints' / 'round0000.ckpt'}" in message
    assert sorted(path.name for path in run_dir.rglob("*")) == before, "a refused resume writes nothing"


def test_a_run_without_an_intact_checkpoint_is_refused_in_one_line(run):
    root, run_dir = run
    _truncate(run_dir / "checkpoints" / "round0000.ckpt")
    _flip_a_weight_byte(run_dir / "checkpoints" / "round0001.ckpt")  # the newer one, by its time
    with pytest.raises(ResumeError) as error:
        _fit(root, num_rounds=3, ckpt_path=run_dir.name)
    message = str(error.value)
    assert (
        "\n" not in message
        and "last.ckpt (a link to round0001.ckpt): its entry" in message
        and "no earlier intact checkpoint" in message
    )
    assert "start a new run" in message


def test_last_skips_an_unreadable_run_of_another_configuration(run):
    root, good = run
    damaged = _fit(root, lr=0.2).fed_run_dir  # newer, another configuration
    for path in (damaged / "checkpoints").glob("round*.ckpt"):
        _truncate(path)
    with pytest.warns(UserWarning, match=rf"skips run {damaged.name}: none of its checkpoints can be read"):
        trainer = _fit(root, num_rounds=3, ckpt_path="last")
    assert trainer.fed_run_dir == good and trainer.federation_state.completed_rounds == 3


def test_a_file_that_is_no_lightning_checkpoint_is_named(tmp_path):
    path = tmp_path / "weights.ckpt"
    torch.save({"weight": torch.ones(2)}, path)
    with pytest.raises(CorruptCheckpointError, match="no Lightning checkpoint .*state_dict"):
        read_checkpoint(path)


def test_a_second_lock_on_a_run_directory_is_refused_and_a_released_one_is_free(tmp_path):
    first, second = RunLock(tmp_path / "runs" / "a"), RunLock(tmp_path / "runs" / "a")
    first.acquire()
    with pytest.raises(RunLockedError, match=rf"{tmp_path / 'runs' / 'a'} is being written by another process \(pid"):
        second.acquire()
    first.release()
    assert not (tmp_path / "runs").exists(), "the directories the lock created are removed when left empty"
    second.acquire()
    assert second.held
    second.release()


def test_a_lock_file_of_a_dead_process_does_not_block(run):
    root, run_dir = run
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / LOCK_NAME).write_text(f"{dead.pid} somehost\n")
    trainer = _fit(root, num_rounds=3, ckpt_path="last")
    assert trainer.federation_state.completed_rounds == 3
    assert not (run_dir / LOCK_NAME).exists(), "the lock is released when the fit ends"


class _Fails(FedCallback):
    def on_round_start(self, trainer, pl_module, round_ctx):
        raise RuntimeError("boom")


def test_the_lock_is_released_when_the_fit_fails(run):
    root, run_dir = run
    with pytest.raises(RuntimeError, match="boom"):
        _fit(root, num_rounds=3, ckpt_path="last", callbacks=[_Fails()], resume_allow_changes=["callbacks._Fails"])
    assert not (run_dir / LOCK_NAME).exists()
    assert _fit(root, num_rounds=3, ckpt_path="last").federation_state.completed_rounds == 3


def test_a_second_process_resuming_a_run_being_written_is_refused_until_the_holder_dies(tmp_path):
    root = tmp_path / "root"
    run_dir = _fit(root).fed_run_dir
    ready, go = tmp_path / "ready", tmp_path / "go"
    holder = subprocess.Popen(
        [sys.executable, str(HOLD_SCRIPT), str(root), str(ready), str(go)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert holder.poll() is None, holder.stderr.read()[-4000:] if holder.stderr else ""
            assert time.monotonic() < deadline, "the first resume never started its round"
            time.sleep(0.1)
        with pytest.raises(RunLockedError) as error:
            _fit(root, num_rounds=2, ckpt_path="last")
        message = str(error.value)
        assert "\n" not in message and str(run_dir) in message and f"pid {holder.pid}" in message
        # SIGKILL leaves the lock file behind, but not the lock: a resume goes ahead.
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert (run_dir / LOCK_NAME).read_text().split()[0] == str(holder.pid)
    trainer = _fit(root, num_rounds=2, ckpt_path="last")
    assert trainer.fed_run_dir == run_dir and trainer.federation_state.completed_rounds == 2
