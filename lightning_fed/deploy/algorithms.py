"""Which fits may be deployed, and whether a site and the server run the same one.

The algorithm objects themselves and what of them crosses (broadcast state down, round state up) are the seam's,
:mod:`lightning_fed.engine.algorithm_state`; a deployment adds the checks here: the configuration's fingerprint a site
must share with the server, and the algorithms that cannot run with their clients' state kept at the sites.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule

from lightning_fed.engine import algorithm_objects
from lightning_fed.hooks import FederatedTrainerView
from lightning_fed.run.fingerprint import Fingerprint, differences, experiment_fingerprint, format_differences
from lightning_fed.trainer import FederatedTrainer


def algorithm_fingerprint(
    trainer: FederatedTrainer, model: LightningModule, fingerprint: Fingerprint | None = None
) -> dict[str, Any]:
    """What a site must share with the server: the experiment fingerprint (model, aggregator, callbacks, training
    settings) without the data settings, which are each site's own, and the seed, which the task carries."""
    full = fingerprint if fingerprint is not None else experiment_fingerprint(trainer, model, None)
    return {
        key: value
        for key, value in full.items()
        if key != "data" and not key.startswith("data.") and key != "trainer.seed"
    }


def check_same_configuration(server: dict[str, Any], site: dict[str, Any]) -> None:
    """Refuses a task from a server whose configuration differs from the site's, naming every difference.

    Raises:
        ValueError: If a key differs.
    """
    diff = differences(server, site)
    if diff:
        raise ValueError(
            "This site was built from another configuration than the server's (server -> site):\n"
            f"{format_differences(diff)}\nStart the site from the app's config.yaml; only the `data` section may"
            " differ (the site's `data-config`)."
        )


def check_deployable(trainer: FederatedTrainerView) -> None:
    """Refuses, in one line, an algorithm whose server reads the clients' own stored state.

    Such an algorithm (FedAMP's attentive cloud models read every client's ``w_i``; rFedAvg's every ``δ_i``) would
    need the sites' stores at the server, which a deployment keeps at the sites.

    Raises:
        ValueError: If an algorithm object declares ``server_reads_client_store``.
    """
    for key, obj in algorithm_objects(trainer).items():
        if obj.server_reads_client_store:
            raise ValueError(
                f"{type(obj).__name__} ({key}) cannot be deployed: its server reads every client's stored state"
                f" (client store namespaces {list(obj.client_state_namespaces)}), which stays at the sites in a"
                " deployment. Run it in simulation (`lightning-fed fit`), or deploy another algorithm."
            )


__all__ = ["algorithm_fingerprint", "check_deployable", "check_same_configuration"]
