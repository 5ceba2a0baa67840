"""A minimal LoRA linear layer and a small classifier built from it, for the LoRA aggregation tests (no ``peft``)."""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn

from helpers.boring import NUM_CLASSES, NUM_FEATURES


class LoRALinear(nn.Module):
    """``y = W0 x + b0 + (alpha / r) B A x`` with ``W0``, ``b0`` frozen, ``A`` Kaiming-uniform and ``B`` zero at init.

    ``style="peft"`` names the factors as PEFT does (``lora_A.default.weight``, ``lora_B.default.weight``),
    ``style="litgpt"`` as LitGPT does (parameters ``lora_A``, ``lora_B``). ``train_a=False`` freezes ``A`` (FFA-LoRA).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float = 8.0,
        style: Literal["peft", "litgpt"] = "peft",
        train_a: bool = True,
    ) -> None:
        super().__init__()
        self.base = nn.Linear(in_features, out_features)
        self.base.requires_grad_(False)
        self.scaling = alpha / rank
        self.style = style
        a = torch.empty(rank, in_features)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        b = torch.zeros(out_features, rank)
        if style == "peft":
            self.lora_A = nn.ModuleDict({"default": nn.Linear(in_features, rank, bias=False)})
            self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, out_features, bias=False)})
            with torch.no_grad():
                self.lora_A["default"].weight.copy_(a)
                self.lora_B["default"].weight.copy_(b)
        else:
            self.lora_A = nn.Parameter(a)  # type: ignore[assignment]
            self.lora_B = nn.Parameter(b)  # type: ignore[assignment]
        self.factor_a.requires_grad_(train_a)

    @property
    def factor_a(self) -> torch.Tensor:
        return self.lora_A["default"].weight if self.style == "peft" else self.lora_A  # type: ignore[return-value]

    @property
    def factor_b(self) -> torch.Tensor:
        return self.lora_B["default"].weight if self.style == "peft" else self.lora_B  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * F.linear(F.linear(x, self.factor_a), self.factor_b)


class LoRAClassifier(L.LightningModule):
    """Two LoRA layers over a frozen base and a trainable head (the MLP of ``BoringClassifier``'s data)."""

    def __init__(
        self,
        rank: int = 4,
        hidden: int = 16,
        lr: float = 0.05,
        style: Literal["peft", "litgpt"] = "peft",
        train_a: bool = True,
        optimizer: Literal["sgd", "adamw"] = "sgd",
    ) -> None:
        super().__init__()
        self.layer1 = LoRALinear(NUM_FEATURES, hidden, rank, style=style, train_a=train_a)
        self.layer2 = LoRALinear(hidden, hidden, rank, style=style, train_a=train_a)
        self.head = nn.Linear(hidden, NUM_CLASSES)
        self.lr = lr
        self.optimizer = optimizer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.layer2(torch.relu(self.layer1(x)))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("test_loss", F.cross_entropy(logits, y))
        self.log("test_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trainable = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer == "adamw":
            return torch.optim.AdamW(trainable, lr=self.lr, weight_decay=0.01)
        return torch.optim.SGD(trainable, lr=self.lr, momentum=0.9)
