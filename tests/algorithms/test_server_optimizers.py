"""Server optimizers (FedAvgM, FedAdagrad, FedAdam, FedYogi) against Reddi et al. 2021, Algorithm 2, written out."""

from __future__ import annotations

import pytest
import torch

from lightning_fed import ClientStateStore, ClientUpdate, RoundContext
from lightning_fed.aggregators import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi

SIZES = {0: 10, 1: 30, 2: 60}
PARAMS = ("w", "b")


def _global() -> dict[str, torch.Tensor]:
    return {
        "w": torch.tensor([[0.5, -1.0], [2.0, 0.25]]),
        "b": torch.tensor([0.1, -0.2]),
        "bn.running_var": torch.tensor([0.04, 1.0]),
        "bn.num_batches_tracked": torch.tensor(7),
    }


def _clients(round_idx: int) -> dict[int, dict[str, torch.Tensor]]:
    """Three fixed client models per round, different every round, with a running_var each."""
    g = torch.Generator().manual_seed(100 + round_idx)
    return {
        cid: {
            "w": torch.randn(2, 2, generator=g) * 0.3,
            "b": torch.randn(2, generator=g) * 0.3,
            "bn.running_var": torch.rand(2, generator=g) + 0.01,
            "bn.num_batches_tracked": torch.tensor(10 * round_idx + cid),
        }
        for cid in SIZES
    }


def _round(agg, global_params, clients, accepted=None, parameter_names=frozenset(PARAMS)):
    ctx = RoundContext(0, list(SIZES), global_params, SIZES, ClientStateStore(), parameter_names=parameter_names)
    agg.reset(global_params, ctx)
    for cid in accepted if accepted is not None else SIZES:
        agg.update(ClientUpdate(cid, SIZES[cid], 1, clients[cid]))
    return agg.compute(global_params)


def _mean(clients, name, accepted=None):
    ids = accepted if accepted is not None else list(SIZES)
    total = sum(SIZES[c] for c in ids)
    return sum(SIZES[c] / total * clients[c][name].double() for c in ids)


def reference(rule: str, rounds: int, eta: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
    """Algorithm 2 of Reddi et al. (ICLR 2021, arXiv:2003.00295), line by line, in float64, for ``rounds`` rounds.

    Buffers are the plain weighted average; integer buffers are the last client's.
    """
    x = {n: t.clone() for n, t in _global().items()}
    m = {n: torch.zeros_like(x[n], dtype=torch.float64) for n in PARAMS}
    v = {n: torch.full_like(x[n], tau**2, dtype=torch.float64) for n in PARAMS}  # v_{-1} = tau^2
    for t in range(rounds):
        clients = _clients(t)
        for n in PARAMS:
            delta = _mean(clients, n) - x[n].double()  # line 10, with FedAvg's weights
            m[n] = beta1 * m[n] + (1 - beta1) * delta  # line 11
            if rule == "adagrad":
                v[n] = v[n] + delta**2  # line 12
            elif rule == "yogi":
                v[n] = v[n] - (1 - beta2) * delta**2 * torch.sign(v[n] - delta**2)  # line 13
            else:
                v[n] = beta2 * v[n] + (1 - beta2) * delta**2  # line 14
            x[n] = (x[n].double() + eta * m[n] / (torch.sqrt(v[n]) + tau)).float()  # line 15
        x["bn.running_var"] = _mean(clients, "bn.running_var").float()
        x["bn.num_batches_tracked"] = clients[2]["bn.num_batches_tracked"]
    return x, m, v


def momentum_reference(rounds: int, eta: float, beta: float, nesterov: bool = False):
    """Hsu et al. 2019 (arXiv:1909.06335): u = beta u + Delta, w += eta u (Nesterov: w += eta (Delta + beta u))."""
    x = {n: t.clone() for n, t in _global().items()}
    u = {n: torch.zeros_like(x[n], dtype=torch.float64) for n in PARAMS}
    for t in range(rounds):
        clients = _clients(t)
        for n in PARAMS:
            delta = _mean(clients, n) - x[n].double()
            u[n] = beta * u[n] + delta
            x[n] = (x[n].double() + eta * ((delta + beta * u[n]) if nesterov else u[n])).float()
        x["bn.running_var"] = _mean(clients, "bn.running_var").float()
        x["bn.num_batches_tracked"] = clients[2]["bn.num_batches_tracked"]
    return x, u


def _run(agg, rounds: int) -> dict[str, torch.Tensor]:
    x = _global()
    for t in range(rounds):
        x = _round(agg, x, _clients(t))
    return x


@pytest.mark.parametrize(
    ("aggregator", "rule"),
    [
        (FedAdam(server_lr=0.05), "adam"),
        (FedYogi(server_lr=0.05), "yogi"),
        (FedAdagrad(server_lr=0.05), "adagrad"),
        (FedAdam(server_lr=0.3, beta1=0.5, beta2=0.9, tau=0.1), "adam"),
        (FedYogi(server_lr=0.3, beta1=0.5, beta2=0.9, tau=0.1), "yogi"),
    ],
    ids=["adam", "yogi", "adagrad", "adam-other-hparams", "yogi-other-hparams"],
)
def test_adaptive_optimizers_match_algorithm_2_over_three_rounds(aggregator, rule):
    args = dict(eta=aggregator.server_lr, beta1=aggregator.beta1, tau=aggregator.tau)
    if rule != "adagrad":
        args["beta2"] = aggregator.beta2
    expected, m, v = reference(rule, 3, **args)
    result = _run(aggregator, 3)
    for name, tensor in expected.items():
        torch.testing.assert_close(result[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert result["bn.num_batches_tracked"].dtype == torch.int64
    state = aggregator.state_dict()
    assert state["num_steps"] == 3 and set(state["m"]) == set(PARAMS)
    for name in PARAMS:
        torch.testing.assert_close(state["m"][name], m[name], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(state["v"][name], v[name], rtol=1e-9, atol=1e-12)


def test_the_three_rules_differ_so_the_comparison_above_can_fail():
    finals = [reference(rule, 3, eta=0.05)[0]["w"] for rule in ("adam", "yogi", "adagrad")]
    for i in range(3):
        for j in range(i + 1, 3):
            assert (finals[i] - finals[j]).abs().max() > 1e-4


@pytest.mark.parametrize("nesterov", [False, True])
def test_fedavgm_matches_server_momentum_over_three_rounds(nesterov):
    aggregator = FedAvgM(server_lr=0.7, momentum=0.8, nesterov=nesterov)
    expected, u = momentum_reference(3, eta=0.7, beta=0.8, nesterov=nesterov)
    result = _run(aggregator, 3)
    for name, tensor in expected.items():
        torch.testing.assert_close(result[name], tensor, rtol=0, atol=1e-6, msg=name)
    for name in PARAMS:
        torch.testing.assert_close(aggregator.state_dict()["momentum"][name], u[name], rtol=1e-9, atol=1e-12)


def test_fedavgm_without_momentum_and_unit_rate_is_fedavg():
    x_avgm, x_avg = _global(), _global()
    avgm, avg = FedAvgM(server_lr=1.0, momentum=0.0), FedAvg()
    for t in range(3):
        x_avgm, x_avg = _round(avgm, x_avgm, _clients(t)), _round(avg, x_avg, _clients(t))
        for name, tensor in x_avg.items():
            torch.testing.assert_close(x_avgm[name], tensor, rtol=0, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    "aggregator",
    [FedAvg(server_lr=2.0), FedAvgM(server_lr=2.0), FedAdam(server_lr=1.0), FedYogi(server_lr=1.0)],
    ids=repr,
)
def test_buffers_take_the_weighted_mean_and_are_never_extrapolated(aggregator):
    global_params = _global()
    global_params["bn.running_var"] = torch.tensor([4.0, 1.0])
    # Every client's variance shrank: extrapolating past their mean (2 * mean - old with eta = 2) goes negative.
    clients = {cid: dict(state, **{"bn.running_var": torch.tensor([0.5, 0.1])}) for cid, state in _clients(0).items()}
    result = _round(aggregator, global_params, clients)
    torch.testing.assert_close(result["bn.running_var"], torch.tensor([0.5, 0.1]))
    assert not torch.allclose(result["w"], _mean(clients, "w").float())  # the parameters did take the server step


def test_fedavg_server_lr_steps_the_parameters_only():
    global_params, clients = _global(), _clients(0)
    result = _round(FedAvg(server_lr=0.5), global_params, clients)
    for name in PARAMS:
        old = global_params[name].double()
        torch.testing.assert_close(result[name], (old + 0.5 * (_mean(clients, name) - old)).float())
    torch.testing.assert_close(result["bn.running_var"], _mean(clients, "bn.running_var").float())


@pytest.mark.parametrize("aggregator", [FedAdam(), FedAvgM(), FedAvg(server_lr=2.0)], ids=repr)
def test_a_round_built_without_parameter_names_is_refused_by_a_server_step(aggregator):
    with pytest.raises(ValueError, match="parameter_names"):
        _round(aggregator, _global(), _clients(0), parameter_names=None)


def test_plain_fedavg_needs_no_parameter_names():
    result = _round(FedAvg(), _global(), _clients(0), parameter_names=None)
    torch.testing.assert_close(result["w"], _mean(_clients(0), "w").float())


def test_rejected_clients_drop_out_and_a_round_without_clients_changes_nothing():
    aggregator = FedAdam(server_lr=0.1)
    x = _round(aggregator, _global(), _clients(0))
    # Client 1 rejected: the pseudo-gradient is the mean of clients 0 and 2 alone.
    expected_m = {
        n: 0.9 * aggregator.buffers["m"][n] + 0.1 * (_mean(_clients(1), n, [0, 2]) - x[n].double()) for n in PARAMS
    }
    x = _round(aggregator, x, _clients(1), accepted=[0, 2])
    for name in PARAMS:
        torch.testing.assert_close(aggregator.buffers["m"][name], expected_m[name])
    before = {kind: {n: t.clone() for n, t in values.items()} for kind, values in aggregator.buffers.items()}
    unchanged = _round(aggregator, x, _clients(2), accepted=[])
    for name, tensor in x.items():
        assert torch.equal(unchanged[name], tensor), name
    assert aggregator.num_steps == 2
    for kind, values in before.items():
        for name, tensor in values.items():
            assert torch.equal(aggregator.buffers[kind][name], tensor), f"{kind}/{name}"


@pytest.mark.parametrize(
    ("cls", "kwargs", "argument"),
    [
        (FedAdam, {"server_lr": 0.0}, "server_lr"),
        (FedAdam, {"beta1": 1.0}, "beta1"),
        (FedYogi, {"beta2": -0.1}, "beta2"),
        (FedYogi, {"tau": 0.0}, "tau"),
        (FedAdagrad, {"tau": float("nan")}, "tau"),
        (FedAvgM, {"momentum": 1.0}, "momentum"),
        (FedAvgM, {"server_lr": -1.0}, "server_lr"),
        (FedAvgM, {"nesterov": 1}, "nesterov"),
        (FedAdam, {"weighting": "size"}, "weighting"),
    ],
)
def test_bad_arguments_name_the_argument(cls, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        cls(**kwargs)
