"""The algorithm objects of a fit that cross between a deployment's server and its sites, and which may.

An algorithm object is the aggregator or a callback that declares cross-process state
(:class:`~lightning_fed.parallel.reduction.CrossProcessState`). A site builds the same objects from the same
configuration, so both sides key them alike: ``"aggregator"``, then ``"callback-<i>-<Class>"`` in the order of the
trainer's callbacks.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ProgressBar

from lightning_fed.hooks import FederatedTrainerView
from lightning_fed.parallel.reduction import CrossProcessState
from lightning_fed.run.fingerprint import Fingerprint, differences, experiment_fingerprint, format_differences
from lightning_fed.trainer import FederatedTrainer


def algorithm_objects(trainer: FederatedTrainerView) -> dict[str, CrossProcessState]:
    """The fit's aggregator and state-declaring callbacks, by their key on the wire."""
    objects: dict[str, CrossProcessState] = {"aggregator": trainer.aggregator}
    position = 0
    for callback in trainer.callbacks:
        # A progress bar shows the run and changes nothing in it (the experiment fingerprint leaves it out too): a
        # site, which shows nothing, need not build it.
        if isinstance(callback, CrossProcessState) and not isinstance(callback, ProgressBar):
            objects[f"callback-{position}-{type(callback).__name__}"] = callback
            position += 1
    return objects


def broadcast(trainer: FederatedTrainerView) -> dict[str, dict[str, Any]]:
    """Every algorithm object's broadcast state (what a client needs of the server's state this round)."""
    return {key: obj.broadcast_state() for key, obj in algorithm_objects(trainer).items()}


def load_broadcast(trainer: FederatedTrainerView, states: dict[str, dict[str, Any]]) -> None:
    """Loads the server's broadcast state into the site's algorithm objects (their other state stays as built).

    Raises:
        ValueError: If the site's algorithms are not the server's (another configuration).
    """
    objects = algorithm_objects(trainer)
    if set(objects) != set(states):
        raise ValueError(
            f"The server runs the algorithms {sorted(states)} but this site built {sorted(objects)}: start the site"
            " from the same app config as the server."
        )
    for key, state in states.items():
        if not state:
            continue
        obj: Any = objects[key]
        full = dict(obj.state_dict())
        full.update(state)
        obj.load_state_dict(full)


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


__all__ = [
    "algorithm_fingerprint",
    "algorithm_objects",
    "broadcast",
    "check_deployable",
    "check_same_configuration",
    "load_broadcast",
]
