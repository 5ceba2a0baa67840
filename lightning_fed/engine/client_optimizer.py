"""A client's optimizer as its local training starts: fresh state, or the state the client kept."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import Tensor
from torch.optim import Optimizer

from lightning_fed.engine.local_training import RoundSchedulers

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def client_optimizer(trainer: FederatedTrainerView, schedulers: RoundSchedulers, client_id: int) -> Optimizer:
    """The trainer's optimizer, with fresh state (or the client's own state when it is kept), and the LR schedulers
    at the round's state. Under manual optimisation the module's other optimizers start fresh too
    (:class:`~lightning_fed.engine.local_training.LocalTrainer`)."""
    schedulers.start_client()
    optimizer = trainer.optimizers[0]
    optimizer.state.clear()
    store = trainer.federation_state.store
    stored = store.get("optimizer", client_id) if trainer.keep_optimizer_state else None
    if stored is not None:
        # load_state_dict keeps CPU tensors as they are: without a copy the optimizer would step the stored
        # momentum in place, and a diverging step would poison the kept state even if the update is rejected.
        stored = apply_to_collection(stored, Tensor, torch.clone)
        optimizer.load_state_dict({"state": stored, "param_groups": optimizer.state_dict()["param_groups"]})
    return optimizer


__all__ = ["client_optimizer"]
