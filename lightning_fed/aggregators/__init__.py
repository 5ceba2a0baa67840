"""Server-side aggregation rules."""

from lightning_fed.aggregation import Aggregator
from lightning_fed.aggregators.bulyan import Bulyan
from lightning_fed.aggregators.dp_fedavg import DPFedAvg
from lightning_fed.aggregators.fedadagrad import FedAdagrad
from lightning_fed.aggregators.fedadam import FedAdam
from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.aggregators.fedavgm import FedAvgM
from lightning_fed.aggregators.fedyogi import FedYogi
from lightning_fed.aggregators.krum import Krum, MultiKrum
from lightning_fed.aggregators.lora import LoRAFedAvg
from lightning_fed.aggregators.median import FedMedian, TrimmedMean
from lightning_fed.aggregators.normbound import NormBound
from lightning_fed.aggregators.qfedavg import QFedAvg
from lightning_fed.aggregators.robust import RobustAggregator
from lightning_fed.aggregators.server_optimizer import AdaptiveServerOptimizer, ServerOptimizer

__all__ = [
    "AdaptiveServerOptimizer",
    "Aggregator",
    "Bulyan",
    "DPFedAvg",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedMedian",
    "FedYogi",
    "Krum",
    "LoRAFedAvg",
    "MultiKrum",
    "NormBound",
    "QFedAvg",
    "RobustAggregator",
    "ServerOptimizer",
    "TrimmedMean",
]
