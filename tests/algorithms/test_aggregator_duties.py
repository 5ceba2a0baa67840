"""The duties `Aggregator` carries around its subclasses' `reset`, `update` and `compute`."""

from unittest import mock

import pytest
import torch
from typing_extensions import override

from lightning_fed import ClientStateStore, ClientUpdate, RoundContext
from lightning_fed.aggregation import Aggregator
from lightning_fed.aggregators import FedAvg, FedAvgM, NormBound
from lightning_fed.functional.state_dict import StateDict


class Mean(Aggregator):
    """An unweighted mean of the float entries, written with no word about integer entries or ranks."""

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        self.add_round_state("total", self.float64_zeros(global_params), reduce="sum")
        self.add_round_state("count", 0, reduce="sum")

    @override
    def update(self, update: ClientUpdate) -> None:
        for name, total in self.total.items():
            total.add_(update.params[name].double())
        self.count += 1

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        new_params = {name: tensor.clone() for name, tensor in global_params.items()}
        if self.count:
            new_params.update({name: (total / self.count).float() for name, total in self.total.items()})
        return new_params


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, generator=generator), "bn.num_batches_tracked": torch.tensor(100 + seed)}


def _round(aggregator: Aggregator, client_ids: list[int], arrivals: list[int]) -> StateDict:
    global_params = _state(0)
    sizes = dict.fromkeys(client_ids, 10)
    ctx = RoundContext(0, client_ids, global_params, sizes, ClientStateStore(), parameter_names=frozenset({"w"}))
    aggregator.reset(global_params, ctx)
    for cid in arrivals:
        aggregator.update(ClientUpdate(cid, 10, 1, _state(cid)))
    return aggregator.compute(global_params)


def test_a_plain_subclass_copies_the_integer_entries_of_the_rounds_last_accepted_client():
    # Client 7 comes last in the round but arrives first (held back updates arrive late): position wins.
    result = _round(Mean(), client_ids=[3, 5, 7, 9], arrivals=[7, 3, 5])
    assert result["bn.num_batches_tracked"].item() == 107
    assert result["bn.num_batches_tracked"].dtype == torch.int64
    torch.testing.assert_close(result["w"], (_state(3)["w"] + _state(5)["w"] + _state(7)["w"]) / 3)
    # With no accepted client the global model comes back, counters included.
    assert torch.equal(_round(Mean(), client_ids=[3, 5], arrivals=[])["bn.num_batches_tracked"], torch.tensor(100))


def test_entries_left_out_of_aggregation_are_not_copied():
    class NoCounters(Mean):
        @override
        def should_aggregate(self, name: str) -> bool:
            return name != "bn.num_batches_tracked"

    assert _round(NoCounters(), client_ids=[3, 5], arrivals=[3, 5])["bn.num_batches_tracked"].item() == 100


class Outer(FedAvg):
    """Forwards every method to FedAvg's through super(), as a rule layered on FedAvg does."""

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        super().reset(global_params, round_ctx)

    @override
    def update(self, update: ClientUpdate) -> None:
        super().update(update)

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        return super().compute(global_params)


@pytest.mark.parametrize("aggregator", [Outer(), FedAvgM(momentum=0.5)], ids=["super", "server-optimizer"])
def test_a_subclass_calling_super_carries_each_duty_once(aggregator):
    with (
        mock.patch.object(aggregator, "reduce_round_state", wraps=aggregator.reduce_round_state) as reduce,
        mock.patch.object(aggregator, "_copy_integer_entries", wraps=aggregator._copy_integer_entries) as copy,
        mock.patch.object(aggregator, "_start_integer_entries", wraps=aggregator._start_integer_entries) as start,
    ):
        result = _round(aggregator, client_ids=[1, 2], arrivals=[1, 2])
    assert (start.call_count, copy.call_count, reduce.call_count) == (1, 2, 1)
    assert result["bn.num_batches_tracked"].item() == 102


def test_a_forwarding_wrapper_and_its_inner_aggregator_each_reduce_once():
    inner = FedAvg()
    wrapper = NormBound(inner, max_norm=1e6)
    with (
        mock.patch.object(inner, "reduce_round_state", wraps=inner.reduce_round_state) as inner_reduce,
        mock.patch.object(wrapper, "reduce_round_state", wraps=wrapper.reduce_round_state) as wrapper_reduce,
    ):
        result = _round(wrapper, client_ids=[1, 2], arrivals=[1, 2])
    assert (inner_reduce.call_count, wrapper_reduce.call_count) == (1, 1)
    # The inner aggregator copied the counters; the wrapper declared no copy of its own.
    assert result["bn.num_batches_tracked"].item() == 102
    assert "_last_integer_entries" not in wrapper._declared_round_state()


def test_a_failed_compute_does_not_leave_the_duties_switched_off():
    class FailsOnce(Mean):
        failed = False

        @override
        def compute(self, global_params: StateDict) -> StateDict:
            if not self.failed:
                self.failed = True
                raise RuntimeError("boom")
            return super().compute(global_params)

    aggregator = FailsOnce()
    with pytest.raises(RuntimeError, match="boom"):
        _round(aggregator, client_ids=[1], arrivals=[1])
    with mock.patch.object(aggregator, "reduce_round_state", wraps=aggregator.reduce_round_state) as reduce:
        assert _round(aggregator, client_ids=[1], arrivals=[1])["bn.num_batches_tracked"].item() == 101
    assert reduce.call_count == 1


def test_abstract_methods_stay_abstract():
    class NoUpdate(Aggregator):
        @override
        def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
            pass

        @override
        def compute(self, global_params: StateDict) -> StateDict:
            return global_params

    with pytest.raises(TypeError, match="update"):
        NoUpdate()  # type: ignore[abstract]


@pytest.mark.parametrize("arrivals", [[5], [3, 5], []], ids=["one client (a site)", "two clients", "none accepted"])
def test_fedavgs_packed_round_state_unpacks_to_the_round_state_bit_for_bit(arrivals):
    aggregator = FedAvg()
    global_params = _state(0)
    ctx = RoundContext(0, [3, 5], global_params, {3: 10, 5: 30}, ClientStateStore(), parameter_names=frozenset({"w"}))
    aggregator.reset(global_params, ctx)
    for cid in arrivals:
        aggregator.update(ClientUpdate(cid, 10, 1, _state(cid)))
    held, packed = aggregator.round_state(), aggregator.pack_round_state()
    unpacked = FedAvg().unpack_round_state(packed)
    assert set(unpacked) == set(held) and unpacked["_accepted_weight"] == held["_accepted_weight"]
    (position, entries), (held_position, held_entries) = (
        unpacked["_last_integer_entries"],
        held["_last_integer_entries"],
    )
    assert position == held_position and entries.keys() == held_entries.keys()
    assert all(torch.equal(entries[name], held_entries[name]) for name in entries)
    for name, total in held["_sum"].items():
        assert unpacked["_sum"][name].dtype == torch.float64 and torch.equal(unpacked["_sum"][name], total), name
    # A site's one client travels as its float32 entries: half the sum's bytes.
    sent = packed.get("_sum_as_float32", packed.get("_sum"))
    assert all(t.dtype == (torch.float32 if len(arrivals) == 1 else torch.float64) for t in sent.values())
