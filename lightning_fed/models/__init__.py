"""Reference networks of the papers and the LightningModule that trains them."""

from __future__ import annotations

from lightning_fed.models.char_lstm import CharLSTM
from lightning_fed.models.classifier import ClassifierModule
from lightning_fed.models.cnn import FedAvgCNN
from lightning_fed.models.hf_lora import HFLoRAModule
from lightning_fed.models.lenet import LeNet5
from lightning_fed.models.mlp import MLP
from lightning_fed.models.mnist1d_cnn import MNIST1DCNN
from lightning_fed.models.pfl_cnn import PflCifarCNN
from lightning_fed.models.sentiment_lstm import SentimentLSTM, glove_embedding_matrix
from lightning_fed.models.vgg import VGG16

__all__ = [
    "MLP",
    "MNIST1DCNN",
    "VGG16",
    "CharLSTM",
    "ClassifierModule",
    "FedAvgCNN",
    "HFLoRAModule",
    "LeNet5",
    "PflCifarCNN",
    "SentimentLSTM",
    "glove_embedding_matrix",
]
