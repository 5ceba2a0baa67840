"""Optional dependencies, imported where a feature needs them, with one line naming the extra that installs them."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ModuleNotFoundError):
    """A feature's optional dependency is not installed; the message names the extra (``pip install
    'lightning-fed[extra]'``) that installs it.

    A ``ModuleNotFoundError``, so code that already handles missing modules keeps working; the CLI reports it in one
    line, as a consequence of the settings (the config named a component that needs the extra).
    """


def require_extra(feature: str, extra: str, *modules: str) -> list[ModuleType]:
    """Imports ``modules`` for ``feature``, or raises :class:`MissingExtraError` naming ``extra``.

    Args:
        feature: What needs the modules, as the user named it (e.g. ``"HFLoRAModule"``).
        extra: The optional-dependency group of ``pyproject.toml`` that installs them (e.g. ``"llm"``).
        modules: The top-level modules to import, in order.

    Returns:
        The imported modules, in the order given.

    Raises:
        MissingExtraError: If one of them is not installed (its name is in the message and in ``.name``).
    """
    imported = []
    for module in modules:
        try:
            imported.append(importlib.import_module(module))
        except ModuleNotFoundError as error:
            # Only the module itself missing is an extra's absence; a dependency it lacks is its own bug to show.
            if error.name is not None and error.name.split(".")[0] != module.split(".")[0]:
                raise
            raise MissingExtraError(
                f"{feature} needs `{module}`, which is not installed: install the `{extra}` extra"
                f" (`pip install 'lightning-fed[{extra}]'`).",
                name=module,
            ) from error
    return imported


__all__ = ["MissingExtraError", "require_extra"]
