"""Package attributes imported on first use (PEP 562), so that importing one light module of a package does not
import the whole stack.

A Flower ClientApp starts a fresh process for every message, and three of SecAgg+'s four messages per round need
nothing of Lightning: ``import lightning_fed.deploy.flower`` must not pay for ``import lightning`` (about 4 s).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` that import each of ``exports`` (name -> module) on first use.

    Example::

        __getattr__, __dir__ = lazy_exports(__name__, {"FedAvg": "lightning_fed.aggregators"})
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups find it without this hook
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
