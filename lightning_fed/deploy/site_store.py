"""A client site's own state on disk: one version per round the client trained, committed by the server.

In simulation the per-client store lives in the run's checkpoint. In a deployment it never leaves the site (SCAFFOLD's
``c_i``, FedCurv's ``u_i, v_i, w_i``, a kept optimizer state): the site writes the state each round leaves behind as a
new version, and the version becomes part of the run only once the server folded the round's reply and wrote its
checkpoint of the round. Every :class:`~lightning_fed.deploy.wire.ClientTask` names the client's newest such round; a
site that sees it

* keeps the newest version at or before it (the client's state as the checkpoint knows it),
* deletes the versions after it: they belong to rounds the server will run again after a resume, or to a reply the
  server never folded (the site was killed after its write, or replied too late: the server left the client out, as
  simulation rejecting it would), so a deployment trains every client from exactly the state the server absorbed,
* and deletes the older versions that no checkpoint the server keeps can name. A checkpoint of round ``q`` names
  the client's newest version at or before ``q``; the task says the oldest round a kept checkpoint holds
  (``resumable_from``), so the site keeps the newest version at or before it and the versions after it: a resume
  that falls back to an older checkpoint (the newest is corrupt) finds the client's state of that checkpoint.

Files are written atomically (:func:`~lightning_fed.utilities.atomic.atomic_write`), so a site killed mid-write keeps
its previous versions intact.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import IO, Any

import torch

from lightning_fed.utilities.atomic import atomic_write

_VERSION_FILE = re.compile(r"round-(\d+)\.pt")


class SiteStateStore:
    """The versions of one client's state at its site, in ``<directory>/client-<id>/round-<r>.pt``.

    Args:
        directory: The site's state directory (``state-dir`` in the SuperNode's node config).
        client_id: The client.

    Example::

        store = SiteStateStore("site-state", client_id=3)
        state = store.load(committed_round=4, resumable_from=3)  # {} before the client's first round
        store.save(round_idx=5, state={"scaffold": {...}})
    """

    def __init__(self, directory: str | Path, client_id: int) -> None:
        self.client_id = client_id
        self.directory = Path(directory) / f"client-{client_id}"

    def versions(self) -> list[int]:
        """The rounds that left a version, oldest first."""
        if not self.directory.is_dir():
            return []
        rounds = (_VERSION_FILE.fullmatch(path.name) for path in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in rounds if match)

    def load(self, committed_round: int, resumable_from: int | None = None) -> dict[str, Any]:
        """The client's state as of the server's newest checkpoint, ``{namespace: value}`` (empty if none).

        Deletes the versions after ``committed_round`` (a resumed server runs those rounds again) and the older ones
        that no checkpoint the server keeps can name: those before the newest version at or before
        ``resumable_from`` (the oldest round a kept checkpoint holds; ``None``: ``committed_round``, the server keeps
        no other; ``-1``: unknown, every committed version is kept).
        """
        rounds = self.versions()
        kept = [r for r in rounds if r <= committed_round]
        floor = committed_round if resumable_from is None else min(resumable_from, committed_round)
        named = [r for r in kept if r <= floor]
        oldest = named[-1] if named else None
        for round_idx in rounds:
            if round_idx > committed_round or (oldest is not None and round_idx < oldest):
                self._path(round_idx).unlink(missing_ok=True)
        return self._read(kept[-1]) if kept else {}

    def _read(self, round_idx: int) -> dict[str, Any]:
        path = self._path(round_idx)
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise ValueError(f"{path} is not a client state: delete it to start the client afresh.")
        return state

    def latest(self, round_idx: int) -> dict[str, Any]:
        """The newest version written at or before ``round_idx``, committed or pending: what an evaluation reads
        (the server folded round ``round_idx``, but its checkpoint of the round is not written yet).

        Deletes the versions after ``round_idx`` (the server folded none of them) but none before it: a resume from
        the previous checkpoint may need them.
        """
        rounds = self.versions()
        for newer in (r for r in rounds if r > round_idx):
            self._path(newer).unlink(missing_ok=True)
        kept = [r for r in rounds if r <= round_idx]
        return self._read(kept[-1]) if kept else {}

    def save(self, round_idx: int, state: dict[str, Any]) -> Path:
        """Writes the state round ``round_idx`` leaves the client in, as a pending version (atomically)."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()

        def write(stream: IO[bytes]) -> None:
            stream.write(data)

        return atomic_write(self._path(round_idx), write)

    def _path(self, round_idx: int) -> Path:
        return self.directory / f"round-{round_idx:06d}.pt"


__all__ = ["SiteStateStore"]
