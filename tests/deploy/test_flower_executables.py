"""The deployment tests run from a virtual environment that is not activated (``/path/to/venv/bin/python -m pytest``):
Flower's executables are found beside the interpreter, and so are the processes Flower starts itself."""

from __future__ import annotations

import os

import pytest
from helpers.flower_processes import (
    INTERPRETER_BIN,
    Processes,
    flower_env,
    flower_executable,
    free_port,
    start_superlink,
)

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_a_superlink_starts_from_a_venv_that_is_not_activated(tmp_path, monkeypatch):
    if not (INTERPRETER_BIN / "flower-superlink").is_file():
        pytest.skip(f"Flower's executables are not beside this interpreter ({INTERPRETER_BIN})")
    # PATH as a shell that never activated the venv has it: without the interpreter's bin/.
    path = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and os.path.realpath(p) != os.path.realpath(INTERPRETER_BIN)
    ]
    monkeypatch.setenv("PATH", os.pathsep.join(path or [os.defpath]))
    assert flower_executable("flower-superlink") == str(INTERPRETER_BIN / "flower-superlink")
    processes = Processes(flower_env(tmp_path / "flwr-home"), tmp_path)
    try:
        start_superlink(processes, free_port(), tmp_path / "superlink.db")
        log = processes.log("superlink")
        # The log says which executable ran; the SuperLink found its own SuperExec (it would log the failure).
        assert log.startswith(f"$ {INTERPRETER_BIN / 'flower-superlink'} "), log[:2000]
        assert "FileNotFoundError" not in log and "No such file" not in log, log[-4000:]
    finally:
        processes.stop()
