"""What a site's reply may hold, checked by the server before anything of it is folded into the round.

A site is another organisation's machine: its reply is read as untrusted input. Three checks, each refusing the reply
with one line that names what was wrong (the client is then dropped from the round, as a site that did not answer):

* **Size, before reading** (:func:`reply_size_limit`): a reply carries its client's round state, which has the shape
  of the federated state the task carried down; a reply more than :data:`REPLY_SIZE_FACTOR` times that (plus
  :data:`REPLY_SIZE_SLACK` for metrics and headers) is refused before it is hashed or decoded.
* **Whose and which round** (:func:`check_reply`): the reply answers its task's round and client, and speaks only
  for that client (its metrics, rejections, merged entries).
* **Shape**: each algorithm's round state names exactly what the server declared this round; a sum has the declared
  keys, shapes and dtypes and only finite values (one ``inf`` would poison the round's aggregate); a merge holds the
  client's own entry only; a ``last`` entry claims the client's own position in the round and holds integer entries
  of the global model.

The decoding itself (:mod:`~lightning_fed.deploy.wire`) loads plain containers only (``weights_only``), so a reply
cannot run code at the server whatever it holds.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lightning_fed.messages import ClientReply, ClientTask
from lightning_fed.parallel.reduction import CrossProcessState

#: A reply may be this many times the bytes of the federated state its task carried down. A reply holds each
#: algorithm's round state for one client: FedAvg's weighted sum in float64 (2x a float32 model), SCAFFOLD's sum of
#: control changes besides it (2x more), DP-FedAvg's clipped sums, q-FedAvg's, LoRA's rank-sized factors; the task
#: carries the global model and every broadcast state (SCAFFOLD's ``c``) once. Measured ratios are 1.0 to 2.2
#: (``tests/deploy/test_reply_check.py``).
REPLY_SIZE_FACTOR = 4
#: Bytes every reply may hold besides its state: metrics, rejection reasons, the encoding's headers.
REPLY_SIZE_SLACK = 1 << 20


def state_bytes(value: Any) -> int:
    """The bytes of every tensor in ``value`` (nested mappings and sequences)."""
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(state_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(item) for item in value)
    return 0


def reply_size_limit(task: ClientTask) -> int:
    """The most bytes a reply to ``task`` may have: :data:`REPLY_SIZE_FACTOR` times the federated state the task
    carries (the global model, every broadcast state), plus :data:`REPLY_SIZE_SLACK`."""
    carried = state_bytes(task.global_params) + state_bytes(task.broadcast or {})
    return REPLY_SIZE_FACTOR * carried + REPLY_SIZE_SLACK


def expected_round_state(objects: Mapping[str, CrossProcessState]) -> dict[str, dict[str, tuple[str, Any]]]:
    """What the server declared this round, by algorithm key and name: each entry's reduction and its value as
    declared (the server's objects hold it until the replies are folded)."""
    expected: dict[str, dict[str, tuple[str, Any]]] = {}
    for key, obj in objects.items():
        values = obj.round_state()
        expected[key] = {name: (reduce, values[name]) for name, reduce in obj.round_state_reductions().items()}
    return expected


def check_reply(
    reply: ClientReply,
    task: ClientTask,
    expected: Mapping[str, Mapping[str, tuple[str, Any]]] | None = None,
) -> str | None:
    """Why ``reply`` cannot be folded as the answer to ``task``, or ``None`` if it can.

    Args:
        reply: The decoded reply.
        task: The task it answers.
        expected: The round state the server declared (:func:`expected_round_state`); ``None`` for an evaluation
            task, whose reply carries no round state.
    """
    client = task.client_id
    if reply.round_idx != task.round_idx:
        return f"a reply for round {reply.round_idx!r} arrived in round {task.round_idx}"
    if reply.client_ids != [client]:
        return f"the reply speaks for clients {reply.client_ids!r}, not for client {client} alone"
    for name in ("train_metrics", "rejected", "eval_metrics"):
        value = getattr(reply, name)
        if not isinstance(value, Mapping) or not set(value) <= {client}:
            return f"its `{name}` speaks for other clients than {client}"
    if reply.dropped or reply.secure_sums:
        return "it sets what only the server's transport may set (`dropped`, `secure_sums`)"
    for name in ("steps", "bytes_up", "bytes_down"):
        value = getattr(reply, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"its `{name}` is {value!r}, not a count"
    if expected is None:
        return None if not reply.round_state else "an evaluation's reply carries round state"
    secure = task.secure_range is not None
    if reply.partial != secure:
        return "its round state is partial without secure aggregation" if reply.partial else "its sums are missing"
    if client in reply.rejected:
        return None  # nothing of a rejected client's round state is folded
    state = reply.round_state
    if not isinstance(state, Mapping) or set(state) != set(expected):
        names = sorted(state) if isinstance(state, Mapping) else state
        return f"its round state is for algorithms {names!r}, the server runs {sorted(expected)}"
    position = task.round_clients.index(client) if client in task.round_clients else -1
    for key, declared in expected.items():
        wanted = {name for name, (reduce, _) in declared.items() if not (secure and reduce == "sum")}
        got = state[key]
        if not isinstance(got, Mapping) or set(got) != wanted:
            names = sorted(got) if isinstance(got, Mapping) else got
            return f"`{key}` holds round state {names!r}, the server declared {sorted(wanted)}"
        for name in wanted:
            reduce, value = declared[name]
            where = f"`{key}.{name}`"
            if reduce == "sum":
                why = _same_sum(got[name], value, where)
            elif reduce == "merge":
                why = _own_merge(got[name], client, where)
            else:
                why = _own_last(got[name], position, task.global_params, where)
            if why is not None:
                return why
    return None


def _same_sum(got: Any, declared: Any, where: str) -> str | None:
    """Why ``got`` is not a sum of ``declared``'s keys, shapes and dtypes with finite values."""
    if isinstance(declared, Tensor):
        if not isinstance(got, Tensor):
            return f"{where} is {type(got).__name__}, not a tensor"
        if got.shape != declared.shape or got.dtype != declared.dtype:
            return (
                f"{where} has shape {tuple(got.shape)} and dtype {got.dtype}, the server declared"
                f" {tuple(declared.shape)} and {declared.dtype}"
            )
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            return f"{where} holds non-finite values"
        return None
    if isinstance(declared, Mapping):
        if not isinstance(got, Mapping) or set(got) != set(declared):
            return f"{where} has other keys than the server declared"
        for name, item in declared.items():
            why = _same_sum(got[name], item, f"{where[:-1]}.{name}`")
            if why is not None:
                return why
        return None
    if not isinstance(got, numbers.Real) or isinstance(got, bool) or got != got or abs(got) == float("inf"):
        return f"{where} is {got!r}, not a finite number"
    return None


def _own_merge(got: Any, client: int, where: str) -> str | None:
    if not isinstance(got, Mapping) or not set(got) <= {client}:
        return f"{where} merges entries of other clients than {client}"
    return None


def _own_last(got: Any, position: int, global_params: Mapping[str, Tensor], where: str) -> str | None:
    """Why ``got`` is not a ``(position, integer entries)`` pair of this client's position and the global model's
    integer entries (shapes and dtypes)."""
    if not (isinstance(got, tuple) and len(got) == 2 and got[0] in (-1, position) and isinstance(got[1], Mapping)):
        return f"{where} claims another position in the round than the client's ({position})"
    for name, value in got[1].items():
        reference = global_params.get(name)
        if (
            reference is None
            or reference.is_floating_point()
            or not isinstance(value, Tensor)
            or value.shape != reference.shape
            or value.dtype != reference.dtype
        ):
            return f"{where} holds `{name}`, which is no integer entry of the global model of that shape and dtype"
    return None


__all__ = [
    "REPLY_SIZE_FACTOR",
    "REPLY_SIZE_SLACK",
    "check_reply",
    "expected_round_state",
    "reply_size_limit",
    "state_bytes",
]
