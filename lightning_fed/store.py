"""Deprecated alias of :mod:`lightning_fed.client_store`, kept for one release."""

from lightning_fed.client_store import ClientStateStore
from lightning_fed.deprecation import deprecated

deprecated(
    "`lightning_fed.store` was renamed to `lightning_fed.client_store`; import from there. This alias goes in the next"
    " release.",
    stacklevel=2,
)

__all__ = ["ClientStateStore"]
