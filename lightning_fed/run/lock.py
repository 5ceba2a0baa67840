"""One writer per run directory: ``<run dir>/run.lock``, held while a fit runs.

Two fits in one run directory (two ``--ckpt_path last`` resumes of one run, a resume of a run that is still
training) would both train, both write its checkpoints and both log its rounds under one id. A fit takes an
exclusive ``flock`` on ``run.lock`` before its rounds start and writes its pid and host into it; a second fit is
refused, naming the directory and that pid. The kernel drops the lock when its process dies, however it dies
(``SIGKILL``, a crash), so a lock file left behind by a dead process blocks nothing. Under ddp the ranks of one fit
share the directory: only global rank 0 takes the lock.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_warn

from lightning_fed.run.resume import ResumeError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no flock: runs go unlocked there
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "run.lock"


class RunLockedError(ResumeError):
    """Another process is writing the run directory."""


class RunLock:
    """The lock on a run directory, taken by :meth:`acquire` and given back by :meth:`release`.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from lightning_fed.run.lock import RunLock
        >>> lock = RunLock(Path(tempfile.mkdtemp()) / "runs" / "a")
        >>> lock.acquire(); lock.release()
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._created: list[Path] = []

    def acquire(self) -> None:
        """Locks the run directory (creating it), or refuses when another process holds it.

        Raises:
            RunLockedError: When a living process holds the lock.
        """
        if fcntl is None or self._fd is not None:
            return
        self._created = [path for path in (self.run_dir.parent, self.run_dir) if not path.exists()]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _read_holder(fd)
                os.close(fd)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunLockedError(
                        f"The run directory {self.run_dir} is being written by another process ({holder}): wait"
                        " for it to finish, or stop it, before resuming this run."
                    ) from None
                rank_zero_warn(f"Cannot lock the run directory {self.run_dir} ({error}): it is written unlocked.")
                return
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released and removed the file between our open and our lock: try again
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Gives the lock back and removes the lock file (and the directories :meth:`acquire` created, when the fit
        left them empty)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
        for path in reversed(self._created):
            try:
                path.rmdir()
            except OSError:
                break  # not empty: the fit wrote into it

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        text = []
    if not text:
        return "pid unknown"
    return f"pid {text[0]}" + (f" on {text[1]}" if len(text) > 1 else "")


__all__ = ["LOCK_NAME", "RunLock", "RunLockedError"]
