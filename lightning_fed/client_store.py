"""Per-client state that outlives a round: personalised weights, control variates, Fisher statistics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import Tensor

# Marks, in a transaction's undo log, an entry that did not exist before the transaction touched it.
_ABSENT: Final = object()


def _to_cpu(value: Any) -> Any:
    return apply_to_collection(value, Tensor, lambda tensor: tensor.detach().to("cpu", copy=True))


@dataclass
class _Transaction:
    """A suspended transaction: each touched entry's value before it, and the store's bookkeeping at its start."""

    undo: dict[tuple[str, int], Any]
    changed_before: set[tuple[str, int]]
    namespaces_before: set[str]


class ClientStateStore:
    """Holds per-client state on the CPU, namespaced by the callback that owns it, and saved in the checkpoint.

    Values are nested dicts/lists of tensors and plain Python scalars, which keeps the checkpoint loadable with
    ``torch.load(weights_only=True)``. Tensors are copied to the CPU on ``put`` so that the store never pins device
    memory: at 10 000 registered clients only the clients that carry state cost anything.

    Example:
        >>> import torch
        >>> store = ClientStateStore()
        >>> store.put("scaffold", 3, {"c": torch.zeros(2)})
        >>> store.get("scaffold", 3)["c"].shape
        torch.Size([2])
        >>> store.get("scaffold", 4) is None
        True
    """

    def __init__(self) -> None:
        self._data: dict[str, dict[int, Any]] = {}
        # Entries written or removed since the last `take_changes`: what other ranks have not seen yet.
        self._changed: set[tuple[str, int]] = set()
        # While a transaction is open: each touched entry's value before it (or _ABSENT), and `_changed` as it was.
        self._undo: dict[tuple[str, int], Any] | None = None
        self._changed_before: set[tuple[str, int]] = set()
        self._namespaces_before: set[str] = set()

    def put(self, namespace: str, client_id: int, value: Any) -> None:
        """Stores ``value`` (copied to the CPU) for ``client_id`` under ``namespace``, replacing what was there."""
        self._remember(namespace, int(client_id))
        self._data.setdefault(namespace, {})[int(client_id)] = _to_cpu(value)
        self._changed.add((namespace, int(client_id)))

    def get(self, namespace: str, client_id: int, default: Any = None) -> Any:
        """Returns the stored value, or ``default`` when the client has none in this namespace."""
        return self._data.get(namespace, {}).get(int(client_id), default)

    def has(self, namespace: str, client_id: int) -> bool:
        return int(client_id) in self._data.get(namespace, {})

    def pop(self, namespace: str, client_id: int, default: Any = None) -> Any:
        self._remember(namespace, int(client_id))
        self._changed.add((namespace, int(client_id)))
        return self._data.get(namespace, {}).pop(int(client_id), default)

    def begin(self) -> None:
        """Opens a transaction: what is written or removed from now on can be undone with :meth:`rollback`.

        The round runner opens one before each client's hooks and training and decides after the finiteness check:
        :meth:`commit` for an accepted update, :meth:`rollback` for a rejected one, so that no state derived from a
        diverged update (a hook's write in ``on_client_start``, say) outlives it. Reads see the transaction's own
        writes. In-place edits of a stored tensor are not recorded: store a new value instead.

        Raises:
            RuntimeError: If a transaction is already open.
        """
        if self._undo is not None:
            raise RuntimeError("A ClientStateStore transaction is already open: commit or roll it back first.")
        self._undo = {}
        self._changed_before = set(self._changed)
        self._namespaces_before = set(self._data)

    def commit(self) -> None:
        """Keeps everything written since :meth:`begin` and closes the transaction (no-op when none is open)."""
        self._undo = None
        self._changed_before = set()

    def rollback(self) -> None:
        """Restores every entry written or removed since :meth:`begin` and closes the transaction (no-op when none
        is open)."""
        if self._undo is None:
            return
        for (namespace, client_id), previous in self._undo.items():
            entries = self._data.setdefault(namespace, {})
            if previous is _ABSENT:
                entries.pop(client_id, None)
            else:
                entries[client_id] = previous
        for namespace in set(self._data) - self._namespaces_before:
            if not self._data[namespace]:
                del self._data[namespace]
        # Touched entries go back to whether they were changed before; others keep their status, which matters when
        # another client's transaction ran while this one was suspended.
        touched = set(self._undo)
        self._changed = (self._changed - touched) | (self._changed_before & touched)
        self.commit()

    def suspend(self) -> _Transaction:
        """Closes the open transaction without deciding it, so that another client's can open; :meth:`resume`
        reopens it. Batched training starts a group's clients one after another and decides each after training.

        Raises:
            RuntimeError: If no transaction is open.
        """
        if self._undo is None:
            raise RuntimeError("No ClientStateStore transaction is open to suspend.")
        suspended = _Transaction(self._undo, self._changed_before, self._namespaces_before)
        self._undo, self._changed_before = None, set()
        return suspended

    def resume(self, transaction: _Transaction) -> None:
        """Reopens a transaction that :meth:`suspend` returned, to commit or roll it back.

        Raises:
            RuntimeError: If a transaction is already open.
        """
        if self._undo is not None:
            raise RuntimeError("A ClientStateStore transaction is already open: commit or roll it back first.")
        self._undo = transaction.undo
        self._changed_before = transaction.changed_before
        self._namespaces_before = transaction.namespaces_before

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return self._undo is not None

    def _remember(self, namespace: str, client_id: int) -> None:
        if self._undo is not None and (namespace, client_id) not in self._undo:
            self._undo[(namespace, client_id)] = self._data.get(namespace, {}).get(client_id, _ABSENT)

    def take_changes(self) -> dict[str, Any]:
        """The entries written (``"put"``) and removed (``"pop"``) since the last call, and forgets them.

        A multi-process round gathers these from every rank and applies them everywhere with
        :meth:`apply_changes`, so that each rank holds every client's state (and rank 0's checkpoint holds it all).
        """
        changes: dict[str, Any] = {"put": {}, "pop": []}
        for namespace, client_id in sorted(self._changed):
            entries = self._data.get(namespace, {})
            if client_id in entries:
                changes["put"].setdefault(namespace, {})[client_id] = entries[client_id]
            else:
                changes["pop"].append((namespace, client_id))
        self._changed.clear()
        return changes

    def apply_changes(self, changes: dict[str, Any]) -> None:
        """Applies what another rank's :meth:`take_changes` returned (not recorded as changes of this store)."""
        for namespace, entries in changes["put"].items():
            self._data.setdefault(namespace, {}).update({int(cid): value for cid, value in entries.items()})
        for namespace, client_id in changes["pop"]:
            self._data.get(namespace, {}).pop(int(client_id), None)

    def clients(self, namespace: str) -> list[int]:
        """Ids of the clients that hold state in ``namespace``, sorted."""
        return sorted(self._data.get(namespace, {}))

    def items(self, namespace: str) -> Iterator[tuple[int, Any]]:
        for client_id in self.clients(namespace):
            yield client_id, self._data[namespace][client_id]

    def namespaces(self) -> list[str]:
        return sorted(self._data)

    def clear(self, namespace: str | None = None) -> None:
        """Drops every entry (of ``namespace``). Not sent to other ranks: call it where every rank does.

        Not undone by :meth:`rollback`: call it outside a client's training.
        """
        if namespace is None:
            self._data.clear()
        else:
            self._data.pop(namespace, None)

    def nbytes(self) -> int:
        """Bytes held by tensors in the store."""
        total = 0

        def count(tensor: Tensor) -> Tensor:
            nonlocal total
            total += tensor.numel() * tensor.element_size()
            return tensor

        apply_to_collection(self._data, Tensor, count)
        return total

    def state_dict(self) -> dict[str, dict[str, Any]]:
        # String keys keep the checkpoint JSON-like and weights_only-safe for every serializer.
        return {ns: {str(cid): value for cid, value in entries.items()} for ns, entries in self._data.items()}

    def load_state_dict(self, state_dict: dict[str, dict[str, Any]]) -> None:
        self._data = {
            ns: {int(cid): _to_cpu(value) for cid, value in entries.items()} for ns, entries in state_dict.items()
        }
        self._changed.clear()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._data.values())

    def __repr__(self) -> str:
        sizes = ", ".join(f"{ns}: {len(entries)} clients" for ns, entries in sorted(self._data.items()))
        return f"{type(self).__name__}({sizes})"


__all__ = ["ClientStateStore"]
