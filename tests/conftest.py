import os
import sys
from pathlib import Path

# Tests never reach the network: W&B runs offline, and the helpers directory is importable as `helpers`.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
sys.path.insert(0, str(Path(__file__).parent))


import pytest


@pytest.fixture(autouse=True)
def _finish_wandb_runs():
    """A W&B run left open by one test would be reused by the next test's WandbLogger."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()
