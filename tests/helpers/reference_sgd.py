"""A reference SGD epoch written out by hand, with the trainer's clipping and accumulation, for the tests that
check a pass against a direct computation rather than against the library's own loop."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def reference_epoch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    clip: float | None = None,
    accumulate: int = 1,
) -> None:
    """One pass over ``loader``: the mean cross-entropy of ``accumulate`` batches per step (an epoch's last batch
    ends a step), gradients clipped to norm ``clip`` before each step."""
    model.train()
    num_batches = len(loader)
    for batch_idx, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        (loss / accumulate if accumulate > 1 else loss).backward()
        if (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == num_batches:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
