"""Server-side aggregation rules."""

from lightning_fed.aggregators.base import Aggregator
from lightning_fed.aggregators.dp_fedavg import DPFedAvg
from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.aggregators.qfedavg import QFedAvg

__all__ = ["Aggregator", "DPFedAvg", "FedAvg", "QFedAvg"]
