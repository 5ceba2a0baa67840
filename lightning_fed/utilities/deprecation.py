"""Deprecation warnings that a user running the CLI actually sees."""

from __future__ import annotations

import warnings


class LightningFedDeprecationWarning(DeprecationWarning):
    """A name or argument of lightning_fed that goes away in the next release.

    Python hides ``DeprecationWarning`` outside ``__main__``, so a user running ``lightning-fed fit`` would never see
    one raised inside the library; this subclass is shown once per call site, as Lightning does with its own.
    """


warnings.simplefilter("default", category=LightningFedDeprecationWarning)


def deprecated(message: str, stacklevel: int = 3) -> None:
    """Warns that something is deprecated; ``message`` names the replacement."""
    warnings.warn(message, LightningFedDeprecationWarning, stacklevel=stacklevel)


__all__ = ["LightningFedDeprecationWarning", "deprecated"]
