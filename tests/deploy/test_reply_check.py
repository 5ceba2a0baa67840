"""What the server refuses of a site's reply before it folds anything (:mod:`lightning_fed.deploy.reply_check`): a reply
for another round or client, a round state of another shape, dtype or with non-finite values, merged entries of
other clients, a ``last`` entry claiming another position; the size cap, measured against the replies the library's
algorithms really send; and a refused reply leaves the run as a dropped one does."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule
from helpers.deploy_faults import DroppingTransport

from lightning_fed.aggregators import FedAvg
from lightning_fed.aggregators.dp_fedavg import DPFedAvg
from lightning_fed.aggregators.qfedavg import QFedAvg
from lightning_fed.callbacks import Scaffold
from lightning_fed.deploy import ClientSite, LoopbackTransport, RoundReplies, SiteTrainer, serve
from lightning_fed.deploy.reply_check import (
    REPLY_SIZE_FACTOR,
    check_reply,
    reply_size_limit,
    state_bytes,
)
from lightning_fed.deploy.wire import encode
from lightning_fed.messages import ClientReply, ClientTask

NUM_CLIENTS, ROUNDS, TAMPERED, TAMPER_ROUND = 3, 3, 1, 1


def _task(client: int = 1, round_idx: int = 2) -> ClientTask:
    params = {"w": torch.zeros(2, 3), "steps": torch.zeros((), dtype=torch.long)}
    return ClientTask(round_idx, [client], [0, 1, 2], {0: 1, 1: 1, 2: 1}, 0, params, broadcast={"aggregator": {}})


def _expected() -> dict[str, dict[str, tuple[str, Any]]]:
    return {
        "aggregator": {
            "_sum": ("sum", {"w": torch.zeros(2, 3, dtype=torch.float64)}),
            "_weight": ("sum", 0.0),
            "_last": ("last", (-1, {})),
        },
        "callback-0-Losses": {"losses": ("merge", {})},
    }


def _reply() -> ClientReply:
    """An honest reply of client 1 (position 1 in the round) to :func:`_task`."""
    state = {
        "aggregator": {
            "_sum": {"w": torch.ones(2, 3, dtype=torch.float64)},
            "_weight": 1.0,
            "_last": (1, {"steps": torch.tensor(7)}),
        },
        "callback-0-Losses": {"losses": {1: 0.5}},
    }
    return ClientReply(2, [1], state, train_metrics={1: {"loss": 0.5}}, steps=4)


def _set(path: str, value: Any) -> Callable[[ClientReply], None]:
    def edit(reply: ClientReply) -> None:
        *keys, last = path.split(".")
        target: Any = reply.round_state
        for key in keys:
            target = target[key]
        target[last] = value

    return edit


TAMPERS: dict[str, tuple[Callable[[ClientReply], None], str]] = {
    "round": (lambda r: setattr(r, "round_idx", 1), "a reply for round 1 arrived in round 2"),
    "client": (lambda r: setattr(r, "client_ids", [0]), "speaks for clients [0], not for client 1 alone"),
    "metrics": (lambda r: setattr(r, "train_metrics", {0: {}}), "its `train_metrics` speaks for other clients"),
    "rejected": (lambda r: setattr(r, "rejected", {0: "x"}), "its `rejected` speaks for other clients"),
    "dropped": (lambda r: setattr(r, "dropped", [1]), "what only the server's transport may set"),
    "steps": (lambda r: setattr(r, "steps", -1), "its `steps` is -1, not a count"),
    "algorithm": (_set("callback-1-X", {}), "its round state is for algorithms"),
    "name": (_set("aggregator._extra", 1.0), "`aggregator` holds round state"),
    "shape": (_set("aggregator._sum", {"w": torch.ones(3)}), "`aggregator._sum.w` has shape (3,)"),
    "dtype": (_set("aggregator._sum", {"w": torch.ones(2, 3)}), "dtype torch.float32, the server declared"),
    "keys": (_set("aggregator._sum", {"v": torch.ones(2, 3)}), "`aggregator._sum` has other keys"),
    "nan": (_set("aggregator._sum", {"w": torch.full((2, 3), float("nan"), dtype=torch.float64)}), "non-finite"),
    "inf number": (_set("aggregator._weight", float("inf")), "`aggregator._weight` is inf, not a finite number"),
    "merge": (_set("callback-0-Losses.losses", {0: 0.1, 1: 0.5}), "merges entries of other clients than 1"),
    "position": (_set("aggregator._last", (2, {})), "claims another position in the round than the client's (1)"),
    "buffer": (_set("aggregator._last", (1, {"w": torch.ones(2, 3)})), "holds `w`, which is no integer entry"),
    "partial": (lambda r: setattr(r, "partial", True), "partial without secure aggregation"),
}


def test_an_honest_reply_passes():
    assert check_reply(_reply(), _task(), _expected()) is None
    rejected = _reply()
    rejected.rejected, rejected.train_metrics = {1: "diverged"}, {}
    assert check_reply(rejected, _task(), _expected()) is None


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_a_tampered_reply_is_refused_naming_what_is_wrong(name):
    tamper, says = TAMPERS[name]
    reply = copy.deepcopy(_reply())
    tamper(reply)
    why = check_reply(reply, _task(), _expected())
    assert why is not None and says in why and "\n" not in why


def test_an_evaluation_reply_carries_no_round_state():
    task = _task()
    task.evaluate = True
    assert check_reply(ClientReply(2, [1], {}, eval_metrics={1: {"acc": 1.0}}), task) is None
    assert "carries round state" in str(check_reply(_reply(), task))


# The algorithms whose replies set the size cap: the sums of the model, SCAFFOLD's control changes besides them,
# DP-FedAvg's clipped sums and q-FedAvg's, and integer buffers (BatchNorm's counter).
SIZE_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "fedavg": lambda: {"aggregator": FedAvg()},
    "scaffold": lambda: {"aggregator": FedAvg(weighting="uniform"), "callbacks": [Scaffold()]},
    "dp-fedavg": lambda: {"aggregator": DPFedAvg(clip_norm=1.0, noise_multiplier=0.1)},
    "qfedavg": lambda: {"aggregator": QFedAvg(q=1.0)},
}


def _settings(**overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = dict(
        num_rounds=ROUNDS, clients_per_round=NUM_CLIENTS, client_eval="none", eval_every_n_rounds=0, seed=0
    )
    settings.update(overrides)
    return settings


def _sites(state_dir: Path, settings: Callable[[], dict[str, Any]]) -> dict[int, ClientSite]:
    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(default_root_dir=str(state_dir / "site"), accelerator="cpu", devices=1, **settings())
        return BoringClassifier(lr=0.1, batch_norm=True), make_datamodule(NUM_CLIENTS), trainer

    return {cid: ClientSite(build, state_dir) for cid in range(NUM_CLIENTS)}


class MeasuringTransport(LoopbackTransport):
    """The loopback, keeping for each reply the ratio of its round state's bytes to what its task carried, and
    whether its encoded size kept within :func:`reply_size_limit`."""

    def __init__(self, sites: dict[int, ClientSite]) -> None:
        super().__init__(sites)
        self.ratios: list[float] = []
        self.within: list[bool] = []

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        received = super().exchange(tasks)
        for task in tasks:
            reply = received.replies[task.client_id]
            carried = state_bytes(task.global_params) + state_bytes(task.broadcast)
            self.ratios.append(state_bytes(reply.round_state) / carried)
            self.within.append(len(encode(reply)) <= reply_size_limit(task))
        return received


@pytest.mark.parametrize("algorithm", sorted(SIZE_CASES))
def test_the_size_cap_holds_what_the_algorithms_send(tmp_path, algorithm):
    settings = lambda: _settings(num_rounds=1, **SIZE_CASES[algorithm]())  # noqa: E731
    transport = MeasuringTransport(_sites(tmp_path / "sites", settings))
    serve(fast_trainer(tmp_path / "server", **settings()), BoringClassifier(lr=0.1, batch_norm=True),
          make_datamodule(NUM_CLIENTS), transport)  # fmt: skip
    assert transport.within and all(transport.within)
    print(f"{algorithm}: round state / carried state = {max(transport.ratios):.2f}")
    assert 0.9 <= max(transport.ratios) <= REPLY_SIZE_FACTOR / 1.5


class TamperingTransport(LoopbackTransport):
    """The loopback, changing client ``TAMPERED``'s reply in round ``TAMPER_ROUND`` with ``tamper`` (a hostile
    site); nothing is dropped here (the server must refuse the reply itself)."""

    def __init__(self, sites: dict[int, ClientSite], tamper: Callable[[ClientReply], None]) -> None:
        super().__init__(sites)
        self.tamper = tamper

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        received = super().exchange(tasks)
        if any(not task.evaluate and task.round_idx == TAMPER_ROUND for task in tasks):
            self.tamper(received.replies[TAMPERED])
        return received


def _sent_sum(reply: ClientReply) -> dict[str, torch.Tensor]:
    """FedAvg's sum as the site sent it: one client's share as float32 entries and a weight (``pack_round_state``)."""
    assert reply.round_state is not None
    state = reply.round_state["aggregator"]
    assert "_sum_as_float32" in state and "_sum" not in state, sorted(state)
    return state["_sum_as_float32"]


def _wrong_shape(reply: ClientReply) -> None:
    summed = _sent_sum(reply)
    summed[next(iter(summed))] = torch.zeros(3)


def _nan(reply: ClientReply) -> None:
    summed = _sent_sum(reply)
    name = next(iter(summed))
    summed[name] = torch.full_like(summed[name], float("nan"))


@pytest.mark.parametrize(("tamper", "says"), [(_wrong_shape, "has shape (3,)"), (_nan, "holds non-finite values")])
def test_a_refused_reply_drops_its_client_and_nothing_of_it_is_folded(tmp_path, capsys, tamper, says):
    settings = lambda: _settings(aggregator=FedAvg(weighting="uniform"), callbacks=[Scaffold()])  # noqa: E731
    torch.manual_seed(0)
    reference = BoringClassifier(lr=0.1, batch_norm=True)
    dropping = DroppingTransport(_sites(tmp_path / "reference-sites", settings), TAMPERED, TAMPER_ROUND)
    serve(fast_trainer(tmp_path / "reference", **settings()), reference, make_datamodule(NUM_CLIENTS), dropping)
    capsys.readouterr()

    torch.manual_seed(0)
    deployed = BoringClassifier(lr=0.1, batch_norm=True)
    transport = TamperingTransport(_sites(tmp_path / "sites", settings), tamper)
    trainer = fast_trainer(tmp_path / "server", **settings())
    serve(trainer, deployed, make_datamodule(NUM_CLIENTS), transport)
    err = capsys.readouterr().err
    refusals = [line for line in err.splitlines() if "refused" in line]
    assert len(refusals) == 1 and f"Client {TAMPERED}'s reply in round {TAMPER_ROUND} is refused:" in refusals[0]
    assert says in refusals[0]
    assert trainer.federation_state.history[TAMPER_ROUND]["clients/dropped"] == 1.0
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(deployed.state_dict()[name], value, rtol=0, atol=0, msg=name)
