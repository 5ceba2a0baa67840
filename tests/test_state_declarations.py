"""Every shipped algorithm declares where its state lives, and the declarations match what its runs actually do.

``CrossProcessState`` declares, per class: the client-store namespaces it keeps per client
(``client_state_namespaces``), the ``state_dict`` entries a client needs each round (``broadcast_keys``), and whether
all its round state is a sum (``round_state_is_sum``, usable under secure aggregation). Each algorithm runs two
rounds here, and:

* the namespaces its run writes into the client store are exactly the declared ones;
* it declares ``round_state_is_sum`` exactly when nothing but sums reaches the server: every declared round state
  is a ``"sum"`` (the aggregators' integer-buffer ``"last"`` is sent in clear and not counted), its own code calls
  no gather, no server hook (``on_round_start``, ``on_aggregate``, ``on_round_end``) reads its per-client store
  entries, and it holds back no updates to rewrite them together;
* it declares ``server_reads_client_store`` exactly when a server hook reads its per-client store entries (a
  deployment, which keeps the store at the sites, refuses such an algorithm);
* the client half of each round reads nothing of its ``state_dict`` beyond ``broadcast_keys``: every other entry is
  poisoned (NaN) while the client half runs and restored before the server half closes the round, and the run must
  end bit-identical to an unpoisoned one. State the server half prepares in ``on_round_start`` counts as sent;
* its state is the module's federated part only: on a model with a frozen trunk, no frozen tensor is in anything
  it keeps, sums, stores, checkpoints or sends, and a NaN written into every copy of the frozen base outside the
  module (in the round's global model, a client's start point or update, a store entry) changes nothing.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, FrozenTrunkClassifier, fast_trainer, global_weights, make_datamodule

from lightning_fed import callbacks as C
from lightning_fed.aggregators import (
    Bulyan,
    DPFedAvg,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedYogi,
    Krum,
    LoRAFedAvg,
    MultiKrum,
    NormBound,
    QFedAvg,
    TrimmedMean,
)
from lightning_fed.attacks import MaliciousClients
from lightning_fed.client_store import ClientStateStore
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.datamodules import DataSharing
from lightning_fed.engine.client_half import ClientHalf
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.hooks import FedCallback
from lightning_fed.messages import ClientTask
from lightning_fed.parallel import distributed
from lightning_fed.parallel.reduction import CrossProcessState

NUM_CLIENTS = 7  # Bulyan(num_byzantine=1) needs n >= 4f + 3
# The base's integer-buffer policy (num_batches_tracked from the round's last client) travels in clear.
INTEGER_POLICY = "_last_integer_entries"

Setup = Callable[[], tuple[Any, list[FedCallback]]]

# Hooks of the server half: what they read of the client store came from the clients one by one.
SERVER_HOOKS = {"on_round_start", "on_aggregate", "on_round_end"}
# Declared stricter than their data flow, on purpose.
STRICTER_BY_DESIGN = {
    # Each site could clip its own update into the sum, but the bound defends against a malicious client only when
    # the server, which sees every update, clips it.
    "NormBound": False,
}

# Zhao et al.'s warm-up needs a datamodule that shares data; every other algorithm runs on a plain IID split.
DATAMODULE_KWARGS: dict[str, dict[str, Any]] = {
    "SharedDataWarmup": {"sharing": DataSharing(beta=0.1, alpha=0.5, warmup_epochs=1)},
}

ALGORITHMS: dict[str, Setup] = {
    "FedAvg": lambda: (FedAvg(), []),
    "FedAvgM": lambda: (FedAvgM(server_lr=0.5, momentum=0.9), []),
    "FedAdam": lambda: (FedAdam(server_lr=0.05), []),
    "FedYogi": lambda: (FedYogi(server_lr=0.05), []),
    "FedAdagrad": lambda: (FedAdagrad(server_lr=0.05), []),
    "QFedAvg": lambda: (QFedAvg(q=1.0), []),
    "DPFedAvg": lambda: (
        DPFedAvg(clip_norm=0.5, noise_multiplier=1.0, adaptive_clipping=True, clipped_count_stddev=1.0, delta=1e-3),
        [],
    ),
    "FedMedian": lambda: (FedMedian(), []),
    "TrimmedMean": lambda: (TrimmedMean(beta=0.2), []),
    "Krum": lambda: (Krum(num_byzantine=1), []),
    "MultiKrum": lambda: (MultiKrum(num_byzantine=1, num_selected=3), []),
    "Bulyan": lambda: (Bulyan(num_byzantine=1), []),
    "NormBound": lambda: (NormBound(FedAvg(), max_norm=0.6), []),
    # Each mode declares its own round state; this module has no LoRA layer (the LoRA tests cover the factors).
    "LoRAFedAvg": lambda: (LoRAFedAvg(), []),
    "LoRAFedAvg-ffa": lambda: (LoRAFedAvg(mode="ffa"), []),
    "LoRAFedAvg-exact": lambda: (LoRAFedAvg(mode="exact"), []),
    "LoRARanks": lambda: (LoRAFedAvg(mode="exact"), [C.LoRARanks([1, 2])]),
    "FedProx": lambda: (FedAvg(), [C.FedProx(mu=0.1)]),
    "FedCurv": lambda: (FedAvg(), [C.FedCurv(lam=0.1)]),
    "FedGG": lambda: (FedAvg(), [C.FedGG(mu=0.1)]),
    "Scaffold": lambda: (FedAvg(weighting="uniform"), [C.Scaffold()]),
    "APFL": lambda: (FedAvg(), [C.APFL(alpha=0.25)]),
    "FedAMP": lambda: (FedAvg(), [C.FedAMP(alpha_k=0.1, lam=1.0, sigma=2.0, heatmap_every_n_rounds=0)]),
    "HeurFedAMP": lambda: (FedAvg(), [C.HeurFedAMP(alpha_k=0.1, lam=1.0, sigma=2.0, heatmap_every_n_rounds=0)]),
    "RFedAvg": lambda: (FedAvg(weighting="uniform"), [C.RFedAvg(lam=0.01, variant="v1", feature_layer="net.2")]),
    "RFedAvg+": lambda: (FedAvg(weighting="uniform"), [C.RFedAvg(lam=0.01, variant="plus", feature_layer="net.2")]),
    "Separate": lambda: (FedAvg(), [C.Separate()]),
    "FineTune": lambda: (FedAvg(), [C.FineTune(epochs=1)]),
    "WeightDivergence": lambda: (FedAvg(), [C.WeightDivergence()]),
    "MaliciousClients": lambda: (FedAvg(), [MaliciousClients(fraction=0.5, attack="alie")]),
    "SharedDataWarmup": lambda: (FedAvg(), [C.SharedDataWarmup(epochs=1)]),
}


def _fit(tmp_path, name: str, monkeypatch, client_half_wrapper=None) -> dict[str, Any]:
    aggregator, callbacks = ALGORITHMS[name]()
    plugins: list[CrossProcessState] = [aggregator, *callbacks]
    written: dict[str, set[str]] = {}
    original_put = ClientStateStore.put

    def recording_put(store, namespace, client_id, value):
        written.setdefault("all", set()).add(namespace)
        return original_put(store, namespace, client_id, value)

    monkeypatch.setattr(ClientStateStore, "put", recording_put)
    # An exchange that bypasses the declared round state (a plug-in calling a gather itself) is no sum either.
    gathers: dict[str, set[str]] = {}
    for collective in ("all_gather_object", "all_gather_rows"):
        monkeypatch.setattr(distributed, collective, _recording(getattr(distributed, collective), plugins, gathers))
    # Per-client state the server half reads (a personalised model, a feature statistic) reached the server one
    # client at a time; and updates held back to be rewritten together (attack simulation) were seen together.
    server_reads: set[str] = set()
    original_get, original_call = ClientStateStore.get, HookDispatcher.call
    in_server_hook = [False]

    def recording_get(store, namespace, client_id, *args, **kwargs):
        if in_server_hook[0]:
            server_reads.add(namespace)
        return original_get(store, namespace, client_id, *args, **kwargs)

    def recording_call(dispatcher, hook, *args):
        in_server_hook[0] = hook in SERVER_HOOKS
        try:
            if hook == "on_clients_end" and args[1]:
                for callback in dispatcher.overriding(hook):
                    gathers.setdefault(type(callback).__name__, set()).add("held updates")
            return original_call(dispatcher, hook, *args)
        finally:
            in_server_hook[0] = False

    monkeypatch.setattr(ClientStateStore, "get", recording_get)
    monkeypatch.setattr(HookDispatcher, "call", recording_call)
    if client_half_wrapper is not None:
        original_run = ClientHalf.run_task
        monkeypatch.setattr(ClientHalf, "run_task", client_half_wrapper(original_run, plugins))
    torch.manual_seed(0)
    module = BoringClassifier(batch_norm=True)
    trainer = fast_trainer(
        tmp_path, num_rounds=2, clients_per_round=NUM_CLIENTS, aggregator=aggregator, callbacks=callbacks, seed=0
    )
    datamodule = make_datamodule(num_clients=NUM_CLIENTS, num_samples=240, **DATAMODULE_KWARGS.get(name, {}))
    trainer.fit(module, datamodule=datamodule)
    monkeypatch.undo()
    reductions = {
        type(p).__name__: {name: spec.reduce for name, spec in p._declared_round_state().items()} for p in plugins
    }
    for plugin in plugins:
        if server_reads & set(plugin.client_state_namespaces):
            gathers.setdefault(type(plugin).__name__, set()).add("client state read by the server")
    return {
        "plugins": plugins,
        "written": written.get("all", set()),
        "reductions": reductions,
        "gathers": gathers,
        "weights": global_weights(module),
    }


def _recording(collective, plugins, gathers):
    """``collective``, noting which plug-in's own code (its class or a base's module) called it."""

    def call(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        # The declared reductions gather merges themselves (lightning_fed.parallel): those are counted by kind.
        for plugin in [] if caller.startswith("lightning_fed.parallel") else plugins:
            if any(cls.__module__ == caller for cls in type(plugin).__mro__):
                gathers.setdefault(type(plugin).__name__, set()).add("gather")
        return collective(*args, **kwargs)

    return call


def _poisoned(value: Any) -> Any:
    """``value`` with every float replaced by NaN (tensors, numbers, nested containers); other values kept."""
    if isinstance(value, torch.Tensor):
        return torch.full_like(value, math.nan) if value.is_floating_point() else value.clone()
    if isinstance(value, float):
        return math.nan
    if isinstance(value, dict):
        return {key: _poisoned(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_poisoned(item) for item in value)
    return copy.deepcopy(value)


def _poison_what_is_not_broadcast(original_run, plugins):
    def run(self, task):
        saved = []
        for plugin in plugins:
            state = copy.deepcopy(plugin.state_dict())
            keep = set(state) if plugin.broadcast_keys is None else set(plugin.broadcast_keys)
            if set(state) - keep:
                plugin.load_state_dict(
                    {key: value if key in keep else _poisoned(value) for key, value in state.items()}
                )
                saved.append((plugin, state))
        try:
            return original_run(self, task)
        finally:
            for plugin, state in saved:
                plugin.load_state_dict(state)

    return run


def _shipped_plugin_types() -> set[type]:
    found: set[type] = set()
    for name in ALGORITHMS:
        aggregator, callbacks = ALGORITHMS[name]()
        found.update(type(p) for p in [aggregator, *callbacks])
    return found


def test_every_shipped_algorithm_is_covered():
    import lightning_fed.aggregators as A
    import lightning_fed.attacks as T

    shipped = set()
    for package in (A, C, T):
        for name in package.__all__:
            obj = getattr(package, name)
            if (
                isinstance(obj, type)
                and issubclass(obj, CrossProcessState)
                and not getattr(obj, "__abstractmethods__", None)
            ):
                shipped.add(obj)
    # Bases and helpers that are no algorithm of their own.
    shipped -= {C.FedCallback, C.ParameterPenalty, C.FeatureLossTerm, C.RoundProgressBar}
    shipped -= {A.ServerOptimizer, A.AdaptiveServerOptimizer, A.RobustAggregator}
    assert shipped <= _shipped_plugin_types(), sorted(t.__name__ for t in shipped - _shipped_plugin_types())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_declarations_match_what_the_run_does(tmp_path, monkeypatch, name):
    run = _fit(tmp_path / "plain", name, monkeypatch)
    plugins = run["plugins"]
    declared_namespaces = {ns for p in plugins for ns in p.client_state_namespaces}
    assert run["written"] - {"optimizer"} == declared_namespaces, (name, sorted(run["written"]))
    for plugin in plugins:
        kinds = {kind for state, kind in run["reductions"][type(plugin).__name__].items() if state != INTEGER_POLICY}
        kinds |= run["gathers"].get(type(plugin).__name__, set())
        expected = STRICTER_BY_DESIGN.get(type(plugin).__name__, kinds <= {"sum"})
        assert plugin.round_state_is_sum == expected, (type(plugin).__name__, kinds)
        # A deployment keeps the client store at the sites: an algorithm whose server hooks read it must say so.
        read_on_server = "client state read by the server" in run["gathers"].get(type(plugin).__name__, set())
        assert plugin.server_reads_client_store == read_on_server, (type(plugin).__name__, read_on_server)
        state = plugin.state_dict()
        if plugin.broadcast_keys is not None:
            assert set(plugin.broadcast_keys) <= set(state), (type(plugin).__name__, sorted(state))
            assert plugin.broadcast_state().keys() == set(plugin.broadcast_keys)
    poisoned = _fit(tmp_path / "poisoned", name, monkeypatch, _poison_what_is_not_broadcast)
    for key, value in run["weights"].items():
        assert torch.equal(poisoned["weights"][key], value), (name, key)


FROZEN = set(FrozenTrunkClassifier.FROZEN)


def _frozen_keys_in(value: Any, found: set[str], depth: int = 0) -> None:
    """Adds to ``found`` every frozen key of a mapping anywhere inside ``value``."""
    if depth > 12:
        return
    if isinstance(value, dict):
        found.update(key for key in value if key in FROZEN)
        for item in value.values():
            _frozen_keys_in(item, found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _frozen_keys_in(item, found, depth + 1)


def _poison_frozen(value: Any, depth: int = 0) -> None:
    """Fills with NaN, in place, every frozen tensor of a mapping anywhere inside ``value``."""
    if depth > 12:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if key in FROZEN and isinstance(item, torch.Tensor) and item.is_floating_point():
                with torch.no_grad():
                    item.fill_(math.nan)
            else:
                _poison_frozen(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _poison_frozen(item, depth + 1)


class _PoisonFrozenCopies(FedCallback):
    """Poisons every copy of the frozen base a round hands around (and notes which frozen keys it saw)."""

    def __init__(self, seen: set[str]) -> None:
        self.seen = seen

    def _check(self, *values: Any) -> None:
        for value in values:
            _frozen_keys_in(value, self.seen)
            _poison_frozen(value)

    def on_round_start(self, trainer, pl_module, round_ctx: RoundContext) -> None:
        self._check(round_ctx.global_params, round_ctx.extras)

    def on_client_start(self, trainer, pl_module, client_ctx: ClientContext) -> None:
        self._check(client_ctx.global_params, client_ctx.initial_params, client_ctx.extras)

    def on_client_end(self, trainer, pl_module, client_ctx: ClientContext, update: ClientUpdate) -> None:
        self._check(update.params, client_ctx.initial_params, client_ctx.extras)

    def on_aggregate(self, trainer, pl_module, round_ctx: RoundContext, new_params) -> None:
        self._check(new_params)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_state_is_the_federated_part_only(tmp_path, monkeypatch, name):
    """On a frozen-trunk model every algorithm's state (sums, server moments, control variates, Fisher statistics,
    personal models, per-client updates, the store, the checkpoint's client state, the tasks) is the federated part
    only, and NaN in every copy of the frozen base outside the module changes nothing: none is ever read."""
    seen: set[str] = set()
    original_put, original_run = ClientStateStore.put, ClientHalf.run_task

    def recording_put(store, namespace, client_id, value):
        _frozen_keys_in(value, seen)
        _poison_frozen(value)
        return original_put(store, namespace, client_id, value)

    def recording_run(self, task: ClientTask):
        _frozen_keys_in(task.global_params, seen)
        _poison_frozen(task.global_params)
        return original_run(self, task)

    def fit(poison: bool) -> tuple[FrozenTrunkClassifier, Any, list[CrossProcessState]]:
        aggregator, callbacks = ALGORITHMS[name]()
        if poison:
            callbacks = [*callbacks, _PoisonFrozenCopies(seen)]
        torch.manual_seed(0)
        module = FrozenTrunkClassifier()
        trainer = fast_trainer(
            tmp_path / str(poison),
            num_rounds=2,
            clients_per_round=NUM_CLIENTS,
            aggregator=aggregator,
            callbacks=callbacks,
            seed=0,
        )
        datamodule = make_datamodule(num_clients=NUM_CLIENTS, num_samples=240, **DATAMODULE_KWARGS.get(name, {}))
        trainer.fit(module, datamodule=datamodule)
        return module, trainer, [aggregator, *callbacks]

    plain, _, _ = fit(poison=False)
    monkeypatch.setattr(ClientStateStore, "put", recording_put)
    monkeypatch.setattr(ClientHalf, "run_task", recording_run)
    module, trainer, plugins = fit(poison=True)
    monkeypatch.undo()
    # What outlives the rounds: every algorithm's state_dict and the checkpoint's federated part (client store,
    # aggregator, sampler).
    for plugin in plugins:
        _frozen_keys_in(plugin.state_dict(), seen)
    checkpoint = trainer.federated_checkpoint()
    # The frozen base is named in the checkpoint by its fingerprint only: a short hash per tensor.
    assert all(isinstance(value, str) for value in checkpoint.pop("base")["tensors"].values())
    _frozen_keys_in(checkpoint, seen)
    assert not seen, (name, sorted(seen))
    torch.manual_seed(0)
    initial = FrozenTrunkClassifier().state_dict()
    for key in FROZEN:  # the base is held once, in the module, and never changes
        assert torch.equal(module.state_dict()[key], initial[key]), (name, key)
    for key, value in global_weights(plain).items():
        assert torch.equal(global_weights(module)[key], value), (name, key)
    assert all(torch.isfinite(t).all() for t in global_weights(module).values() if t.is_floating_point()), name
