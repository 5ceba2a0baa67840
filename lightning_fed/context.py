"""The data that flows through a run: what a callback sees before a round, before and after a client, what a
client sends back to the aggregator, what the round hands to the trainer at its end, and the run's federation state
that every checkpoint carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_fed.client_store import ClientStateStore
from lightning_fed.functional.state_dict import StateDict


@dataclass
class RoundContext:
    """One round, as callbacks see it.

    Attributes:
        round_idx: 0-based round index (equal to ``trainer.current_epoch``).
        client_ids: The clients sampled for this round, in training order.
        global_params: Snapshot of the global model's federated part (the trainable parameters and the buffers;
            :mod:`~lightning_fed.functional.federated_state`) at the start of the round; the frozen base is in the
            module only. Treat it as read-only: every client of the round starts from it unless a callback swaps
            ``initial_params``.
        num_samples: Training-set size of each sampled client.
        store: Per-client state that outlives the round.
        bytes_down: Bytes sent from server to clients this round; callbacks that send extra tensors add to it.
        bytes_up: Bytes sent from clients to server this round; callbacks that upload extra tensors add to it.
        rejected: Ids of clients whose update was rejected (non-finite values).
        extras: Free-form per-round data shared between callbacks (e.g. rFedAvg+ targets).
        parameter_names: The keys of ``global_params`` that are the module's trainable parameters (tied ones under
            every name); every other entry is a buffer. Set by the round runner; ``None`` when a round is built by
            hand without it. Server optimizers step only these entries and average the buffers.
    """

    round_idx: int
    client_ids: list[int]
    global_params: StateDict
    num_samples: dict[int, int]
    store: ClientStateStore
    bytes_down: int = 0
    bytes_up: int = 0
    rejected: list[int] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    parameter_names: frozenset[str] | None = None


@dataclass
class ClientContext:
    """One client's local training, as callbacks see it.

    Attributes:
        client_id: The client.
        round_idx: The round it trains in.
        global_params: The round's global model (shared, read-only).
        initial_params: Where local training starts. ``on_client_start`` may replace it, e.g. with a personalised
            model; it must hold every key of ``global_params``.
        num_samples: The client's training-set size.
        store: The client store (per-client state that outlives the round, namespaced by callback); read this
            client's entries with ``store.get(namespace, client_id)``.
        num_steps: Optimizer steps taken so far in local training.
        lr_sums: The learning rates of the optimizer steps taken so far, summed per param group of the client's
            optimizer (``param_groups`` order; empty before the first step): ``num_steps * lr`` at a constant rate,
            the sum of the step sizes the client actually took under a step-interval LR scheduler (SCAFFOLD's
            control update and q-FedAvg's Lipschitz estimate divide by it). Not recorded under manual
            optimisation, where the module steps optimizers of its own.
        extras: Free-form per-client data shared between callbacks.
        batch_transforms: Applied in order to every batch of the client's local training (after it is moved to the
            device, before ``training_step``), so a callback can change what a client trains on without touching the
            user's module (attack simulation's label flipping). Appended to by ``on_client_start`` or
            ``on_client_train_start``; loaders handed to hooks and aggregator probes are not transformed.
    """

    client_id: int
    round_idx: int
    global_params: StateDict
    initial_params: StateDict
    num_samples: int
    store: ClientStateStore
    num_steps: int = 0
    lr_sums: list[float] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    batch_transforms: list[Callable[[Any], Any]] = field(default_factory=list)


@dataclass
class ClientUpdate:
    """What a client sends to the aggregator after local training.

    Attributes:
        client_id: The client.
        num_samples: Training samples the client holds (the FedAvg weight).
        num_steps: Optimizer steps actually taken.
        params: The client's final local model's federated part (trainable parameters and buffers, detached, on
            the training device).
        metrics: Means of the values the module logged during local training (e.g. ``train_loss``).
        extras: Extra payload for aggregators that need more than the weights (e.g. q-FedAvg's loss at w_g).
        held: Set by an ``on_client_end`` hook to keep the update from the aggregator until every client of this
            rank has trained; ``on_clients_end`` hooks may then rewrite it (attack simulation: "a little is enough"
            needs all the round's malicious updates first), and it is aggregated if still finite.
        lr_sums: The client's :attr:`ClientContext.lr_sums` when it finished: the learning rates of its steps,
            summed per param group.
    """

    client_id: int
    num_samples: int
    num_steps: int
    params: StateDict
    metrics: dict[str, float] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    held: bool = False
    lr_sums: list[float] = field(default_factory=list)


@dataclass
class RoundResult:
    """What a finished round hands to the trainer: the round loop passes it to
    :meth:`~lightning_fed.trainer.FederatedTrainer.finish_round`, which logs it and runs ``on_round_end``.

    Every rank holds the same result: client lists, metrics and per-client results are combined across processes
    before the round returns.

    Attributes:
        context: The round's :class:`RoundContext` (sampled clients, bytes, rejections, extras).
        metrics: The round's metrics (``round``, ``train/*``, ``global/*``, ``client/*`` or ``personal/*``,
            ``comm/*``, ``clients/*``, ``time/round_s``); validation and ``on_round_end`` entries are added later.
        client_results: Each evaluated client's own-test-split metrics, in client order; empty in a round without
            per-client evaluation.
        client_prefix: ``"personal/"`` when ``client_results`` come from personalised models, else ``"client/"``.
    """

    context: RoundContext
    metrics: dict[str, float]
    client_results: dict[int, dict[str, float]] = field(default_factory=dict)
    client_prefix: str = "client/"

    @property
    def round_idx(self) -> int:
        """0-based index of the round."""
        return self.context.round_idx

    @property
    def sampled(self) -> list[int]:
        """The clients sampled for the round, in training order."""
        return list(self.context.client_ids)

    @property
    def rejected(self) -> list[int]:
        """Sampled clients whose update was rejected as non-finite."""
        return list(self.context.rejected)

    @property
    def accepted(self) -> list[int]:
        """Sampled clients whose update reached the aggregator."""
        rejected = set(self.context.rejected)
        return [cid for cid in self.context.client_ids if cid not in rejected]


@dataclass
class FederationState:
    """The run's federated state, saved in every checkpoint (under the round loop's state).

    Attributes:
        seed: Run seed; every random draw of the run derives from it.
        completed_rounds: Rounds fully trained and aggregated.
        bytes_up: Cumulative client-to-server bytes.
        bytes_down: Cumulative server-to-client bytes.
        rejected_total: Client updates rejected as non-finite.
        wall_time_s: Training wall time summed over rounds, across resumes.
        history: One metrics dict per completed round.
        store: Per-client state of every callback.
    """

    seed: int = 0
    completed_rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    rejected_total: int = 0
    wall_time_s: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    store: ClientStateStore = field(default_factory=ClientStateStore)

    @property
    def updates_total(self) -> int:
        """Client updates trained so far, accepted or rejected (the sampled clients of every completed round)."""
        return sum(int(entry.get("clients/sampled", 0)) for entry in self.history)

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "completed_rounds": self.completed_rounds,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "rejected_total": self.rejected_total,
            "wall_time_s": self.wall_time_s,
            "history": [dict(entry) for entry in self.history],
            "store": self.store.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("seed", "completed_rounds", "bytes_up", "bytes_down", "rejected_total", "wall_time_s"):
            setattr(self, key, state_dict[key])
        self.history = [dict(entry) for entry in state_dict["history"]]
        self.store.load_state_dict(state_dict["store"])
