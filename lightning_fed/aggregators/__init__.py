"""Server-side aggregation rules."""

from lightning_fed.aggregators.base import Aggregator
from lightning_fed.aggregators.fedadagrad import FedAdagrad
from lightning_fed.aggregators.fedadam import FedAdam
from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.aggregators.fedavgm import FedAvgM
from lightning_fed.aggregators.fedyogi import FedYogi
from lightning_fed.aggregators.qfedavg import QFedAvg
from lightning_fed.aggregators.server_optimizer import AdaptiveServerOptimizer, ServerOptimizer

__all__ = [
    "AdaptiveServerOptimizer",
    "Aggregator",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedYogi",
    "QFedAvg",
    "ServerOptimizer",
]
