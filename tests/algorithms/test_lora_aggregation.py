"""LoRAFedAvg's three modes and LoRARanks, against a dense reference (each client's B·A built and averaged densely)
and against FedAvg on every entry that is no LoRA factor."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.boring import fast_trainer, make_datamodule
from helpers.lora import LoRAClassifier

from lightning_fed import ClientStateStore, ClientUpdate, FedCallback, RoundContext
from lightning_fed.aggregators import FedAvg, LoRAFedAvg
from lightning_fed.aggregators.lora import (
    GAP_KEY,
    GAP_MAX_KEY,
    REFACTORISATION_ERROR_KEY,
    REFACTORISATION_ERROR_MAX_KEY,
)
from lightning_fed.callbacks import LoRARanks
from lightning_fed.checks import InvalidArgumentError

SIZES = {0: 30, 1: 50, 2: 20}
LAYERS = ("layer1", "layer2")


def _keys(style: str, layer: str) -> tuple[str, str]:
    if style == "peft":
        return f"{layer}.lora_B.default.weight", f"{layer}.lora_A.default.weight"
    return f"{layer}.lora_B", f"{layer}.lora_A"


def _global(style: str = "peft", rank: int = 3) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = dict(LoRAClassifier(rank=rank, style=style).state_dict())
    # A BatchNorm's buffers: a float statistic (averaged) and an integer counter (the last client's).
    state["norm.running_var"] = torch.ones(4)
    state["norm.num_batches_tracked"] = torch.tensor(0)
    return state


def _client(global_params, client_id: int, style: str = "peft", shared_a: bool = False):
    """The global model moved on every trainable entry and buffer, as local training would."""
    generator = torch.Generator().manual_seed(100 + client_id)
    frozen_a = {_keys(style, layer)[1] for layer in LAYERS} if shared_a else set()
    params = {}
    for name, tensor in global_params.items():
        moves = tensor.is_floating_point() and ".base." not in name and name not in frozen_a
        noise = torch.randn(tensor.shape, generator=generator) if moves else None
        params[name] = tensor + 0.3 * noise if noise is not None else tensor.clone()
    params["norm.num_batches_tracked"] = torch.tensor(10 + client_id)
    return ClientUpdate(client_id, SIZES[client_id], 1, params)


def _run(aggregator, global_params, updates, parameter_names=None):
    ctx = RoundContext(0, list(SIZES), global_params, dict(SIZES), ClientStateStore(), parameter_names=parameter_names)
    aggregator.reset(global_params, ctx)
    for update in updates:
        aggregator.update(update)
    return aggregator.compute(global_params)


def _dense_mean_product(updates, b_key, a_key):
    total = sum(SIZES[u.client_id] for u in updates)
    return sum(SIZES[u.client_id] / total * (u.params[b_key].double() @ u.params[a_key].double()) for u in updates)


def _fedit_product(result, b_key, a_key):
    return result[b_key].double() @ result[a_key].double()


def _relative(x, reference):
    return float(torch.linalg.matrix_norm(x) / torch.linalg.matrix_norm(reference))


@pytest.mark.parametrize("style", ["peft", "litgpt"])
def test_fedit_is_fedavg_bit_for_bit_and_reports_the_dense_gap(style):
    global_params = _global(style)
    updates = [_client(global_params, cid, style) for cid in SIZES]
    aggregator = LoRAFedAvg()
    result = _run(aggregator, global_params, updates)
    reference = _run(FedAvg(), global_params, updates)
    assert result.keys() == reference.keys()
    for name in reference:
        assert torch.equal(result[name], reference[name]), name
    gaps = []
    for layer in LAYERS:
        b_key, a_key = _keys(style, layer)
        dense = _dense_mean_product(updates, b_key, a_key)
        gaps.append(_relative(dense - _fedit_product(result, b_key, a_key), dense))
    assert min(gaps) > 0.05  # the per-matrix average is not the mean product
    metrics = aggregator.round_metrics()
    # The metric uses the float64 means, the dense check the float32 aggregate: they differ by float32 rounding.
    assert metrics[GAP_KEY] == pytest.approx(sum(gaps) / len(gaps), rel=1e-5)
    assert metrics[GAP_MAX_KEY] == pytest.approx(max(gaps), rel=1e-5)


def test_ffa_aggregate_equals_the_dense_average_exactly():
    global_params = _global()
    updates = [_client(global_params, cid, shared_a=True) for cid in SIZES]
    result = _run(LoRAFedAvg(mode="ffa"), global_params, updates)
    for layer in LAYERS:
        b_key, a_key = _keys("peft", layer)
        assert torch.equal(result[a_key], global_params[a_key])
        dense = _dense_mean_product(updates, b_key, a_key)
        torch.testing.assert_close(_fedit_product(result, b_key, a_key), dense, rtol=1e-6, atol=1e-7)
        # In float64 before the float32 cast the identity is exact up to the float64 sums' rounding.
        total = sum(SIZES.values())
        mean_b = sum(SIZES[u.client_id] / total * u.params[b_key].double() for u in updates)
        torch.testing.assert_close(mean_b @ global_params[a_key].double(), dense, rtol=0, atol=1e-13)


def test_ffa_refuses_a_client_whose_a_changed_in_one_line():
    global_params = _global()
    updates = [_client(global_params, 0, shared_a=True), _client(global_params, 1, shared_a=False)]
    with pytest.raises(ValueError, match=r"client 1 changed `layer1.lora_A.default.weight`") as error:
        _run(LoRAFedAvg(mode="ffa"), global_params, updates)
    assert "\n" not in str(error.value) and "requires_grad_(False)" in str(error.value)


def test_exact_mode_is_the_dense_average_when_the_mean_product_has_rank_at_most_r():
    global_params = _global()
    # The clients share A (their B differ): the mean product has rank <= r, so the re-factorisation loses nothing,
    # though A is trained (mode "exact" does not need A frozen).
    updates = [_client(global_params, cid, shared_a=True) for cid in SIZES]
    aggregator = LoRAFedAvg(mode="exact")
    result = _run(aggregator, global_params, updates)
    for layer in LAYERS:
        b_key, a_key = _keys("peft", layer)
        dense = _dense_mean_product(updates, b_key, a_key)
        torch.testing.assert_close(_fedit_product(result, b_key, a_key), dense, rtol=1e-5, atol=1e-6)
        assert result[b_key].shape == global_params[b_key].shape and result[b_key].dtype == torch.float32
    assert aggregator.round_metrics()[REFACTORISATION_ERROR_MAX_KEY] < 1e-12
    assert aggregator.round_metrics()[GAP_MAX_KEY] < 1e-12


def test_exact_mode_reports_the_measured_residual_of_the_rank_r_refactorisation():
    global_params = _global(rank=2)
    updates = [_client(global_params, cid) for cid in SIZES]
    aggregator = LoRAFedAvg(mode="exact")
    result = _run(aggregator, global_params, updates)
    errors, gaps = [], []
    for layer in LAYERS:
        b_key, a_key = _keys("peft", layer)
        dense = _dense_mean_product(updates, b_key, a_key)
        residual = dense - _fedit_product(result, b_key, a_key)
        errors.append(_relative(residual, dense))
        # Eckart–Young: the residual is the tail of the singular values, and beats the per-matrix average's.
        tail = torch.linalg.svdvals(dense)[2:].square().sum().sqrt()
        assert errors[-1] == pytest.approx(float(tail / torch.linalg.matrix_norm(dense)), rel=1e-4)
        mean_b = sum(SIZES[u.client_id] / 100 * u.params[b_key].double() for u in updates)
        mean_a = sum(SIZES[u.client_id] / 100 * u.params[a_key].double() for u in updates)
        gaps.append(_relative(dense - mean_b @ mean_a, dense))
        assert errors[-1] < gaps[-1]
    metrics = aggregator.round_metrics()
    assert min(errors) > 0.01
    assert metrics[REFACTORISATION_ERROR_KEY] == pytest.approx(sum(errors) / 2, rel=1e-4)
    assert metrics[REFACTORISATION_ERROR_MAX_KEY] == pytest.approx(max(errors), rel=1e-4)
    assert metrics[GAP_KEY] == pytest.approx(sum(gaps) / 2, rel=1e-10)


@pytest.mark.parametrize("mode", ["fedit", "ffa", "exact"])
def test_every_other_entry_is_fedavgs_bit_for_bit(mode):
    global_params = _global()
    updates = [_client(global_params, cid, shared_a=mode == "ffa") for cid in SIZES]
    names = frozenset(n for n, t in global_params.items() if t.is_floating_point() and "norm" not in n)
    for server_lr in (1.0, 0.5):
        result = _run(LoRAFedAvg(mode=mode, server_lr=server_lr), global_params, updates, names)
        reference = _run(FedAvg(server_lr=server_lr), global_params, updates, names)
        others = [name for name in reference if "lora_" not in name]
        assert "head.weight" in others and "norm.running_var" in others and "layer1.base.weight" in others
        for name in others:
            assert torch.equal(result[name], reference[name]), (mode, name)
        assert result["norm.num_batches_tracked"].item() == 12  # the round's last client's counter


def test_exact_server_lr_steps_the_product_from_the_global_one():
    global_params = _global()
    # Shared A and a global pair with that A: every product has rank <= r, so the step is exact.
    updates = [_client(global_params, cid, shared_a=True) for cid in SIZES]
    names = frozenset(n for n, t in global_params.items() if t.is_floating_point() and "norm" not in n)
    global_params = dict(global_params)
    for layer in LAYERS:
        b_key, _ = _keys("peft", layer)
        global_params[b_key] = torch.randn(global_params[b_key].shape)
    result = _run(LoRAFedAvg(mode="exact", server_lr=0.5), global_params, updates, names)
    for layer in LAYERS:
        b_key, a_key = _keys("peft", layer)
        target = 0.5 * (global_params[b_key].double() @ global_params[a_key].double())
        target = target + 0.5 * _dense_mean_product(updates, b_key, a_key)
        torch.testing.assert_close(_fedit_product(result, b_key, a_key), target, rtol=1e-5, atol=1e-6)


def test_b_without_its_a_in_the_state_is_averaged_as_fedavg_with_no_metrics():
    # Where A is frozen out of the federated state (the base holds it), the per-matrix average of B is exact.
    global_params = {k: v for k, v in _global().items() if "lora_A" not in k}
    updates = [_client(global_params, cid) for cid in SIZES]
    for mode in ("fedit", "ffa", "exact"):
        aggregator = LoRAFedAvg(mode=mode)
        result = _run(aggregator, global_params, updates)
        reference = _run(FedAvg(), global_params, updates)
        assert all(torch.equal(result[name], reference[name]) for name in reference)
        assert aggregator.round_metrics() == {}
        assert [p.b_key for p in aggregator.pairs] == [_keys("peft", layer)[0] for layer in LAYERS]


@pytest.mark.parametrize("mode", ["fedit", "ffa", "exact"])
def test_a_round_split_over_two_shares_gives_the_one_process_result(mode):
    # A deployment's server absorbs each site's unreduced round state (sums added, the factors merged).
    global_params = _global()
    updates = [_client(global_params, cid, shared_a=mode == "ffa") for cid in SIZES]
    one_process = LoRAFedAvg(mode=mode)
    expected = _run(one_process, global_params, updates)
    server, sites = LoRAFedAvg(mode=mode), [LoRAFedAvg(mode=mode), LoRAFedAvg(mode=mode)]
    ctx = RoundContext(0, list(SIZES), global_params, dict(SIZES), ClientStateStore())
    for aggregator in (server, *sites):
        aggregator.reset(global_params, ctx)
    sites[0].update(updates[0])
    sites[0].update(updates[2])
    sites[1].update(updates[1])
    for site in sites:
        server.absorb_round_state(site.round_state())
    result = server.compute(global_params)
    for name, tensor in expected.items():
        torch.testing.assert_close(result[name], tensor, rtol=1e-6, atol=1e-7)
    assert server.round_metrics() == pytest.approx(one_process.round_metrics(), rel=1e-9)


def test_declared_round_state_says_which_modes_are_all_sums():
    assert LoRAFedAvg(mode="ffa").round_state_is_sum
    assert LoRAFedAvg(mode="fedit", report_gap=False).round_state_is_sum
    assert not LoRAFedAvg(mode="fedit").round_state_is_sum
    assert not LoRAFedAvg(mode="exact").round_state_is_sum
    # The class declaration is the default mode's.
    assert not LoRAFedAvg.round_state_is_sum


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(InvalidArgumentError, match="`mode` must be"):
        LoRAFedAvg(mode="flora")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="`lora_pairs` must be"):
        LoRAFedAvg(lora_pairs=[("lora.A", "lora_B")])
    with pytest.raises(InvalidArgumentError, match="`lora_pairs` must be"):
        LoRAFedAvg(lora_pairs=[])
    with pytest.raises(InvalidArgumentError, match="`ranks` must be"):
        LoRARanks(ranks=[0, 2])
    with pytest.raises(InvalidArgumentError, match="`ranks` must be"):
        LoRARanks(ranks={"a": 2})  # type: ignore[dict-item]


class _Updates(FedCallback):
    def __init__(self) -> None:
        self.updates: dict[int, list[ClientUpdate]] = {}

    def on_client_end(self, trainer, pl_module, client_ctx, update) -> None:
        params = {name: tensor.detach().clone() for name, tensor in update.params.items()}
        self.updates.setdefault(client_ctx.round_idx, []).append(dataclasses.replace(update, params=params))


def _fit(tmp_path, aggregator, callbacks=(), num_rounds=1, client_parallelism=1, **module_kwargs):
    torch.manual_seed(0)
    module = LoRAClassifier(**module_kwargs)
    trainer = fast_trainer(
        tmp_path,
        num_rounds=num_rounds,
        clients_per_round=3,
        aggregator=aggregator,
        callbacks=list(callbacks),
        seed=0,
        client_parallelism=client_parallelism,
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=3, num_samples=120))
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def test_a_fitted_round_leaves_the_head_as_fedavg_does_and_fedit_the_whole_model(tmp_path):
    fedavg = _fit(tmp_path / "fedavg", FedAvg(), num_rounds=2)
    fedit = _fit(tmp_path / "fedit", LoRAFedAvg(), num_rounds=2)
    assert all(torch.equal(fedit[name], fedavg[name]) for name in fedavg)
    recorder = _Updates()
    exact = _fit(tmp_path / "exact", LoRAFedAvg(mode="exact"), [recorder])
    one_round = _fit(tmp_path / "fedavg1", FedAvg())
    for name in ("head.weight", "head.bias", "layer1.base.weight"):
        assert torch.equal(exact[name], one_round[name]), name
    # The adapters differ from the per-matrix average: they hold the (re-factorised) mean product.
    b_key, a_key = _keys("peft", "layer2")
    assert not torch.equal(exact[b_key], one_round[b_key])
    updates = recorder.updates[0]
    total = sum(u.num_samples for u in updates)
    dense = sum(u.num_samples / total * (u.params[b_key].double() @ u.params[a_key].double()) for u in updates)
    assert _relative(dense - _fedit_product(exact, b_key, a_key), dense) < _relative(
        dense - _fedit_product(one_round, b_key, a_key), dense
    )


def test_ffa_fit_with_a_frozen_in_the_module_keeps_a_and_refuses_a_trained_one(tmp_path):
    torch.manual_seed(0)
    initial_a = LoRAClassifier(train_a=False).state_dict()["layer1.lora_A.default.weight"].clone()
    trained = _fit(tmp_path / "frozen", LoRAFedAvg(mode="ffa"), num_rounds=2, train_a=False)
    assert torch.equal(trained["layer1.lora_A.default.weight"], initial_a)
    assert trained["layer1.lora_B.default.weight"].abs().sum() > 0
    with pytest.raises(ValueError, match="LoRAFedAvg\\(mode='ffa'\\) needs every lora_A frozen"):
        _fit(tmp_path / "trained", LoRAFedAvg(mode="ffa"), train_a=True)


@pytest.mark.parametrize("mode", ["fedit", "exact"])
def test_clients_of_lower_rank_train_only_their_components(tmp_path, mode):
    recorder = _Updates()
    ranks = {0: 1, 1: 2}  # client 2 trains at the module's rank 4
    result = _fit(
        tmp_path, LoRAFedAvg(mode=mode), [LoRARanks(ranks), recorder], num_rounds=2, rank=4, optimizer="adamw"
    )
    for updates in recorder.updates.values():
        for update in updates:
            rank = ranks.get(update.client_id, 4)
            for layer in LAYERS:
                b_key, a_key = _keys("peft", layer)
                b, a = update.params[b_key], update.params[a_key]
                assert not b[:, rank:].any() and not a[rank:].any(), (update.client_id, layer)
                assert b[:, :rank].abs().sum() > 0 and a[:rank].abs().sum() > 0
    if mode == "fedit":
        # The zero-padding average: component j averages every client, those of rank <= j counting as zero.
        updates = recorder.updates[1]
        total = sum(u.num_samples for u in updates)
        b_key, _ = _keys("peft", "layer1")
        expected = sum(u.num_samples / total * u.params[b_key].double() for u in updates)
        torch.testing.assert_close(result[b_key], expected.float(), rtol=1e-6, atol=1e-7)


def test_clients_of_lower_rank_train_side_by_side_as_one_at_a_time(tmp_path):
    sequential = _fit(tmp_path / "one", LoRAFedAvg(mode="exact"), [LoRARanks({0: 1, 1: 2})], num_rounds=2)
    batched = _fit(
        tmp_path / "three", LoRAFedAvg(mode="exact"), [LoRARanks({0: 1, 1: 2})], num_rounds=2, client_parallelism=3
    )
    for name, tensor in sequential.items():
        torch.testing.assert_close(batched[name], tensor, rtol=1e-5, atol=1e-5)


def test_lora_ranks_refuses_a_rank_above_the_modules(tmp_path):
    with pytest.raises(InvalidArgumentError, match="at most the module's LoRA rank 2"):
        _fit(tmp_path, LoRAFedAvg(), [LoRARanks([3])], rank=2)


def test_lora_ranks_refuses_ffa_whose_a_it_cannot_zero(tmp_path):
    with pytest.raises(InvalidArgumentError, match="`trainer.aggregator.init_args.mode` must be 'fedit' or 'exact'"):
        _fit(tmp_path, LoRAFedAvg(mode="ffa"), [LoRARanks([1])], train_a=False)
