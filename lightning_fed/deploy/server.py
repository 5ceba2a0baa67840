"""The server of a deployment: an ordinary federated fit whose clients train at their sites.

The server runs ``FederatedTrainer.fit`` unchanged (seeded sampling, ``compute``/``on_aggregate``, evaluation of the
global model, W&B and ``summary.json``, a checkpoint per round, resume) with one difference: the round's client side
is :class:`~lightning_fed.deploy.remote.RemoteClients` over a :class:`~lightning_fed.deploy.transport.Transport`.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import LightningDataModule, LightningModule

from lightning_fed.deploy.algorithms import check_deployable
from lightning_fed.deploy.remote import remote_clients
from lightning_fed.deploy.secure_sum import check_secure_aggregation
from lightning_fed.deploy.transport import Transport
from lightning_fed.trainer import FederatedTrainer


def check_server(trainer: FederatedTrainer, secure: bool = False) -> None:
    """Refuses, in one line each, the server settings a deployment cannot run.

    Args:
        trainer: The server's trainer.
        secure: Whether the deployment runs secure aggregation
            (:func:`~lightning_fed.deploy.secure_sum.check_secure_aggregation`).

    Raises:
        ValueError: With several server processes, an algorithm whose server reads the clients' stored state, or
            (``secure``) one that needs more than sums.
    """
    if trainer.world_size > 1:
        raise ValueError(
            f"A deployment's server runs in one process (the sites train the clients); got {trainer.world_size}"
            " processes: drop `strategy`/`devices`/`num_nodes` from the server's trainer settings."
        )
    check_deployable(trainer)
    if secure:
        check_secure_aggregation(trainer)


def serve(
    trainer: FederatedTrainer,
    model: LightningModule,
    datamodule: LightningDataModule,
    transport: Transport,
    ckpt_path: str | Path | None = None,
) -> None:
    """Runs ``trainer.fit`` with the rounds' clients trained at the sites ``transport`` reaches.

    Args:
        trainer: The server's trainer, configured as for ``lightning-fed fit``.
        model: The module; it holds the global model.
        datamodule: The server's datamodule: the clients' sizes (for sampling and weights) and the global test set.
        transport: Reaches the client sites.
        ckpt_path: As for ``FederatedTrainer.fit`` (``"last"`` resumes the newest run of this configuration).
    """
    check_server(trainer, secure=transport.secure_range is not None)
    trainer.client_side = remote_clients(transport)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)


__all__ = ["check_server", "serve"]
