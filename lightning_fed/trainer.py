"""``FederatedTrainer``: a Lightning ``Trainer`` whose epochs are federated rounds."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_fed.aggregators import Aggregator, FedAvg
from lightning_fed.context import FederationState, RoundResult
from lightning_fed.engine import (
    Boundary,
    ClientSideFactory,
    RoundRunner,
    StepCounter,
    UniformClientSampler,
    add_validation_and_bmta,
    client_step_counts,
    install_round_loop,
    run_steps,
    warn_if_many_rejected,
)
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.parallel import distributed
from lightning_fed.parallel.distributed import check_world_size
from lightning_fed.run.checkpoint_state import federated_checkpoint, restore_federated_checkpoint
from lightning_fed.run.fingerprint import Fingerprint, experiment_fingerprint
from lightning_fed.run.identity import continue_last_checkpoints, new_run_dir, open_run
from lightning_fed.run.lock import RunLock
from lightning_fed.run.module_checks import check_federated_part, check_lightning_package, check_optimization_setup
from lightning_fed.run.reporting import RunReporter, publish_figure, resolve_run_dir
from lightning_fed.run.resume import (
    evaluation_checkpoint,
    resolve_ckpt_path,
    warn_allowed_changes,
)
from lightning_fed.run.resumed_settings import reapply_configured_optimizers
from lightning_fed.run.session import RunSession
from lightning_fed.run.setup_checks import (
    EPOCH_ARGS,
    check_allowed_changes,
    check_client_parallelism,
    check_epoch_args,
    check_federated_keys,
    check_federation_setup,
    check_fit_setup,
    check_lightning_settings,
    check_round_settings,
)
from lightning_fed.run.trainer_defaults import checkpoints_without_dir, default_callbacks, with_atomic_checkpoints
from lightning_fed.utilities.dependency_notices import without_dependency_notices


class FitInterrupted(SIGTERMException):
    """Raised by :meth:`FederatedTrainer.fit` when SIGTERM stopped it; a ``SystemExit`` with status 143 (128 + 15).

    The rounds stop at the next client boundary (every rank at the same one); the interrupted round is neither
    checkpointed nor counted, so the last checkpoint is the last completed round's and ``ckpt_path="last"`` resumes
    from it, bit-identical to a run that was never interrupted. Uncaught, it ends a script (or ``lightning-fed``)
    with status 143 and no traceback, as schedulers expect of a process stopped by SIGTERM; it is a subclass of
    Lightning's ``SIGTERMException``. Catch it to tell an interrupted fit from a finished one::

        try:
            trainer.fit(module, datamodule=datamodule)
        except FitInterrupted as stopped:
            print(f"{stopped.completed_rounds} rounds done")

    Attributes:
        completed_rounds: Rounds completed (and checkpointed, with the default per-round checkpoint).
    """

    def __init__(self, completed_rounds: int) -> None:
        super().__init__(128 + signal.SIGTERM)
        self.completed_rounds = completed_rounds


class FederatedTrainer(Trainer):
    """Trains an unmodified ``LightningModule`` with federated learning, one round per epoch.

    Each round samples clients, trains each on its own data from the global model (``local_epochs`` passes or
    ``local_steps`` optimizer steps, with the optimizer from ``configure_optimizers`` and fresh state per client),
    aggregates the client models with ``aggregator``, evaluates the global model on the global test set and every
    client's model on its own test split, runs Lightning's validation loop, and logs the round. Epoch-level
    Lightning features mean "round": ``current_epoch``, ``on_train_epoch_end``, ``ModelCheckpoint``,
    ``EarlyStopping``, ``check_val_every_n_epoch`` and epoch-interval LR schedulers.

    With several processes (``strategy="ddp"``, ``devices``, ``num_nodes``) each round's clients are split among
    the ranks, every rank trains its share, and the aggregate, the client store and the metrics are combined with
    collectives so that every rank holds the same global model; logging and the summary happen on rank 0. The
    results equal one process's up to the order of float64 additions.

    Args:
        num_rounds: Number of rounds (Lightning's ``max_epochs``).
        clients_per_round: Clients sampled per round: a count, or a fraction of the registered clients.
        local_epochs: Local passes over a client's data (default 1 when ``local_steps`` is not set).
        local_steps: Local optimizer steps per client instead of epochs.
        aggregator: How client models are combined; default :class:`~lightning_fed.aggregators.FedAvg`.
        eval_every_n_rounds: Evaluate the global model on the global test set every n rounds (0: never; the last
            round is always evaluated).
        client_eval: Which clients' own test splits to evaluate: ``"all"``, the round's ``"sampled"``, ``"none"``.
        client_eval_every_n_rounds: Per-client evaluation period in rounds.
        client_table_every_n_rounds: Log a per-client results ``wandb.Table`` every n rounds (0: never).
        on_client_divergence: ``"skip"`` leaves a client with a NaN/Inf update out of the aggregate and counts it;
            ``"raise"`` stops the run with :class:`~lightning_fed.ClientDivergedError`.
        keep_optimizer_state: Keep each client's optimizer state (e.g. momentum) in the client store between its
            participations, instead of starting every client from fresh state.
        client_parallelism: How many clients train side by side in one vectorised step (``torch.func.vmap``); 1
            trains one after another, ``"auto"`` sizes groups from the device and the model. What cannot be
            vectorised trains one at a time, with a warning (docs/scaling.md, ``client_parallelism``).
        federated_keys: Glob patterns on the module's ``state_dict`` keys that name its federated part, the state
            that clients train, that is aggregated, stored per client, checkpointed as client state and sent
            (``["*lora_A*", "*lora_B*"]``). Default: the module's ``federated_state_dict()`` or ``federated_keys``
            if it declares one, else every parameter with ``requires_grad`` and every persistent buffer. The rest is
            the frozen base, held once in the module and fingerprinted: a resume or a deployed site with another
            base is refused (:mod:`lightning_fed.functional.federated_state`).
        seed: Run seed for client sampling, data order and per-client RNG; defaults to the seed given to
            ``seed_everything`` (0 if none).
        run_dir: Where everything a fit writes goes (config, summary, plots, ``checkpoints/``, W&B); default
            ``<default_root_dir>/runs/<run id>``, the logger's id or else a timestamp and a random suffix.
        resume_allow_changes: Experiment settings allowed to differ from the checkpoint's when resuming, as
            fingerprint keys (``["model.lr", "callbacks.FedProx"]``: a key or a dotted prefix; ``["*"]``: any).
            Without it, resuming with another configuration is an error that lists the differing keys;
            ``num_rounds`` may always grow. See :mod:`lightning_fed.run.fingerprint`.
        kwargs: Any other ``lightning.pytorch.Trainer`` argument (callbacks, logger, precision,
            gradient_clip_val, accelerator, ...).
    """

    # Set at run time by Lightning's connectors, undeclared there; declared here so that their readers type-check.
    datamodule: Any
    callbacks: list[Callback]

    def __init__(
        self,
        *,
        num_rounds: int = 10,
        clients_per_round: int | float = 1.0,
        local_epochs: int | None = None,
        local_steps: int | None = None,
        aggregator: Aggregator | None = None,
        eval_every_n_rounds: int = 1,
        client_eval: Literal["all", "sampled", "none"] = "all",
        client_eval_every_n_rounds: int = 1,
        client_table_every_n_rounds: int = 5,
        on_client_divergence: Literal["skip", "raise"] = "skip",
        keep_optimizer_state: bool = False,
        client_parallelism: int | Literal["auto"] = 1,
        federated_keys: list[str] | None = None,
        seed: int | None = None,
        run_dir: str | None = None,
        resume_allow_changes: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        check_round_settings(
            num_rounds,
            local_epochs,
            local_steps,
            eval_every_n_rounds,
            client_eval,
            client_eval_every_n_rounds,
            client_table_every_n_rounds,
            on_client_divergence,
            keep_optimizer_state,
            seed,
        )
        check_epoch_args(kwargs)
        check_lightning_settings(kwargs.get("check_val_every_n_epoch"))
        for name in EPOCH_ARGS:
            kwargs.pop(name, None)
        self.num_rounds = num_rounds
        self.local_epochs = local_epochs if local_epochs is not None or local_steps is not None else 1
        self.local_steps = local_steps
        self.aggregator = aggregator if aggregator is not None else FedAvg()
        self.sampler = UniformClientSampler(clients_per_round)
        self.eval_every_n_rounds = eval_every_n_rounds
        self.client_eval = client_eval
        self.client_eval_every_n_rounds = client_eval_every_n_rounds
        self.client_table_every_n_rounds = client_table_every_n_rounds
        self.on_client_divergence = on_client_divergence
        self.keep_optimizer_state = keep_optimizer_state
        self.client_parallelism = check_client_parallelism(client_parallelism)
        self.federated_keys = check_federated_keys(federated_keys)
        self.seed = seed
        self.run_dir = run_dir
        self.resume_allow_changes = check_allowed_changes(resume_allow_changes)
        self.federation_state = FederationState()
        # Where the rounds' clients train: here (None), or at a deployment's client sites (lightning_fed.deploy).
        self.client_side: ClientSideFactory | None = None
        kwargs["callbacks"] = default_callbacks(kwargs)
        # Checkpoint callbacks given no directory: each fit points them at its own run directory.
        self.session = RunSession(run_checkpoints=checkpoints_without_dir(kwargs["callbacks"]))
        kwargs["plugins"] = with_atomic_checkpoints(kwargs.get("plugins"))
        # Lightning's litlogger tip is logged here; a script's first run is as quiet as `lightning-fed fit`'s.
        with without_dependency_notices():
            super().__init__(max_epochs=num_rounds, **kwargs)
        if isinstance(clients_per_round, int):
            check_world_size(self.world_size, clients_per_round)
        install_round_loop(self)

    @property
    def estimated_stepping_batches(self) -> int:
        """The optimizer steps of the whole run, for sizing step-interval schedules (``OneCycleLR(total_steps=...)``).

        ``num_rounds - 1`` rounds of a client of average length, then the longest client's steps: a client's steps
        in a round follow from its training batches (the datamodule's client sizes and batch size),
        ``local_epochs``/``local_steps`` and ``accumulate_grad_batches``. Each round a step-interval schedule
        advances by the steps of a client of average length (see docs/lightning-module.md, "Step-interval LR
        schedulers"), so with clients of equal size the schedule ends exactly with the last round, and with uneven
        clients no client steps past it. Read it in ``configure_optimizers`` (the datamodule is set up by then).
        """
        if self.datamodule is None:
            raise RuntimeError(
                "`estimated_stepping_batches` needs the fit's FederatedDataModule: read it in `configure_optimizers`."
            )
        return run_steps(client_step_counts(self), self.num_rounds)

    def fit(
        self,
        model: LightningModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: LightningDataModule | None = None,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Runs the federated rounds in a run directory of the fit's own (see ``run_dir``).

        On SIGTERM the rounds stop at the next client boundary: global rank zero prints ``lightning-fed:
        interrupted by SIGTERM after round k; resume with --ckpt_path last`` on stderr and :class:`FitInterrupted`
        (a ``SystemExit`` with status 143) is raised on every rank.

        Args:
            model: The ``LightningModule`` to train.
            train_dataloaders: A :class:`~lightning_fed.datamodules.FederatedDataModule` may be passed here.
            val_dataloaders: Not supported: the datamodule provides validation.
            datamodule: The :class:`~lightning_fed.datamodules.FederatedDataModule`.
            ckpt_path: ``None`` starts a new run. ``"last"`` resumes the newest run of this configuration in
                ``default_root_dir``; a run directory or run id resumes that run (in its directory); a checkpoint
                file resumes from it. A run of another configuration is refused unless ``resume_allow_changes``
                names the differences; so is ``"last"`` with nothing to resume.
            weights_only: ``torch.load``'s; checkpoints load with ``weights_only=True`` unless told otherwise.
        """
        if datamodule is None and isinstance(train_dataloaders, LightningDataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        check_lightning_package(model)
        check_fit_setup(datamodule, train_dataloaders, val_dataloaders)
        check_optimization_setup(self, model, datamodule)
        check_federated_part(self, model)
        # Computed from the fresh objects, before training can change any attribute; every checkpoint carries it.
        fingerprint = experiment_fingerprint(self, model, datamodule)
        target = resolve_ckpt_path(self, ckpt_path, fingerprint)
        warn_allowed_changes(target)
        self.session.start(fingerprint, restored=target.checkpoint is not None, changes=target.changes)
        run_dir = Path(self.run_dir) if self.run_dir else target.run_dir or new_run_dir(self)
        open_run(self, run_dir, self.session.run_checkpoints)
        # One writer per run directory; the ranks of one fit share it (the rank is known from the environment).
        lock = RunLock(run_dir)
        if self.global_rank == 0:
            lock.acquire()
        try:
            with without_dependency_notices():
                super().fit(
                    model,
                    datamodule=datamodule,
                    ckpt_path=target.checkpoint,
                    weights_only=True if weights_only is None else weights_only,
                )
        except SIGTERMException as stop:
            raise self._interrupted() from stop
        finally:
            lock.release()
        reporter = self.session.reporter
        if reporter is not None and self.is_global_zero:
            reporter.print_final(self.session.summary_path)
        warn_if_many_rejected(self)

    def validate(
        self,
        model: LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: LightningDataModule | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        """Lightning's validation of the global model, with ``ckpt_path`` resolved as :meth:`fit` resolves it
        (``"last"`` with nothing to resume is an error); checkpoints load with ``weights_only=True`` by default."""
        checkpoint = evaluation_checkpoint(self, model, dataloaders, datamodule, ckpt_path)
        with without_dependency_notices():
            result = super().validate(model, dataloaders, checkpoint, verbose, datamodule, weights_only is not False)
        distributed.destroy_process_group_at_exit()
        return result

    def test(
        self,
        model: LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: LightningDataModule | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        """Lightning's test of the global model, with ``ckpt_path`` resolved as in :meth:`validate`."""
        checkpoint = evaluation_checkpoint(self, model, dataloaders, datamodule, ckpt_path)
        with without_dependency_notices():
            result = super().test(model, dataloaders, checkpoint, verbose, datamodule, weights_only is not False)
        distributed.destroy_process_group_at_exit()
        return result

    def _interrupted(self) -> FitInterrupted:
        """Says, once, how far an interrupted fit got and how to resume it; the exception to raise."""
        completed = self.federation_state.completed_rounds
        if self.is_global_zero:
            print(
                f"lightning-fed: interrupted by SIGTERM after round {completed}; resume with --ckpt_path last",
                file=sys.stderr,
                flush=True,
            )
        return FitInterrupted(completed)

    @property
    def fed_runner(self) -> RoundRunner | None:
        """The running fit's round runner (owned by the round loop); ``None`` before the rounds start."""
        return getattr(self.fit_loop.epoch_loop, "runner", None)

    @property
    def fed_run_dir(self) -> Path | None:
        """This fit's run directory (``summary.json``, plots, ``checkpoints/``); ``None`` before the first round."""
        reporter = self.session.reporter
        return reporter.run_dir if reporter is not None else None

    @property
    def fed_fingerprint(self) -> Fingerprint | None:
        """What defines the latest fit's experiment, as checkpoints carry it (:mod:`lightning_fed.run.fingerprint`)."""
        return self.session.fingerprint

    @property
    def fed_run_id(self) -> str | None:
        """This fit's run id, the name of its run directory; ``None`` before the first round."""
        return self.fed_run_dir.name if self.fed_run_dir is not None else None

    @property
    def summary_path(self) -> Path | None:
        """Where this fit last wrote ``summary.json`` (rank 0); ``None`` before the first round."""
        return self.session.summary_path

    @property
    def last_round_result(self) -> RoundResult | None:
        """The latest round's :class:`~lightning_fed.context.RoundResult` in this process; ``None`` before one."""
        return self.session.last_round_result

    def mark_restored(self) -> None:
        """Records that the running fit restored a checkpoint (the run seed then comes from it)."""
        self.session.restored = True

    def resolve_seed(self) -> int:
        """The run seed: the checkpoint's when resuming, else ``seed``, else ``seed_everything``'s, else 0."""
        if self.session.restored and self.federation_state.completed_rounds > 0:
            return self.federation_state.seed
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    def train_locally(
        self,
        client_id: int,
        round_idx: int,
        start_params: StateDict,
        epochs: int | None = None,
        steps: int | None = None,
        purpose: str = "finetune",
    ) -> StateDict:
        """Trains ``start_params`` on a client's training data and returns the result; the global model is untouched.

        Plain local training for fine-tuning and for personalised models trained outside the round (FedAvg-FT,
        FedProx-FT): fresh optimizer state, no algorithm's ``client_loss`` or per-step hook, and data order and RNG
        derived from ``(seed, purpose, round, client)``, so the result is reproducible and shifts no other draw of
        the run. Call it from a hook while the rounds run.

        Args:
            client_id: Whose training data to use.
            round_idx: The round it belongs to (part of the seed).
            start_params: Where training starts (every key of the model's federated part; the frozen base is the
                module's own).
            epochs: Local passes (default 1 when ``steps`` is not set).
            steps: Optimizer steps instead of epochs.
            purpose: Seed namespace, so that two uses in one round draw different data orders.

        Returns:
            The trained federated part (detached copies).

        Raises:
            RuntimeError: Outside a fit's rounds.
        """
        runner = self.fed_runner
        if runner is None:
            raise RuntimeError("`train_locally` trains a client of a running fit: call it from a federated hook.")
        return runner.train_locally(client_id, round_idx, start_params, epochs, steps, purpose)

    def publish_figure(self, figure: Any, relative_path: str, key: str, caption: str | None = None) -> Path:
        """Saves ``figure`` as ``<run dir>/<relative_path>`` (atomically) and logs it to every W&B logger under
        ``key``; call it on global rank zero only, like any other write to the run directory."""
        return publish_figure(self, figure, relative_path, key, caption)

    def federated_checkpoint(self) -> dict[str, Any]:
        """Everything federated that a checkpoint holds (:mod:`lightning_fed.run.checkpoint_state`)."""
        return federated_checkpoint(self)

    def restore_federated_checkpoint(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`federated_checkpoint` saved; a checkpoint of another configuration is refused."""
        restore_federated_checkpoint(self, state_dict)

    def build_round_runner(self, steps: StepCounter, boundary: Boundary) -> RoundRunner:
        """The runner of this fit's rounds; the round loop builds it once, after any restore."""
        return RoundRunner(self, self.lightning_module, steps, boundary, client_side=self.client_side)

    def start_federation(self) -> None:
        """Prepares the rounds of a fit; the round loop calls it before its first round in this process.

        Runs after any checkpoint is restored: checks the module and the process layout against the settings,
        fixes the run seed, sets up the aggregator and opens the run directory and its reporter.
        """
        module = self.lightning_module
        check_federation_setup(self, module)
        self.federation_state.seed = self.resolve_seed()
        self.sampler.seed = self.federation_state.seed
        self.aggregator.setup(self)
        # Rank 0 named the run (every rank drew its own id): all ranks report the same directory.
        self.session.run_dir = Path(self.strategy.broadcast(str(resolve_run_dir(self))))
        if self.session.restored:
            continue_last_checkpoints(self.session.run_checkpoints)
        configured = self.session.configured_optimizers
        if configured is not None:
            # An allowed change of the module's settings (model.lr) is what the optimizers step with from now on.
            reapply_configured_optimizers(self, configured)
            self.session.configured_optimizers = None
        self.session.reporter = RunReporter(self)
        self.session.reporter.on_fit_start()

    def finish_round(self, result: RoundResult) -> None:
        """Completes a round after Lightning's validation: adds validation metrics and BMTA to ``result.metrics``,
        runs ``on_round_end``, records the round in the history and reports it (loggers, tables, summary)."""
        runner, reporter = self.fed_runner, self.session.reporter
        assert runner is not None and reporter is not None, "finish_round runs after start_federation"
        metrics = result.metrics
        state = self.federation_state
        state.wall_time_s += metrics["time/round_s"]
        add_validation_and_bmta(metrics, self.callback_metrics, state.history)
        runner.dispatch("on_round_end", result.context, metrics)
        state.history.append(metrics)
        self.callback_metrics.update({key: torch.tensor(value) for key, value in metrics.items()})
        self.session.last_round_result = result
        self.session.summary_path = reporter.report_round(result)
