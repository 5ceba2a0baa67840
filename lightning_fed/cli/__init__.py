"""``lightning-fed``: the command line (LightningCLI with federated defaults and one-line errors)."""

from lightning_fed.cli.main import FederatedCLI, main

__all__ = ["FederatedCLI", "main"]
