"""Federated callbacks: the hook base, the parameter-penalty base and the algorithms built on them."""

from lightning_fed.callbacks.apfl import APFL
from lightning_fed.callbacks.feature_loss import FeatureLossTerm, FeatureMixin
from lightning_fed.callbacks.fedamp import FedAMP
from lightning_fed.callbacks.fedcurv import FedCurv
from lightning_fed.callbacks.fedgg import FedGG
from lightning_fed.callbacks.fedprox import FedProx
from lightning_fed.callbacks.finetune import FineTune
from lightning_fed.callbacks.heurfedamp import HeurFedAMP
from lightning_fed.callbacks.lora_ranks import LoRARanks
from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.callbacks.progress import RoundProgressBar
from lightning_fed.callbacks.rfedavg import RFedAvg
from lightning_fed.callbacks.scaffold import Scaffold
from lightning_fed.callbacks.separate import Separate
from lightning_fed.callbacks.warmup import SharedDataWarmup
from lightning_fed.callbacks.weight_divergence import WeightDivergence
from lightning_fed.hooks import FedCallback

__all__ = [
    "APFL",
    "FeatureLossTerm",
    "FeatureMixin",
    "FedAMP",
    "FedCallback",
    "FedCurv",
    "FedGG",
    "FedProx",
    "FineTune",
    "HeurFedAMP",
    "LoRARanks",
    "ParameterPenalty",
    "RFedAvg",
    "RoundProgressBar",
    "Scaffold",
    "Separate",
    "SharedDataWarmup",
    "WeightDivergence",
]
