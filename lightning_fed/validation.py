"""Deprecated alias of :mod:`lightning_fed.setup_checks`, kept for one release.

The module holds the checks run when a fit is set up, not Lightning's validation loop, hence the new name.
"""

from lightning_fed.deprecation import deprecated
from lightning_fed.setup_checks import (
    check_fit_setup,
    check_module_setup,
    check_no_sync_batchnorm,
    check_process_group,
    check_round_settings,
)

deprecated(
    "`lightning_fed.validation` was renamed to `lightning_fed.setup_checks`; import from there. This alias goes in"
    " the next release.",
    stacklevel=2,
)

__all__ = [
    "check_fit_setup",
    "check_module_setup",
    "check_no_sync_batchnorm",
    "check_process_group",
    "check_round_settings",
]
