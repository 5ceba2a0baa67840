"""The benchmark scripts' ``main`` sets process-wide state for a quiet measurement (torch threads, warning filters,
Lightning's log levels); a test that calls one in-process gives that state back, so the tests after it run as they
would alone (a site's warm worker thread keeps torch's default thread count, and a deployed fit equals the simulated
one to the bit only when both use the same)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import pytest
import torch

_LOGGERS = ("lightning.pytorch", "lightning.fabric")


@pytest.fixture(autouse=True)
def _process_state_given_back() -> Iterator[None]:
    threads = torch.get_num_threads()
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    with warnings.catch_warnings():
        yield
    torch.set_num_threads(threads)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
