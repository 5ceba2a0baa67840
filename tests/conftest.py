import os
import sys
from pathlib import Path

# Tests never reach the network: W&B runs offline, and the helpers directory is importable as `helpers`.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
sys.path.insert(0, str(Path(__file__).parent))
