"""Deprecated alias of :mod:`lightning_fed.federation_state`, kept for one release."""

import warnings

from lightning_fed.federation_state import FederationState

warnings.warn(
    "`lightning_fed.state` was renamed to `lightning_fed.federation_state`; import from there. This alias goes in the next"
    " release.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["FederationState"]
