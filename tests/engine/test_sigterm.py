"""SIGTERM, as a scheduler sends it: the fit stops at the next client boundary, the last completed round's checkpoint
is intact, one line says how to resume, the exit status is 143, and the resumed run ends bit-identical.

Every run here gets a real signal: the run pauses after a client (``Pauser`` in ``tests/helpers/resume_run.py``
writes a marker file), the test sends SIGTERM with ``os.kill`` and lets the run go on to the next boundary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from helpers.boring import BoringClassifier, make_datamodule
from helpers.resume import SCRIPT, assert_same_end_state, run_script, run_script_until_sigterm

from lightning_fed import FedCallback, FederatedTrainer
from lightning_fed.trainer import FitInterrupted

LINE = "lightning-fed: interrupted by SIGTERM after round {}; resume with --ckpt_path last"
TESTS = Path(__file__).parents[1]


def _sigterm_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "SIGTERM" in line]


def _federated_state(checkpoint: Path) -> dict:
    state = torch.load(checkpoint, weights_only=False)
    return state["loops"]["fit_loop"]["epoch_loop.state_dict"]["federated"]["state"]


@pytest.mark.slow
def test_sigterm_stops_at_the_next_client_and_resumes_bit_identical(tmp_path):
    reference_dir, root, marker = tmp_path / "reference", tmp_path / "stopped", tmp_path / "paused"
    # The reference runs beside the stopped run: most of each run's wall time is start-up.
    reference = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(reference_dir), str(reference_dir / "out.pt")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Paused after the first client of round 2 (rounds 0 and 1 are done); the round has 3 clients.
    args = ["--pause-round", "2", "--pause-client-index", "0", "--marker", str(marker)]
    stopped = run_script_until_sigterm(marker, str(root), str(root / "never.pt"), *args)
    assert stopped.returncode == 143, stopped.stderr[-4000:]
    assert _sigterm_lines(stopped.stderr) == [LINE.format(2)]
    assert "Traceback" not in stopped.stderr
    assert not (root / "never.pt").exists()
    # The other two clients of round 2 never trained.
    trained = (tmp_path / "paused.clients").read_text().split()
    assert [entry.split("/")[0] for entry in trained] == ["0"] * 3 + ["1"] * 3 + ["2"]
    # The newest checkpoint is round 1's (round 0's is kept beside it), untouched by the interrupted round.
    (run_dir,) = (root / "runs").iterdir()
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "round0000.ckpt", "round0001.ckpt"]
    assert _federated_state(checkpoints / "last.ckpt")["completed_rounds"] == 2
    resumed = run_script(str(root), str(root / "out.pt"), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert reference.wait(timeout=300) == 0, reference.stderr.read()[-4000:] if reference.stderr else ""
    assert_same_end_state(reference_dir / "out.pt", root / "out.pt", rounds_run_here=2)


@pytest.mark.slow
def test_lightning_fed_fit_exits_143_on_sigterm(tmp_path):
    marker = tmp_path / "paused"
    pauser = tmp_path / "pauser.yaml"
    pauser.write_text(
        "trainer:\n  callbacks:\n    - class_path: helpers.resume_run.Pauser\n"
        f"      init_args: {{round_idx: 1, client_index: 0, marker: '{marker}'}}\n"
    )
    config = TESTS.parent / "configs" / "quickstart.yaml"
    command = [sys.executable, "-m", "lightning_fed.cli.main", "fit", "--config", str(config), "--config", str(pauser)]
    command += ["--trainer.num_rounds", "3", "--trainer.clients_per_round", "3", "--trainer.local_epochs", "1"]
    command += ["--data.init_args.num_samples", "1000", "--trainer.logger", "false"]
    command += ["--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    stopped = run_script_until_sigterm(marker, command=command, env=env)
    assert stopped.returncode == 143, stopped.stderr[-4000:]
    assert _sigterm_lines(stopped.stderr) == [LINE.format(1)]
    assert "Traceback" not in stopped.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "round0000.ckpt"]


def test_fit_raises_fit_interrupted_and_restores_the_signal_handler(tmp_path):
    class Terminate(FedCallback):
        def on_client_end(self, trainer, pl_module, client_ctx, update):
            if client_ctx.round_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    L.seed_everything(0)
    before = signal.getsignal(signal.SIGTERM)
    trainer = FederatedTrainer(
        num_rounds=3,
        clients_per_round=3,
        callbacks=[Terminate()],
        default_root_dir=str(tmp_path),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    with pytest.raises(FitInterrupted) as stopped:
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=4))
    assert stopped.value.code == 143 and stopped.value.completed_rounds == 1
    assert trainer.federation_state.completed_rounds == 1 and len(trainer.federation_state.history) == 1
    assert signal.getsignal(signal.SIGTERM) == before
