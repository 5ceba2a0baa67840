"""What crosses the network between a deployment's server and its client sites, and how it is encoded.

One message goes down per sampled client per round (:class:`RoundTask`) and one comes back (:class:`SiteReply`).
Down: the round (index, the sampled clients in round order, their sizes, the run seed), the global model, every
algorithm's broadcast state (``CrossProcessState.broadcast_state``), the LR schedulers' state at the round's start
and the client's last folded, committed round. Up: every algorithm's declared round state, unreduced
(``CrossProcessState.round_state``), and the client's metrics, rejection, optimizer steps and bytes. The per-client
store never travels: it stays at the site (:mod:`lightning_fed.deploy.site_store`).

The encoding is ``torch.save`` of plain containers, loaded with ``weights_only=True``: tensors, numbers, strings,
lists, tuples and dicts only, so a message cannot run code at the receiver. Every message carries
:data:`WIRE_VERSION`; a message of another version is refused in one line.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import torch

from lightning_fed.functional.state_dict import StateDict

#: The version of the message layout; a site and a server must agree on it.
WIRE_VERSION = 3


@dataclass
class RoundTask:
    """The server's message to the site of one sampled client: train it in this round.

    Attributes:
        round_idx: The round (0-based).
        client_id: The client to train.
        client_ids: Every client sampled this round, in round order (positions decide the integer buffers' copy).
        num_samples: Each sampled client's training-set size.
        seed: The run seed; every draw of the client derives from ``(seed, purpose, round, client)``.
        global_params: The global model at the round's start (parameters and buffers).
        broadcast: Each algorithm's broadcast state, by algorithm key (:func:`~lightning_fed.deploy.algorithms.
            algorithm_objects`).
        schedulers: The LR schedulers' ``state_dict`` and the optimizers' hyperparameters at the round's start.
        committed_round: The client's newest round whose reply the server folded and whose checkpoint is written
            (``-1``: none; an evaluation task's may be its own round, folded but not yet checkpointed); the site
            continues from its version of that round and drops newer ones (the server resumed from before them, or
            never folded their replies).
        resumable_from: The oldest round that a checkpoint the server keeps holds: a resume that falls back to it
            (the newer ones corrupt) names the client's version of that round, so the site keeps the newest version
            at or before it and every version after it. ``-1``: the server cannot tell which rounds its checkpoints
            hold (a checkpoint callback that does not monitor ``epoch``), and the site keeps every committed
            version; ``None``: the server keeps no checkpoint, and the site keeps only the committed one.
        fingerprint: The server's experiment fingerprint without its data settings and seed
            (:func:`~lightning_fed.deploy.algorithms.algorithm_fingerprint`); a site built from another
            configuration refuses the task.
        evaluate: Evaluate instead of training: the global model after the round's aggregation (or the client's
            personalised model, as the callbacks' ``on_client_evaluate_start`` decide) on the client's test split.
        secure_range: Under secure aggregation, the range ±c every entry of the client's sums must fit
            (the reply then carries its sums apart, in :attr:`SiteReply.secure_sums`, for masking); ``None``: no
            secure aggregation.
        version: :data:`WIRE_VERSION` of the sender.
    """

    round_idx: int
    client_id: int
    client_ids: list[int]
    num_samples: dict[int, int]
    seed: int
    global_params: StateDict
    broadcast: dict[str, dict[str, Any]] = field(default_factory=dict)
    schedulers: list[Any] = field(default_factory=list)
    committed_round: int = -1
    resumable_from: int | None = None
    run_id: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    evaluate: bool = False
    secure_range: float | None = None
    version: int = WIRE_VERSION


@dataclass
class SiteReply:
    """A site's answer to a :class:`RoundTask`.

    Attributes:
        round_idx: The round it answers.
        client_id: The client it trained.
        round_state: Each algorithm's declared round state after the client, unreduced, by algorithm key; under
            secure aggregation only what is not a sum.
        train_metrics: The client's training metrics (empty when its update was rejected).
        rejected: Whether the client's update was rejected (non-finite, or beyond secure aggregation's range) and
            left out of the round state.
        rejected_because: Why, in words, when :attr:`rejected`.
        steps: Optimizer steps the client took.
        bytes_up: Client-to-server bytes the algorithms counted for the client.
        bytes_down: Server-to-client bytes the algorithms counted for the client.
        eval_metrics: An evaluation task's results on the client's test split; ``None`` when the client has none
            (or the task trained).
        personalised: Whether the evaluated model was the client's personalised one.
        secure_sums: Under secure aggregation, the client's sums as float64 arrays
            (:func:`~lightning_fed.deploy.secure_sum.sum_leaves`), zero when it was rejected; they never reach the
            server one by one: the transport masks them. Empty otherwise.
        version: :data:`WIRE_VERSION` of the sender.
    """

    round_idx: int
    client_id: int
    round_state: dict[str, dict[str, Any]]
    train_metrics: dict[str, float]
    rejected: bool
    steps: int
    bytes_up: int
    bytes_down: int
    eval_metrics: dict[str, float] | None = None
    personalised: bool = False
    rejected_because: str = ""
    secure_sums: list[torch.Tensor] = field(default_factory=list)
    version: int = WIRE_VERSION


Message = TypeVar("Message", RoundTask, SiteReply)


def encode(message: RoundTask | SiteReply) -> bytes:
    """``message`` as bytes (tensors moved to the CPU)."""
    payload = {item.name: getattr(message, item.name) for item in fields(message)}
    buffer = io.BytesIO()
    torch.save(_to_cpu(payload), buffer)
    return buffer.getvalue()


def decode(data: bytes, kind: type[Message]) -> Message:
    """The ``kind`` message that :func:`encode` wrote into ``data``.

    Raises:
        ValueError: If ``data`` is not such a message or was written by another :data:`WIRE_VERSION`.
    """
    try:
        payload = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise ValueError(
            f"A {kind.__name__} could not be decoded ({error}); is the peer a lightning_fed site?"
        ) from None
    if not isinstance(payload, dict) or payload.get("version") != WIRE_VERSION:
        version = payload.get("version") if isinstance(payload, dict) else None
        raise ValueError(
            f"A {kind.__name__} of wire version {version} arrived; this lightning_fed speaks version {WIRE_VERSION}:"
            " install the same lightning_fed version at the server and every site."
        )
    names = {item.name for item in fields(kind)}
    if set(payload) != names:
        raise ValueError(f"A {kind.__name__} arrived with fields {sorted(payload)}, expected {sorted(names)}.")
    return kind(**payload)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


__all__ = ["WIRE_VERSION", "RoundTask", "SiteReply", "decode", "encode"]
