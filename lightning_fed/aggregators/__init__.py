"""Server-side aggregation rules."""

from lightning_fed.aggregators.base import Aggregator
from lightning_fed.aggregators.bulyan import Bulyan
from lightning_fed.aggregators.dp_fedavg import DPFedAvg
from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.aggregators.krum import Krum, MultiKrum
from lightning_fed.aggregators.median import FedMedian, TrimmedMean
from lightning_fed.aggregators.normbound import NormBound
from lightning_fed.aggregators.qfedavg import QFedAvg
from lightning_fed.aggregators.robust import RobustAggregator

__all__ = [
    "Aggregator",
    "Bulyan",
    "DPFedAvg",
    "FedAvg",
    "FedMedian",
    "Krum",
    "MultiKrum",
    "NormBound",
    "QFedAvg",
    "RobustAggregator",
    "TrimmedMean",
]
