"""Building a deployment's server and sites from the YAML of ``lightning-fed fit``.

The server and every site parse the same resolved ``config.yaml`` with the CLI's parser (the same checks, the same
one-line errors); a site may add its own YAML (``data-config`` in its node config) that replaces the ``data``
section, so that each organisation points the datamodule at its own files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule

from lightning_fed.cli.main import FederatedCLI
from lightning_fed.deploy.site import SiteBuilder, SiteTrainer
from lightning_fed.trainer import FederatedTrainer


def build_from_config(
    configs: Sequence[str | Path], trainer_class: type[FederatedTrainer] = FederatedTrainer, **cli_kwargs: Any
) -> tuple[LightningModule, LightningDataModule, FederatedTrainer]:
    """The module, datamodule and trainer that ``lightning-fed fit --config <each of configs>`` would build.

    Later files override earlier ones, key by key, as repeated ``--config`` options do.
    """
    args: list[str] = []
    for config in configs:
        args += ["--config", str(config)]
    cli = FederatedCLI(args=args, run=False, trainer_class=trainer_class, **cli_kwargs)
    assert isinstance(cli.trainer, FederatedTrainer)
    return cli.model, cli.datamodule, cli.trainer


def site_builder(config: str | Path, data_config: str | Path | None = None) -> SiteBuilder:
    """Builds a site's objects afresh for each task from the app's ``config`` and the site's ``data_config``.

    A site writes no config copy (it writes no run directory at all).
    """
    configs = [config] if data_config is None else [config, data_config]

    def build() -> tuple[LightningModule, LightningDataModule, SiteTrainer]:
        module, datamodule, trainer = build_from_config(configs, SiteTrainer, save_config_callback=None)
        assert isinstance(trainer, SiteTrainer)
        return module, datamodule, trainer

    return build


__all__ = ["build_from_config", "site_builder"]
