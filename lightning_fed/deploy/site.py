"""A client site of a deployment: decode a task, run the client half on it, encode the reply.

A site builds the user's module and datamodule and a :class:`SiteTrainer` from the same configuration as the server,
**once**, and keeps them warm: the trainer's one Lightning fit (its site loop, :func:`~lightning_fed.engine.
install_site_loop`) runs in a thread of its own and answers tasks as they come, so a task costs its training, not
Python's, torch's and Lightning's start-up. For each :class:`~lightning_fed.messages.ClientTask`:

1. the client's committed state is read from disk (:class:`~lightning_fed.deploy.site_store.SiteStateStore`) into
   the trainer's client store, which holds nothing else, and the algorithm objects are put back as they were built;
2. the **same** client half as in simulation runs the task (``ClientHalf.run_task``): it takes the server's broadcast
   state, LR schedulers and global model, opens the round as the server did (``on_round_start``, the aggregator's
   reset, with the server's sampled clients and seed), trains the client, checks its update, runs the per-client
   hooks and folds the update into the declared round state, which its reply carries;
3. under secure aggregation the reply's sums are split off for masking (:mod:`~lightning_fed.deploy.secure_sum`);
   the client's store entries are written as the round's pending version.

A warm site keeps nothing that its state directory does not also hold: what a task reads is the task, the client's
version on disk and the objects as built, so a site killed at any point and started again answers the same task with
the same reply. A site is a DDP rank whose share is one client: the server folds the replies in round order and
closes the round as one process would.
"""

from __future__ import annotations

import copy
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from typing_extensions import override

from lightning_fed.deploy.algorithms import algorithm_fingerprint, check_same_configuration
from lightning_fed.deploy.secure_sum import out_of_range, split_round_state, sum_leaves
from lightning_fed.deploy.site_store import SiteStateStore
from lightning_fed.deploy.wire import decode, encode
from lightning_fed.engine import ClientHalf, algorithm_objects, install_site_loop
from lightning_fed.functional.federated_state import BaseFingerprint, base_fingerprint, federated_keys
from lightning_fed.messages import ClientReply, ClientTask
from lightning_fed.run.checkpoint_state import check_same_base
from lightning_fed.run.setup_checks import check_federation_setup
from lightning_fed.trainer import FederatedTrainer

#: Builds a site's fresh ``(module, datamodule, trainer)`` from the deployment's configuration (with the site's data);
#: :func:`lightning_fed.deploy.config.site_builder` reads them from the app's ``config.yaml``.
SiteBuilder = Callable[[], tuple[LightningModule, LightningDataModule, "SiteTrainer"]]

# What a site never does: it logs, checkpoints and evaluates nothing (the server does), and it runs one fit.
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
    """A ``FederatedTrainer`` whose one fit answers deployment tasks with its client half, and does nothing else.

    It keeps everything the client half needs from a Lightning fit (the module attached, ``configure_optimizers``,
    the strategy's device and precision, ``self.log``), and writes no run directory, log or checkpoint. Its fit's
    one epoch is the site loop: :meth:`serve` hands the client half to :attr:`answer_tasks`, which returns when
    there are no more tasks.

    Args:
        kwargs: ``FederatedTrainer``'s arguments, from the server's configuration; the site's own settings
            (no logger, no checkpoints, one fit) replace the ones that concern the run's reporting.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.update(_SITE_SETTINGS)
        super().__init__(**kwargs)
        install_site_loop(self)
        #: Answers the site's tasks with the client half it is given; set before ``fit``.
        self.answer_tasks: Callable[[ClientHalf], None] | None = None

    @override
    def fit(self, model: LightningModule, *args: Any, datamodule: LightningDataModule | None = None, **kw: Any) -> None:
        """Answers tasks (Lightning's fit without the run directory, lock and checkpoint resolution)."""
        if self.answer_tasks is None:
            raise RuntimeError("A SiteTrainer answers tasks: set `trainer.answer_tasks` before `fit`.")
        Trainer.fit(self, model, datamodule=datamodule)

    @override
    def start_federation(self) -> None:
        check_federation_setup(self, self.lightning_module)
        self.sampler.seed = self.federation_state.seed
        self.aggregator.setup(self)

    def serve(self, client: ClientHalf) -> None:
        """The site loop's body (:class:`~lightning_fed.engine.SiteHost`): answers tasks until there are none."""
        assert self.answer_tasks is not None
        self.answer_tasks(client)


@dataclass
class _Job:
    """One task for the site's worker thread, and what comes back."""

    task: ClientTask
    client_state: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    reply: ClientReply | None = None
    error: BaseException | None = None
    # Whether the task may have changed the client's state (training: always; an evaluation: if a hook wrote).
    state_written: bool = True


class _SiteWorker:
    """A built site whose trainer's fit runs in a thread of its own, answering one job at a time.

    Args:
        build: Builds the site's ``(module, datamodule, trainer)``.
        seed: The run seed (the aggregator's setup reads it; every task of this worker must carry it).
    """

    def __init__(self, build: SiteBuilder, seed: int) -> None:
        self.seed = seed
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        module, datamodule, trainer = build()
        trainer.federation_state.seed = seed
        trainer.answer_tasks = self._answer_jobs
        self.trainer = trainer
        self.fingerprint = algorithm_fingerprint(trainer, module)
        self._built: dict[str, dict[str, Any]] = {}
        self._base: BaseFingerprint | None = None
        self._thread = threading.Thread(
            target=self._fit, args=(trainer, module, datamodule), name="lightning_fed-site", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the worker still answers jobs (a job that raised ends it)."""
        return self._thread.is_alive()

    def run(self, job: _Job) -> _Job:
        """Runs ``job`` in the worker's thread and waits for it.

        Raises:
            Exception: Whatever the job raised (the worker has stopped then).
        """
        if not self.alive:
            raise RuntimeError("The site's worker has stopped; a new one must be built.")
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job

    def close(self) -> None:
        """Ends the worker's fit once the jobs before have run."""
        if self.alive:
            self._jobs.put(None)

    def _fit(self, trainer: SiteTrainer, module: LightningModule, datamodule: LightningDataModule) -> None:
        try:
            trainer.fit(module, datamodule=datamodule)
        except BaseException as error:  # reported to the waiting job, if any; the thread ends either way
            self._fail_pending(error)
        finally:
            self._fail_pending(RuntimeError("The site's worker stopped before answering this task."))

    def _fail_pending(self, error: BaseException) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.error = error
                job.done.set()

    def _answer_jobs(self, client: ClientHalf) -> None:
        trainer = self.trainer
        # The algorithm objects as built: every task starts from them, as a freshly started site would.
        objects: dict[str, Any] = algorithm_objects(trainer)
        self._built = {key: copy.deepcopy(obj.state_dict()) for key, obj in objects.items()}
        # The site's frozen base, hashed once: it never changes, and every task's base is checked against it.
        module = trainer.lightning_module
        self._base = base_fingerprint(module, federated_keys(module, trainer.federated_keys))
        while (job := self._jobs.get()) is not None:
            try:
                self._answer(client, job)
            except BaseException as error:
                job.error = error
                job.done.set()
                raise
            job.done.set()

    def _answer(self, client: ClientHalf, job: _Job) -> None:
        trainer, task = self.trainer, job.task
        if task.fingerprint:
            check_same_configuration(task.fingerprint, self.fingerprint)
        if task.base:
            assert self._base is not None
            check_same_base(
                BaseFingerprint.from_dict(task.base),
                self._base,
                "This site's frozen base",
                "build the site's model on the server's base (the same pretrained weights)",
                error=ValueError,
            )
        if task.seed != self.seed:
            raise ValueError(
                f"This site serves a run with seed {self.seed}, and a task of seed {task.seed} arrived: start the"
                " site again for the new run."
            )
        objects: dict[str, Any] = algorithm_objects(trainer)
        for key, obj in objects.items():
            obj.load_state_dict(copy.deepcopy(self._built[key]))
        store = trainer.federation_state.store
        store.clear()
        for namespace, value in job.client_state.items():
            store.put(namespace, task.client_id, value)
        store.take_changes()
        reply = client.run_task(task)
        if task.evaluate:
            # The store's change log says whether a personalisation hook wrote anything: only then a new version.
            changes = store.take_changes()
            job.state_written = bool(changes["put"] or changes["pop"])
        elif task.secure_range is not None:
            _split_for_secure_aggregation(trainer, task, reply)
        else:
            # Each algorithm's round state in the form it sends (FedAvg's float64 share as float32 and a weight).
            reply.round_state = {key: obj.pack_round_state() for key, obj in objects.items()}
        job.client_state = {
            ns: store.get(ns, task.client_id) for ns in store.namespaces() if store.has(ns, task.client_id)
        }
        job.reply = reply


def _split_for_secure_aggregation(trainer: SiteTrainer, task: ClientTask, reply: ClientReply) -> None:
    """Moves the reply's sums into :attr:`~lightning_fed.messages.ClientReply.secure_sums` (zeros when the client is
    rejected), leaving the rest in its round state; a client whose sums leave ``±secure_range`` rejects itself."""
    assert task.secure_range is not None
    sums, rest = split_round_state(algorithm_objects(trainer))
    rejected = task.client_id in reply.rejected
    beyond = None if rejected else out_of_range(sums, task.secure_range)
    if beyond is not None:
        # Clipping would change the sum without a word: the client leaves the round instead, as a diverged client
        # does, and says which setting to change.
        because = (
            f"{beyond}, beyond secure aggregation's fixed-point range ±{task.secure_range:g}; raise"
            " `secagg-clipping-range` in the app's run config (each step of the grid grows with it)"
        )
        print(
            f"[lightning_fed] Client {task.client_id} rejects its update of round {task.round_idx}: {because}.",
            file=sys.stderr,
            flush=True,
        )
        reply.rejected[task.client_id] = because
        reply.train_metrics = {}
        rejected = True
    secure_sums = sum_leaves(sums)
    if rejected:  # the masked total still needs this site's share: zeros
        secure_sums = [torch.zeros_like(leaf) for leaf in secure_sums]
    reply.round_state, reply.partial, reply.secure_sums = rest, True, secure_sums


class ClientSite:
    """One organisation's site: answers round tasks for its clients with the client half, keeping their state on disk.

    The site is built on its first task and stays warm (see the module's docstring); :meth:`close` ends it. A task
    that raises ends the warm site too: the next task builds a fresh one, as a restarted site would.

    Args:
        build: Builds a fresh ``(module, datamodule, trainer)`` from the deployment's configuration (with this
            site's data).
        state_dir: Where the clients' state versions live (:class:`~lightning_fed.deploy.site_store.SiteStateStore`).

    Example::

        site = ClientSite(build, "site-3-state")
        reply_bytes = site.handle_bytes(task_bytes)
        site.close()
    """

    def __init__(self, build: SiteBuilder, state_dir: str | Path) -> None:
        self.build = build
        self.state_dir = Path(state_dir)
        self._worker: _SiteWorker | None = None

    def handle(self, task: ClientTask) -> ClientReply:
        """Trains (or evaluates) ``task``'s client in ``task.round_idx`` and returns the reply; writes the client's
        new state version (pending until the server commits the round)."""
        if not task.opens_round:
            raise ValueError("A site's task carries the server's broadcast state; this one has none.")
        if self._worker is None or not self._worker.alive or self._worker.seed != task.seed:
            self.close()
            self._worker = _SiteWorker(self.build, task.seed)
        store = SiteStateStore(self.state_dir, task.client_id)
        # Training starts from the client's newest round that the server folded and committed; an evaluation after
        # round r from the newest it folded (round r's pending version, if the server folded the client's reply).
        if task.evaluate:
            client_state = store.latest(task.committed_round)
        else:
            client_state = store.load(task.committed_round, task.resumable_from)
        job = self._worker.run(_Job(task, client_state))
        assert job.reply is not None
        if task.client_id not in job.reply.rejected and job.state_written and (job.client_state or store.versions()):
            store.save(task.round_idx, job.client_state)
        return job.reply

    def handle_bytes(self, data: bytes) -> bytes:
        """:meth:`handle` on the wire: a task's bytes in, the reply's bytes out."""
        return encode(self.handle(decode(data, ClientTask)))

    def close(self) -> None:
        """Ends the warm site (its module, data and trainer are released); the next task builds them again."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __del__(self) -> None:
        self.close()


__all__ = ["ClientSite", "SiteBuilder", "SiteTrainer"]
