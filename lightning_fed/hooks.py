"""The plug-in contract: the hooks an algorithm plugs into, and what a hook sees of a group of clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import Strategy
from torch import Tensor
from torch.optim import Optimizer

from lightning_fed.context import ClientContext, ClientUpdate, FederationState, RoundContext, StateDict
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.aggregation import Aggregator


@dataclass
class ClientGroup:
    """Clients of one round that train together.

    Attributes:
        contexts: Their contexts, in round order (position ``i`` is row ``i`` of every stacked tensor).
        cache: Per-group data that callbacks compute once (e.g. their stacked per-client tensors), by key.
    """

    contexts: list[ClientContext]
    cache: dict[str, Any] = field(default_factory=dict)

    def stacked(self, key: str, per_client: Callable[[ClientContext], dict[str, Tensor]]) -> dict[str, Tensor]:
        """``per_client(ctx)`` for every client, stacked by name, computed once per group under ``key``."""
        if key not in self.cache:
            values = [per_client(ctx) for ctx in self.contexts]
            self.cache[key] = {name: torch.stack([v[name] for v in values]) for name in values[0]}
        return self.cache[key]


@dataclass
class GroupStep:
    """One optimizer step of some of a group's clients; a client that trains alone is a group of one.

    The per-step hooks see only this view, so each step idea is written once, on stacked tensors, and serves both
    the sequential loop (:meth:`for_client`, ``[1, *shape]`` views onto the live module) and batched clients.

    Attributes:
        group: The group.
        members: Positions in ``group.contexts`` of the clients taking this step.
        params: Their trainable parameters by name, stacked ``[len(members), *shape]``; edit them in place in
            ``on_client_after_optimizer_step`` (the hook runs under ``torch.no_grad()`` for batched clients; the
            views of a client alone carry no autograd history).
        grads: Their gradients, same shapes; add to them in place in ``on_client_before_optimizer_step``.
        log: ``log(position, name, value)`` logs a value for the client at ``position`` in ``members`` order, as
            ``pl_module.log`` does for the client that trains alone.
        optimizer: The optimizer taking the step (its ``param_groups`` hold the learning rates). Batched clients
            step a stacked twin of it, with the same settings.
    """

    group: ClientGroup
    members: list[int]
    params: Mapping[str, Tensor]
    grads: Mapping[str, Tensor]
    log: Callable[[int, str, Any], None]
    optimizer: Optimizer
    _index: Tensor | None = None

    @classmethod
    def for_client(cls, module: LightningModule, client_ctx: ClientContext, optimizer: Optimizer) -> GroupStep:
        """The step of one client training alone in ``module``: a group of one.

        ``params`` and ``grads`` are views ``[1, *shape]`` onto the module's live trainable parameters and their
        ``.grad``, read at every access, so one view serves all of the client's steps and in-place edits land in
        the module. Reading a gradient that backward left as ``None`` creates a zero ``.grad`` first (an edit must
        reach the optimizer); one that nobody reads stays ``None``, as ``torch.optim`` expects of unused
        parameters. ``log`` goes to ``module.log``.
        """
        trainable = {name: p for name, p in module.named_parameters() if p.requires_grad}

        def log(position: int, name: str, value: Any) -> None:
            module.log(name, value)

        group = ClientGroup([client_ctx])
        return cls(group, [0], _LiveView(trainable, grads=False), _LiveView(trainable, grads=True), log, optimizer)

    @property
    def contexts(self) -> list[ClientContext]:
        """The stepping clients' contexts, in ``members`` order."""
        return [self.group.contexts[i] for i in self.members]

    @property
    def everyone(self) -> bool:
        """Whether every client of the group takes this step."""
        return len(self.members) == len(self.group.contexts)

    def select(self, stacked: Tensor) -> Tensor:
        """The rows of a group-stacked tensor that belong to this step's clients."""
        if self.everyone:
            return stacked
        if self._index is None or self._index.device != stacked.device:
            self._index = torch.tensor(self.members, device=stacked.device)
        return stacked.index_select(0, self._index)


class _LiveView(Mapping[str, Tensor]):
    """A module's live parameters (or their ``.grad``) by name, as views with a leading client dimension of 1.

    Built at each access rather than once: the step replaces every ``.grad`` (zero-grad sets them to ``None``), and
    a view taken now sees the tensor the optimizer will read.
    """

    def __init__(self, params: Mapping[str, Tensor], grads: bool) -> None:
        self._params = params
        self._grads = grads

    def __getitem__(self, name: str) -> Tensor:
        param = self._params[name]
        if not self._grads:
            return param.detach().unsqueeze(0)
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        return param.grad.unsqueeze(0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


FED_HOOKS = (
    "on_round_start",
    "on_client_start",
    "on_client_train_start",
    "client_loss",
    "on_client_before_optimizer_step",
    "on_client_after_optimizer_step",
    "on_client_end",
    "on_clients_end",
    "on_aggregate",
    "on_round_end",
    "on_client_evaluate_start",
)


class FedCallback(Callback, CrossProcessState):
    """A Lightning ``Callback`` with federated hooks, called in this order each round::

        on_round_start                   once, after sampling, before any client trains
        for each sampled client:
            on_client_start              may replace ctx.initial_params (personalisation)
            on_client_train_start        the module now holds the start point; the client's loader is given
            per local step: client_loss  (added to the loss) -> backward -> on_client_before_optimizer_step(step)
                            -> optimizer step -> on_client_after_optimizer_step(step)
            on_client_end                sees the ClientUpdate before the aggregator does; may hold it back
        on_clients_end                   once this rank's clients have trained: may rewrite the held updates
        on_aggregate                     may edit the new global model in place
        for each evaluated client:
            on_client_evaluate_start     may replace ctx.initial_params with the personalised model
        on_round_end                     may add entries to the round's metrics

    The loop dispatches these hooks to every callback that defines them. The aggregator receives none of them: an
    aggregator that needs a client-side measurement (q-FedAvg's loss at w_g) takes it in its own
    ``Aggregator.probe_client``, called right after ``on_client_train_start``. Lightning's own
    hooks (``on_train_epoch_end``, ``on_validation_end``, ...) keep working beside them, with one epoch per round.
    Per-callback state that must survive a crash goes either in ``state_dict`` (server state) or in the
    ``ClientStateStore`` (per-client state); both are saved in the checkpoint.

    With several processes (``strategy="ddp"``) each rank runs the round with the same sampled clients
    (``round_ctx.client_ids`` is the whole round) but trains only its share of them, so:

    * ``on_round_start``, ``on_aggregate`` and ``on_round_end`` run on every rank with the same inputs: what they
      compute and store must be the same everywhere (it is, when it depends only on the round's inputs, the store
      and server state).
    * ``on_client_start`` … ``on_client_end`` run only on the rank that trains that client, and
      ``on_client_evaluate_start`` only on the rank that evaluates it. ``on_clients_end`` runs on every rank, with
      the updates that rank held; a hook that needs every rank's may gather them (every rank calls it).
    * Client-store entries written by the per-client hooks reach every rank before the aggregator computes (and
      after per-client evaluation), so per-client state may be read anywhere from ``on_aggregate`` on.
    * A server accumulator summed over clients in the per-client hooks holds only this rank's clients. Declare it
      in ``on_round_start`` with ``self.add_round_state(name, default, reduce=...)`` (``"sum"`` for tensors,
      numbers or state dicts started at zeros of their final shape, ``"merge"`` for per-client dicts, ``"last"`` for
      the round's last client's value; every callback is a
      :class:`~lightning_fed.parallel.reduction.CrossProcessState`): the engine reduces it before ``on_aggregate``,
      which then reads the value over every rank's clients (the identity in one process), as in SCAFFOLD and
      FedCurv. ``round_ctx.rejected`` and the ``bytes_*`` counters are already combined by then.

    With ``client_parallelism`` above 1 several clients train side by side
    (:mod:`lightning_fed.engine.batched.training`): each client's ``on_client_start`` and ``on_client_train_start`` run
    in round order before the group trains, and its ``on_client_end`` after (the module then holds that client's local
    model). Per-client state must therefore live in ``client_ctx`` (``extras``) or be keyed by client, not kept in one
    slot of the callback. A callback that overrides any per-client hook sets ``supports_batched_clients = True`` once it
    does so; without it the trainer falls back to training one client at a time, with a warning.

    The two per-step hooks have one form for both cases: they receive a :class:`GroupStep`, whose ``params`` and
    ``grads`` are stacked ``[clients, *shape]`` over the clients taking the step. A client that trains alone is a
    group of one (views ``[1, *shape]`` onto the module's live parameters and ``.grad``), so a step idea is written
    once, on the stacked tensors, and a callback writes no batched twin of it. A callback that keeps per-client
    state in one slot (FedGG, APFL) may unpack ``(ctx,) = step.contexts`` and leave ``supports_batched_clients``
    off.

    Attributes:
        supports_loss_scaling: Set to ``False`` by algorithms that count or edit optimizer steps (fp16 loss scaling
            skips steps); the trainer then refuses ``precision="16-mixed"`` with a clear error.
        supports_batched_clients: Whether the callback's per-client hooks are correct when a group of clients
            trains side by side (see above).
        sends_client_data_to_server: Set to ``True`` by algorithms whose server side reads client data outside the
            aggregated model update (SCAFFOLD's control changes, FedCurv's statistics, FedAMP's personal models,
            rFedAvg's feature means): that data is not covered by DP-FedAvg's noise, so its privacy accounting
            refuses them.
    """

    supports_loss_scaling: bool = True
    supports_batched_clients: bool = False
    sends_client_data_to_server: bool = False

    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        """Raises when the trainer's settings (aggregator, ``client_eval``, ...) or the datamodule (set up) cannot
        run this algorithm. ``lightning-fed`` calls it before the run writes anything; the default accepts all.

        Raises:
            InvalidArgumentError: Naming the setting by its config path (``trainer.aggregator``, ...).
        """

    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        """Called after the round's clients are sampled."""

    def on_client_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        """Called before a client trains; the module does not hold the client's start point yet."""

    def on_client_train_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> None:
        """Called once the module holds ``client_ctx.initial_params``, before the first local step.

        ``dataloader`` yields the client's training data in the order it will train in this round. It is a separate
        loader from the one training uses, and the client's RNG is seeded after this hook, so iterating it (or
        drawing random numbers here) does not change the client's data order or dropout masks.
        """

    def client_loss(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        client_ctx: ClientContext,
        batch: Any,
        batch_idx: int,
    ) -> Tensor | None:
        """Returns a term added to the training-step loss (e.g. an MMD on captured features), or ``None``."""
        return None

    def on_client_before_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        """Called after backward (and AMP unscaling), before gradient clipping and the optimizer step: add to
        ``step.grads`` (stacked over the stepping clients; ``[1, *shape]`` for a client alone) in place."""

    def on_client_after_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        """Called right after the optimizer stepped (before zero-grad): edit ``step.params`` in place; such edits
        stay outside the optimizer's state (momentum buffers, Adam moments)."""

    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        """Called after local training; the module still holds the client's local model."""

    def on_clients_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        held: list[ClientUpdate],
    ) -> None:
        """Called once this rank's clients have trained, before the aggregator sees the updates held back.

        An ``on_client_end`` hook holds an update back by setting ``update.held = True``; here ``held`` lists this
        rank's held updates in round order, and edits to their ``params`` are what the aggregator receives (an
        update left non-finite is rejected). The module holds the last client's local model.
        """

    def on_aggregate(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext, new_params: StateDict
    ) -> None:
        """Called with the aggregated model before it is loaded; edit ``new_params`` in place to change it."""

    def on_round_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        metrics: dict[str, float],
    ) -> None:
        """Called after evaluation with the round's metrics; add entries to log them."""

    def on_client_evaluate_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        """Called before a client's test split is evaluated; swap ``client_ctx.initial_params`` to personalise."""

    def summary_entries(self, trainer: FederatedTrainerView) -> dict[str, Any]:
        """Entries this callback adds to the run's ``summary.json`` (JSON values; the default adds none).

        Called on rank 0 whenever the summary is written (after every round).
        """
        return {}


class ClientSamplerView(Protocol):
    """What a plug-in may read of the trainer's client sampler."""

    clients_per_round: int | float
    seed: int

    def num_sampled(self, num_clients: int) -> int:
        """How many clients a round samples out of ``num_clients``."""
        ...

    def sample(self, round_idx: int, num_clients: int) -> list[int]:
        """The clients of round ``round_idx``."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class FederatedTrainerView(Protocol):
    """What a plug-in (callback, aggregator, attack) and the engine may read from the trainer.

    Plug-ins type their ``trainer`` argument with this Protocol rather than with
    :class:`~lightning_fed.FederatedTrainer`, so that an algorithm depends on the contract, not on the trainer that
    runs it (the engine in one process, a client site in a federation, a test's stand-in). Everything here is read:
    the round settings, Lightning's trainer state, the run's federation state, and one service,
    :meth:`train_locally`.
    """

    @property
    def num_rounds(self) -> int: ...

    @property
    def local_epochs(self) -> int | None: ...

    @property
    def local_steps(self) -> int | None: ...

    @property
    def client_eval(self) -> str: ...

    @property
    def eval_every_n_rounds(self) -> int: ...

    @property
    def client_eval_every_n_rounds(self) -> int: ...

    @property
    def client_table_every_n_rounds(self) -> int: ...

    @property
    def on_client_divergence(self) -> str: ...

    @property
    def keep_optimizer_state(self) -> bool: ...

    @property
    def client_parallelism(self) -> int | str: ...

    @property
    def federated_keys(self) -> list[str] | None:
        """Glob patterns on ``state_dict`` keys naming the federated part of the module (``None``: the module's own
        declaration or the default; :mod:`lightning_fed.functional.federated_state`)."""
        ...

    @property
    def accumulate_grad_batches(self) -> int: ...

    @property
    def gradient_clip_val(self) -> int | float | None: ...

    @property
    def gradient_clip_algorithm(self) -> str | None: ...

    @property
    def aggregator(self) -> Aggregator: ...

    @property
    def sampler(self) -> ClientSamplerView: ...

    @property
    def callbacks(self) -> list[Callback]: ...

    @property
    def datamodule(self) -> Any: ...

    @property
    def federation_state(self) -> FederationState: ...

    @property
    def strategy(self) -> Strategy: ...

    @property
    def optimizers(self) -> list[Optimizer]: ...

    @property
    def lightning_module(self) -> LightningModule: ...

    @property
    def current_epoch(self) -> int: ...

    @property
    def max_epochs(self) -> int | None: ...

    @property
    def is_global_zero(self) -> bool: ...

    @property
    def world_size(self) -> int: ...

    @property
    def default_root_dir(self) -> str: ...

    @property
    def loggers(self) -> list[Logger]: ...

    @property
    def callback_metrics(self) -> dict[str, Any]: ...

    @property
    def fed_run_dir(self) -> Path | None: ...

    def print(self, *args: Any, **kwargs: Any) -> None: ...

    def resolve_seed(self) -> int:
        """The run seed (the checkpoint's when resuming), also before the rounds start."""
        ...

    def publish_figure(self, figure: Any, relative_path: str, key: str, caption: str | None = None) -> Path:
        """Saves ``figure`` under the run directory and logs it to every W&B logger (call it on rank 0)."""
        ...

    def train_locally(
        self,
        client_id: int,
        round_idx: int,
        start_params: StateDict,
        epochs: int | None = None,
        steps: int | None = None,
        purpose: str = "finetune",
    ) -> StateDict:
        """Plain local training of a client outside the round (see ``FederatedTrainer.train_locally``)."""
        ...


def federated_trainer(trainer: Trainer, callback: object) -> FederatedTrainerView:
    """``trainer`` as a federated trainer, for Lightning hooks typed with a plain ``Trainer``.

    Raises:
        TypeError: If ``callback`` is used with a plain Lightning ``Trainer``, which has no rounds.
    """
    # Duck-typed: the contract cannot import the trainer that runs it.
    if not (hasattr(trainer, "federation_state") and hasattr(trainer, "aggregator")):
        raise TypeError(
            f"{type(callback).__name__} is a federated callback: use it with `lightning_fed.FederatedTrainer`, not"
            f" {type(trainer).__name__}."
        )
    return cast("FederatedTrainerView", trainer)
