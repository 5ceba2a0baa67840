"""Server-side aggregation rules."""

from lightning_fed.aggregators.base import Aggregator
from lightning_fed.aggregators.fedavg import FedAvg

__all__ = ["Aggregator", "FedAvg"]
