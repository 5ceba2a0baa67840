"""lightning_fed: federated learning on non-IID data as an ordinary PyTorch Lightning workflow."""

from lightning_fed.aggregators import Aggregator, FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi
from lightning_fed.callbacks import FedCallback, ParameterPenalty, RoundProgressBar
from lightning_fed.client_store import ClientStateStore
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext, RoundResult
from lightning_fed.engine.rejection import ClientDivergedError
from lightning_fed.trainer import FederatedTrainer, FitInterrupted

__version__ = "0.1.0"

__all__ = [
    "Aggregator",
    "ClientContext",
    "ClientDivergedError",
    "ClientStateStore",
    "ClientUpdate",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedYogi",
    "FedCallback",
    "FederatedTrainer",
    "FitInterrupted",
    "ParameterPenalty",
    "RoundContext",
    "RoundResult",
    "RoundProgressBar",
]
