import pytest
import torch

from lightning_fed import ClientStateStore, ClientUpdate, FedAvg, RoundContext
from lightning_fed.functional.state_dict import weighted_average


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(3, 2, generator=g),
        "bn.running_mean": torch.randn(2, generator=g),
        "bn.num_batches_tracked": torch.tensor(10 + seed),
    }


def _round(sizes: dict[int, int], global_params: dict[str, torch.Tensor]) -> RoundContext:
    return RoundContext(0, list(sizes), global_params, sizes, ClientStateStore(), parameter_names=frozenset({"w"}))


def _aggregate(agg: FedAvg, sizes: dict[int, int], states: dict[int, dict], accepted: list[int] | None = None) -> dict:
    global_params = _state(99)
    agg.reset(global_params, _round(sizes, global_params))
    for cid in accepted if accepted is not None else list(sizes):
        agg.update(ClientUpdate(cid, sizes[cid], 1, states[cid]))
    return agg.compute(global_params)


def test_fedavg_matches_weighted_reference_including_buffers():
    sizes = {0: 10, 3: 30, 5: 60}
    states = {cid: _state(cid) for cid in sizes}
    result = _aggregate(FedAvg(), sizes, states)
    expected = weighted_average([states[c] for c in sizes], [sizes[c] for c in sizes])
    torch.testing.assert_close(result["w"], expected["w"])
    torch.testing.assert_close(result["bn.running_mean"], expected["bn.running_mean"])
    # Integer buffers are copied from the last client, never averaged.
    assert result["bn.num_batches_tracked"].item() == states[5]["bn.num_batches_tracked"].item()
    assert result["bn.num_batches_tracked"].dtype == torch.int64


def test_uniform_weighting_is_plain_mean():
    sizes = {0: 1, 1: 99}
    states = {cid: _state(cid) for cid in sizes}
    result = _aggregate(FedAvg(weighting="uniform"), sizes, states)
    torch.testing.assert_close(result["w"], (states[0]["w"] + states[1]["w"]) / 2)


def test_server_lr_scales_the_step_from_the_global_model():
    sizes = {0: 5, 1: 15}
    states = {cid: _state(cid) for cid in sizes}
    global_w = _state(99)["w"]
    plain = _aggregate(FedAvg(), sizes, states)["w"]
    damped = _aggregate(FedAvg(server_lr=0.5), sizes, states)
    torch.testing.assert_close(damped["w"], global_w + 0.5 * (plain - global_w))
    # Buffers are not parameters: they take the plain weighted mean whatever the server learning rate.
    torch.testing.assert_close(damped["bn.running_mean"], _aggregate(FedAvg(), sizes, states)["bn.running_mean"])


def test_rejected_clients_are_renormalised_out():
    sizes = {0: 10, 1: 30, 2: 60}
    states = {cid: _state(cid) for cid in sizes}
    result = _aggregate(FedAvg(), sizes, states, accepted=[0, 2])
    expected = weighted_average([states[0], states[2]], [10, 60])
    torch.testing.assert_close(result["w"], expected["w"])


def test_no_accepted_update_keeps_the_global_model():
    sizes = {0: 10}
    result = _aggregate(FedAvg(), sizes, {0: _state(0)}, accepted=[])
    for name, tensor in _state(99).items():
        assert torch.equal(result[name], tensor)


def test_single_client_result_is_bit_identical_to_its_model():
    states = {7: _state(7)}
    result = _aggregate(FedAvg(), {7: 13}, states)
    for name, tensor in states[7].items():
        assert torch.equal(result[name], tensor), name


def test_should_aggregate_keeps_excluded_entries_global():
    class NoBatchNorm(FedAvg):
        def should_aggregate(self, name: str) -> bool:
            return not name.startswith("bn.")

    sizes = {0: 10, 1: 10}
    result = _aggregate(NoBatchNorm(), sizes, {cid: _state(cid) for cid in sizes})
    assert torch.equal(result["bn.running_mean"], _state(99)["bn.running_mean"])
    assert not torch.equal(result["w"], _state(99)["w"])


@pytest.mark.parametrize(("kwargs", "match"), [({"weighting": "size"}, "weighting"), ({"server_lr": 0.0}, "server_lr")])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAvg(**kwargs)
