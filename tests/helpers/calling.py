"""A component that calls a function named in the config while it is built, as a dataset's ``is_valid_file`` or a
``transform`` does: what a config that names ``os.system`` there would run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback


class CallsOnBuild(Callback):
    """Calls ``call(argument)`` in its constructor."""

    def __init__(self, call: Callable[[str], Any], argument: str) -> None:
        super().__init__()
        call(argument)
