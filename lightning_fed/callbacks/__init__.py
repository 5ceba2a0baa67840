"""Federated callbacks: the hook base, the parameter-penalty base and the algorithms built on them."""

from lightning_fed.callbacks.base import FedCallback
from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.callbacks.progress import RoundProgressBar

__all__ = ["FedCallback", "ParameterPenalty", "RoundProgressBar"]
