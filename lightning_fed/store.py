"""Deprecated alias of :mod:`lightning_fed.client_store`, kept for one release."""

import warnings

from lightning_fed.client_store import ClientStateStore

warnings.warn(
    "`lightning_fed.store` was renamed to `lightning_fed.client_store`; import from there. This alias goes in the next"
    " release.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ClientStateStore"]
