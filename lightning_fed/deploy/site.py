"""A client site of a deployment: receives a round's task for one of its clients and runs the client half on it.

For each :class:`~lightning_fed.deploy.wire.RoundTask` the site builds the user's module and datamodule and a
:class:`SiteTrainer` from the same configuration as the server (a Flower ClientApp starts a fresh process per
message, so nothing is kept in memory between tasks), and runs one Lightning ``fit`` whose only round is the task:

1. the server's broadcast state goes into the site's algorithm objects, the LR schedulers are put at the round's
   state, the module is loaded with the global model and the client's own state with its committed version on disk
   (:class:`~lightning_fed.deploy.site_store.SiteStateStore`);
2. the round is opened as the server opened it (``ServerHalf.start_round``: ``on_round_start``, the aggregator's
   reset), with the server's sampled clients and seed, so the site's algorithms hold what the server's held;
3. the **same** client half as in simulation trains the client (``ClientHalf.run``), checks its update, runs the
   per-client hooks and folds the update into the declared round state;
4. the round state goes back in a :class:`~lightning_fed.deploy.wire.SiteReply` (under secure aggregation its sums
   apart, for masking: :mod:`~lightning_fed.deploy.secure_sum`), and the client's store entries are written as the
   round's pending version.

A site is a DDP rank whose share is one client: the server folds the replies in round order and closes the round as
one process would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from torch import Tensor
from typing_extensions import override

from lightning_fed.client_store import ClientStateStore
from lightning_fed.deploy.algorithms import (
    algorithm_fingerprint,
    algorithm_objects,
    check_same_configuration,
    load_broadcast,
)
from lightning_fed.deploy.secure_sum import out_of_range, split_round_state, sum_leaves
from lightning_fed.deploy.site_store import SiteStateStore
from lightning_fed.deploy.wire import RoundTask, SiteReply, decode, encode
from lightning_fed.engine.client_half import Boundary
from lightning_fed.engine.round import RoundRunner
from lightning_fed.engine.schedulers import restore_schedulers
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.functional.state_dict import copy_state_
from lightning_fed.run.setup_checks import check_federation_setup
from lightning_fed.trainer import FederatedTrainer

#: Builds a site's fresh ``(module, datamodule, trainer)`` from the deployment's configuration (with the site's data);
#: :func:`lightning_fed.deploy.config.site_builder` reads them from the app's ``config.yaml``.
SiteBuilder = Callable[[], tuple[LightningModule, LightningDataModule, "SiteTrainer"]]

# What a site never does: it logs, checkpoints and evaluates nothing (the server does), and it runs one round.
_SITE_SETTINGS: dict[str, Any] = {
    "num_rounds": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
    "client_eval": "none",
}


class SiteTrainer(FederatedTrainer):
    """A ``FederatedTrainer`` whose one round is a deployment task: the client half for one client, nothing else.

    It keeps everything the client half needs from a Lightning fit (the module attached, ``configure_optimizers``,
    the strategy's device and precision, ``self.log``), and writes no run directory, log or checkpoint.

    Set :attr:`task` (and :attr:`client_state`, the client's committed state) before ``fit``.

    Args:
        kwargs: ``FederatedTrainer``'s arguments, from the server's configuration; the site's own settings
            (no logger, no checkpoints, one round) replace the ones that concern the run's reporting.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.update(_SITE_SETTINGS)
        super().__init__(**kwargs)
        self.task: RoundTask | None = None
        self.reply: SiteReply | None = None
        self.client_state: dict[str, Any] = {}
        # Whether the task may have changed the client's state (training: always; an evaluation: if a hook wrote).
        self.state_written = True

    @override
    def fit(self, model: LightningModule, *args: Any, datamodule: LightningDataModule | None = None, **kw: Any) -> None:
        """Runs :attr:`task` (Lightning's fit without the run directory, lock and checkpoint resolution)."""
        if self.task is None:
            raise RuntimeError("A SiteTrainer runs a RoundTask: set `trainer.task` before `fit`.")
        Trainer.fit(self, model, datamodule=datamodule)

    @override
    def start_federation(self) -> None:
        assert self.task is not None
        check_federation_setup(self, self.lightning_module)
        self.federation_state.seed = self.task.seed
        self.sampler.seed = self.task.seed
        self.aggregator.setup(self)

    @override
    def build_round_runner(self, steps: StepCounter, boundary: Boundary) -> RoundRunner:
        return _SiteRound(self, self.lightning_module, steps, boundary)


class _SiteRound(RoundRunner):
    """The round runner of a :class:`SiteTrainer`: opens the server's round and trains the task's client."""

    trainer: SiteTrainer

    @override
    def run(self, round_idx: int) -> None:  # type: ignore[override]
        trainer, task = self.trainer, self.trainer.task
        assert task is not None
        load_broadcast(trainer, task.broadcast)
        if task.schedulers:
            restore_schedulers(trainer, task.schedulers)
        copy_state_(self.live, task.global_params)
        store: ClientStateStore = trainer.federation_state.store
        for namespace, value in trainer.client_state.items():
            store.put(namespace, task.client_id, value)
        store.take_changes()
        if task.evaluate:
            trainer.reply = self._evaluate(task)
            # The store's change log says whether a personalisation hook wrote anything: only then a new version.
            changes = store.take_changes()
            trainer.state_written = bool(changes["put"] or changes["pop"])
            trainer.client_state = self._client_state(task.client_id)
            return
        round_ctx = self.server.start_round(task.round_idx, task.client_ids, task.num_samples)
        share = self.client.run(round_ctx, [task.client_id])
        trainer.client_state = self._client_state(task.client_id)
        objects = algorithm_objects(trainer)
        rejected = task.client_id in share.rejected
        because = "it holds NaN or Inf" if rejected else ""
        secure_sums: list[Tensor] = []
        if task.secure_range is None:
            round_state = {key: obj.round_state() for key, obj in objects.items()}
        else:
            sums, round_state = split_round_state(objects)
            beyond = None if rejected else out_of_range(sums, task.secure_range)
            if beyond is not None:
                # Clipping would change the sum without a word: the client leaves the round instead, as a diverged
                # client does, and says which setting to change.
                because = (
                    f"{beyond}, beyond secure aggregation's fixed-point range ±{task.secure_range:g}; raise"
                    " `secagg-clipping-range` in the app's run config (each step of the grid grows with it)"
                )
                print(
                    f"[lightning_fed] Client {task.client_id} rejects its update of round {task.round_idx}: {because}.",
                    file=sys.stderr,
                    flush=True,
                )
                rejected = True
            secure_sums = sum_leaves(sums)
            if rejected:  # the masked total still needs this site's share: zeros
                secure_sums = [torch.zeros_like(leaf) for leaf in secure_sums]
        trainer.reply = SiteReply(
            round_idx=task.round_idx,
            client_id=task.client_id,
            round_state=round_state,
            train_metrics={} if rejected else share.train_metrics.get(task.client_id, {}),
            rejected=rejected,
            rejected_because=because,
            steps=share.steps,
            bytes_up=share.bytes_up,
            bytes_down=share.bytes_down,
            secure_sums=secure_sums,
        )

    def _evaluate(self, task: RoundTask) -> SiteReply:
        results, personalised = self.server.evaluator.evaluate_share(task.round_idx, [task.client_id])
        return SiteReply(
            round_idx=task.round_idx,
            client_id=task.client_id,
            round_state={},
            train_metrics={},
            rejected=False,
            steps=0,
            bytes_up=0,
            bytes_down=0,
            eval_metrics=results.get(task.client_id),
            personalised=personalised,
        )

    def _client_state(self, client_id: int) -> dict[str, Any]:
        store = self.trainer.federation_state.store
        return {ns: store.get(ns, client_id) for ns in store.namespaces() if store.has(ns, client_id)}


class ClientSite:
    """One organisation's site: answers round tasks for its clients with the client half, keeping their state on disk.

    Args:
        build: Builds a fresh ``(module, datamodule, trainer)`` from the deployment's configuration (with this
            site's data).
        state_dir: Where the clients' state versions live (:class:`~lightning_fed.deploy.site_store.SiteStateStore`).

    Example::

        site = ClientSite(build, "site-3-state")
        reply_bytes = site.handle_bytes(task_bytes)
    """

    def __init__(self, build: SiteBuilder, state_dir: str | Path) -> None:
        self.build = build
        self.state_dir = Path(state_dir)

    def handle(self, task: RoundTask) -> SiteReply:
        """Trains ``task.client_id`` in ``task.round_idx`` and returns the reply; writes the client's new state
        version (pending until the server commits the round)."""
        module, datamodule, trainer = self.build()
        if task.fingerprint:
            check_same_configuration(task.fingerprint, algorithm_fingerprint(trainer, module))
        store = SiteStateStore(self.state_dir, task.client_id)
        trainer.task = task
        # Training starts from the client's newest round that the server folded and committed; an evaluation after
        # round r from the newest it folded (round r's pending version, if the server folded the client's reply).
        if task.evaluate:
            trainer.client_state = store.latest(task.committed_round)
        else:
            trainer.client_state = store.load(task.committed_round, task.resumable_from)
        trainer.fit(module, datamodule=datamodule)
        if trainer.reply is None:
            raise RuntimeError(
                f"The site's fit ended without running round {task.round_idx} of client {task.client_id}."
            )
        if not trainer.reply.rejected and trainer.state_written and (trainer.client_state or store.versions()):
            store.save(task.round_idx, trainer.client_state)
        return trainer.reply

    def handle_bytes(self, data: bytes) -> bytes:
        """:meth:`handle` on the wire: a task's bytes in, the reply's bytes out."""
        return encode(self.handle(decode(data, RoundTask)))


__all__ = ["ClientSite", "SiteBuilder", "SiteTrainer"]
