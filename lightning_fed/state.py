"""Deprecated alias of :mod:`lightning_fed.federation_state`, kept for one release."""

from lightning_fed.deprecation import deprecated
from lightning_fed.federation_state import FederationState

deprecated(
    "`lightning_fed.state` was renamed to `lightning_fed.federation_state`; import from there. This alias goes in"
    " the next release.",
    stacklevel=2,
)

__all__ = ["FederationState"]
