"""How the seam's two messages cross the network between a deployment's server and its client sites.

One :class:`~lightning_fed.messages.ClientTask` goes down per sampled client per round and one
:class:`~lightning_fed.messages.ClientReply` comes back (the types live in :mod:`lightning_fed.messages`, which
both halves import; this module only encodes them). Down: the round, the global model, every algorithm's broadcast
state, the LR schedulers' state at the round's start and the client's last folded, committed round. Up: every
algorithm's declared round state, unreduced (as its ``pack_round_state`` sends it), and the client's metrics,
rejection, optimizer steps and bytes. The per-client store never travels: it stays at the site
(:mod:`lightning_fed.deploy.site_store`).

The encoding is ``torch.save`` of plain containers, loaded with ``weights_only=True``: tensors, numbers, strings,
lists, tuples and dicts only, so a message cannot run code at the receiver. Every message carries its kind and
:data:`WIRE_VERSION`; a message of another version or kind is refused in one line.
"""

from __future__ import annotations

import io
from dataclasses import fields
from typing import Any, TypeVar

import torch

from lightning_fed.messages import ClientReply, ClientTask

#: The version of the message layout; a site and a server must agree on it.
WIRE_VERSION = 3

Message = TypeVar("Message", ClientTask, ClientReply)


def encode(message: ClientTask | ClientReply) -> bytes:
    """``message`` as bytes (tensors moved to the CPU)."""
    payload = {item.name: getattr(message, item.name) for item in fields(message)}
    payload["kind"], payload["version"] = type(message).__name__, WIRE_VERSION
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
    if payload.get("kind") != kind.__name__:
        raise ValueError(f"A {payload.get('kind')} arrived where a {kind.__name__} was expected.")
    del payload["kind"], payload["version"]
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


__all__ = ["WIRE_VERSION", "decode", "encode"]
