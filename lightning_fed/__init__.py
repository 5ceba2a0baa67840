"""lightning_fed: federated learning on non-IID data as an ordinary PyTorch Lightning workflow.

The names below are imported on first use (:mod:`lightning_fed.utilities.lazy`): a module such as
``lightning_fed.deploy.flower`` loads without the Lightning stack.
"""

from typing import TYPE_CHECKING

from lightning_fed.utilities.lazy import lazy_exports

if TYPE_CHECKING:
    from lightning_fed.aggregators import Aggregator, FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi
    from lightning_fed.callbacks import FedCallback, ParameterPenalty, RoundProgressBar
    from lightning_fed.client_store import ClientStateStore
    from lightning_fed.context import ClientContext, ClientUpdate, RoundContext, RoundResult
    from lightning_fed.engine import ClientDivergedError
    from lightning_fed.trainer import FederatedTrainer, FitInterrupted

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(
        ("Aggregator", "FedAdagrad", "FedAdam", "FedAvg", "FedAvgM", "FedYogi"), "lightning_fed.aggregators"
    ),
    **dict.fromkeys(("FedCallback", "ParameterPenalty", "RoundProgressBar"), "lightning_fed.callbacks"),
    "ClientStateStore": "lightning_fed.client_store",
    **dict.fromkeys(("ClientContext", "ClientUpdate", "RoundContext", "RoundResult"), "lightning_fed.context"),
    "ClientDivergedError": "lightning_fed.engine.rejection",
    **dict.fromkeys(("FederatedTrainer", "FitInterrupted"), "lightning_fed.trainer"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
