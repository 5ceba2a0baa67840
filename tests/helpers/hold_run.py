"""Resumes the newest run of a root and holds its run directory: touches READY when its round starts, then waits
for GO (or a kill). Used by the run-lock tests.

Usage: python hold_run.py ROOT READY GO
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.boring import BoringClassifier, fast_trainer, make_datamodule
from lightning_fed import FedCallback


class Hold(FedCallback):
    def __init__(self, ready: str, go: str) -> None:
        self.ready, self.go = Path(ready), Path(go)

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.ready.touch()
        deadline = time.monotonic() + 120
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def main() -> None:
    root, ready, go = sys.argv[1:4]
    torch.set_num_threads(1)
    trainer = fast_trainer(
        root,
        num_rounds=2,
        seed=0,
        enable_checkpointing=True,
        limit_val_batches=0,
        callbacks=[Hold(ready, go)],
        resume_allow_changes=["callbacks.Hold"],
    )
    trainer.fit(BoringClassifier(lr=0.1), datamodule=make_datamodule(), ckpt_path="last")


if __name__ == "__main__":
    main()
