"""Federated callbacks: the hook base, the parameter-penalty base and the algorithms built on them."""

from lightning_fed.callbacks.base import FedCallback
from lightning_fed.callbacks.feature_loss import FeatureLossTerm, FeatureMixin
from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.callbacks.progress import RoundProgressBar

__all__ = ["FeatureLossTerm", "FeatureMixin", "FedCallback", "ParameterPenalty", "RoundProgressBar"]
