"""Two notices of Lightning's that a run has no way to avoid, dropped wherever a federated run meets them.

The ``lightning-fed`` command and :class:`~lightning_fed.FederatedTrainer` (built and fitted from a script) both go
through :func:`without_dependency_notices`, so a first run prints the same, quiet, either way.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

#: Lightning's tip, logged by every ``Trainer`` whose loggers include no ``LitLogger``; no setting turns it off.
LITLOGGER_TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"

# The logger Lightning's `rank_zero_info` logs the tip to.
_RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"


class _DropLitLoggerTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LITLOGGER_TIP)


@contextmanager
def without_dependency_notices() -> Iterator[None]:
    """Drops two notices of Lightning's that a run has no way to avoid, and nothing else, inside the block.

    - Lightning's litlogger tip (:data:`LITLOGGER_TIP`), an advertisement printed by every ``Trainer`` without a
      ``LitLogger``, whatever the run logs to: dropped from the one logger that logs it.
    - torch's ``LeafSpec`` deprecation, raised from inside Lightning (``lightning/pytorch/utilities/_pytree.py``
      builds a ``LeafSpec`` for every ``CombinedLoader``, so every fit and evaluation of any dataloader warns:
      Lightning-AI/pytorch-lightning#21326): ignored for that message from that module only.

    Blocks may nest (the command's around the trainer's); each removes only the filters it added.
    """
    rank_zero_log = logging.getLogger(_RANK_ZERO_LOGGER)
    tip_filter = _DropLitLoggerTip()
    rank_zero_log.addFilter(tip_filter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore",
                message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                category=FutureWarning,
                module=r"lightning\.pytorch\.utilities\._pytree",
            )
            yield
    finally:
        rank_zero_log.removeFilter(tip_filter)


__all__ = ["LITLOGGER_TIP", "without_dependency_notices"]
