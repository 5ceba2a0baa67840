"""Loggers."""

from lightning_fed.loggers.wandb import WandbLogger, has_wandb_credentials

__all__ = ["WandbLogger", "has_wandb_credentials"]
