"""Declared round state in one process: the reduction is the identity, and the declarations are checked.

The same reductions over 2 processes are compared with one process in ``test_ddp_rounds.py`` (``DeclaredState`` in
``helpers/distributed_run.py``).
"""

from __future__ import annotations

import pytest
import torch

from lightning_fed.parallel.reduction import CrossProcessState, reduce_across_ranks


class Accumulator(CrossProcessState):
    def start(self) -> None:
        self.add_round_state("params", {"w": torch.zeros(2, 3), "bn": {"mean": torch.zeros(3)}}, reduce="sum")
        self.add_round_state("count", 0)
        self.add_round_state("weight", 0.0)
        self.add_round_state("losses", {}, reduce="merge")
        self.add_round_state("last", (-1, {}), reduce="last")


def test_reduce_across_ranks_is_the_identity_in_one_process():
    tensor = torch.tensor([1.5, -2.0])
    values = {"sum": {"a": tensor}, "count": 3, "losses": {4: 0.5}, "last": (2, {"n": torch.tensor(7)})}
    reduced = reduce_across_ranks(values, {"sum": "sum", "count": "sum", "losses": "merge", "last": "last"})
    assert reduced == values and reduced["sum"]["a"] is tensor and tensor.tolist() == [1.5, -2.0]
    with pytest.raises(ValueError, match=r"`reductions\['count'\]` must be one of 'sum', 'merge', 'last'"):
        reduce_across_ranks(values, {"sum": "sum", "count": "mean", "losses": "merge", "last": "last"})


def test_declared_state_starts_at_its_default_and_reduces_to_itself_in_one_process():
    acc = Accumulator()
    acc.start()
    assert acc.count == 0 and acc.losses == {} and acc.last == (-1, {})
    acc.params["w"].add_(1.0)
    acc.params["bn"]["mean"].add_(2.0)
    acc.count += 2
    acc.weight += 0.25
    acc.losses[3] = 0.5
    acc.last = (1, {"n": torch.tensor(4)})
    params = acc.params["w"]
    acc.reduce_round_state()
    assert acc.params["w"] is params and torch.equal(params, torch.ones(2, 3))
    assert torch.equal(acc.params["bn"]["mean"], torch.full((3,), 2.0))
    assert acc.count == 2 and isinstance(acc.count, int) and acc.weight == 0.25
    assert acc.losses == {3: 0.5} and acc.last[0] == 1 and acc.last[1]["n"].item() == 4
    # Declaring again starts the next round afresh.
    acc.start()
    assert acc.count == 0 and not acc.params["w"].any()


def test_a_sum_that_changes_structure_or_holds_other_things_is_refused():
    acc = Accumulator()
    acc.start()
    acc.params["extra"] = torch.zeros(1)  # filled lazily: the ranks would pack different tensors
    with pytest.raises(ValueError, match="`params` changed structure"):
        acc.reduce_round_state()
    acc.start()
    acc.params["w"] = torch.zeros(3)
    with pytest.raises(ValueError, match="`params` changed structure"):
        acc.reduce_round_state()
    with pytest.raises(TypeError, match="`names/a` holds str"):
        acc.add_round_state("names", {"a": "x"})


def test_bad_declarations_name_the_argument():
    acc = Accumulator()
    with pytest.raises(ValueError, match="`reduce` must be one of 'sum', 'merge', 'last'; got 'mean'"):
        acc.add_round_state("x", 0.0, reduce="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`default` must be a mapping"):
        acc.add_round_state("x", [], reduce="merge")
    with pytest.raises(ValueError, match=r"`default` must be a \(position, value\) pair"):
        acc.add_round_state("x", None, reduce="last")


def test_a_round_state_is_reduced_once_until_it_is_declared_again(monkeypatch):
    # The engine reduces every callback's state before on_aggregate; a callback that still reduces there itself must
    # not reduce again: under ddp a sum reduced twice counts the other ranks' clients twice.
    import lightning_fed.parallel.reduction as reduction

    calls = []
    original = reduction.reduce_across_ranks

    def counting(values, reductions):
        calls.append(sorted(values))
        return original(values, reductions)

    monkeypatch.setattr(reduction, "reduce_across_ranks", counting)
    state = CrossProcessState()
    state.add_round_state("total", torch.zeros(2))
    state.reduce_round_state()
    state.reduce_round_state()
    assert calls == [["total"]]
    state.add_round_state("total", torch.zeros(2))  # the next round
    state.reduce_round_state()
    assert calls == [["total"], ["total"]]
