import warnings

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule
from helpers.resume import assert_resume_bit_identical

from lightning_fed import ClientStateStore, FedCallback
from lightning_fed.aggregators import (
    Bulyan,
    FedAvg,
    FedMedian,
    Krum,
    MultiKrum,
    NormBound,
    RobustAggregator,
    TrimmedMean,
)
from lightning_fed.aggregators.normbound import CLIPPED_KEY
from lightning_fed.aggregators.robust import SKIPPED_KEY
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.functional.robust import bulyan


def _global() -> dict[str, torch.Tensor]:
    return {
        "w": torch.tensor([[1.0, 2.0], [0.5, -1.0]]),
        "bn.mean": torch.tensor([0.0, 1.0]),
        "bn.count": torch.tensor(4, dtype=torch.int64),
    }


def _clients(n: int, seed: int = 0, spread: float = 0.1) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    result = []
    for k in range(n):
        result.append(
            {
                name: (t + spread * torch.randn(t.shape, generator=generator)) if t.is_floating_point() else t + k
                for name, t in _global().items()
            }
        )
    return result


def _aggregate(agg, models, accepted=None, sampled=None):
    """One round of ``agg`` with ``sampled`` clients sampled (default: one per model) and ``accepted`` of them."""
    global_params = _global()
    sampled = sampled if sampled is not None else len(models)
    round_ctx = RoundContext(
        0, list(range(sampled)), global_params, dict.fromkeys(range(sampled), 10), ClientStateStore()
    )
    agg.reset(global_params, round_ctx)
    for cid in accepted if accepted is not None else range(len(models)):
        agg.update(ClientUpdate(cid, 10 * (cid + 1), 1, models[cid]))
    return agg.compute(global_params)


def _flat(model: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([model["w"].reshape(-1), model["bn.mean"]])


def test_fed_median_is_torch_median_of_every_float_entry_and_copies_the_last_integer_buffer():
    models = _clients(5)
    result = _aggregate(FedMedian(), models)
    for name in ("w", "bn.mean"):
        assert torch.equal(result[name], torch.stack([m[name] for m in models]).median(dim=0).values)
    assert result["bn.count"].item() == models[-1]["bn.count"].item()


def test_rules_are_unweighted_whatever_the_sample_counts():
    # _aggregate reports client k with 10 (k + 1) samples: a weighted rule would differ from the plain mean.
    models = _clients(4)
    result = _aggregate(TrimmedMean(beta=0.0), models)
    for name in ("w", "bn.mean"):
        expected = torch.stack([m[name].double() for m in models]).mean(0).float()
        torch.testing.assert_close(result[name], expected, rtol=0, atol=1e-7)


def test_trimmed_mean_trims_beta_of_the_sampled_clients_at_each_end():
    models = _clients(10, seed=3)
    agg = TrimmedMean(beta=0.3)
    assert agg.num_trimmed(10) == 3  # 0.3 * 10 is 2.9999999999999996 in floating point
    result = _aggregate(agg, models)
    values = torch.stack([_flat(m).double() for m in models]).sort(dim=0).values
    torch.testing.assert_close(_flat(result), values[3:7].mean(0).float(), rtol=0, atol=1e-7)
    # k stays 3 when a client is rejected: 9 accepted updates, the same trim at each end.
    kept = [k for k in range(10) if k != 4]
    result = _aggregate(TrimmedMean(beta=0.3), models, accepted=kept, sampled=10)
    values = torch.stack([_flat(models[k]).double() for k in kept]).sort(dim=0).values
    torch.testing.assert_close(_flat(result), values[3:6].mean(0).float(), rtol=0, atol=1e-7)


def test_krum_returns_exactly_the_chosen_clients_model():
    models = _clients(6, seed=1)
    models[2] = {name: t * 50 if t.is_floating_point() else t for name, t in models[2].items()}
    agg = Krum(num_byzantine=1)
    result = _aggregate(agg, models)
    assert len(agg.selected_clients) == 1 and agg.selected_clients[0] != 2
    chosen = models[agg.selected_clients[0]]
    for name in ("w", "bn.mean"):
        assert torch.equal(result[name], chosen[name])


def test_multi_krum_averages_the_selected_clients_and_defaults_to_n_minus_f():
    models = _clients(7, seed=2)
    agg = MultiKrum(num_byzantine=2, num_selected=3)
    result = _aggregate(agg, models)
    expected = torch.stack([_flat(models[k]).double() for k in agg.selected_clients]).mean(0)
    torch.testing.assert_close(_flat(result), expected.float(), rtol=0, atol=1e-7)
    default = MultiKrum(num_byzantine=2)
    _aggregate(default, models)
    assert len(default.selected_clients) == 5 and default.selected_clients[:3] == agg.selected_clients


def test_bulyan_aggregator_applies_bulyan_to_the_flattened_models():
    models = _clients(7, seed=4)
    agg = Bulyan(num_byzantine=1)
    result = _aggregate(agg, models)
    rows = torch.stack([_flat(m) for m in models])
    torch.testing.assert_close(_flat(result), bulyan(rows, 1).float(), rtol=0, atol=1e-7)
    assert len(agg.selected_clients) == 5


@pytest.mark.parametrize("make", [FedMedian, lambda: Krum(1), lambda: Bulyan(1), lambda: TrimmedMean(0.15)])
def test_a_far_away_client_does_not_move_the_robust_rules(make):
    models = _clients(7, seed=5)

    def with_attacker(scale: float) -> dict[str, torch.Tensor]:
        attacked = list(models)
        attacked[3] = {name: t + scale if t.is_floating_point() else t for name, t in models[3].items()}
        return _aggregate(make(), attacked)

    near, far = with_attacker(1e3), with_attacker(1e6)
    honest = torch.stack([_flat(m) for k, m in enumerate(models) if k != 3])
    for name in ("w", "bn.mean"):
        assert torch.equal(near[name], far[name])
    assert (_flat(far) <= honest.max(0).values).all() and (_flat(far) >= honest.min(0).values).all()
    # FedAvg, for contrast, is dragged along.
    assert not torch.equal(_aggregate(FedAvg(), [*models[:3], far, *models[4:]])["w"], near["w"])


def test_too_few_accepted_updates_keep_the_global_model_warn_once_and_log_skipped():
    models = _clients(5)
    agg = Krum(num_byzantine=1)  # needs 5
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = _aggregate(agg, models, accepted=[0, 1, 3, 4])
        skipped_metrics, selected = agg.round_metrics(), agg.selected_clients
        _aggregate(agg, models, accepted=[0, 1, 2])
    assert skipped_metrics == {SKIPPED_KEY: 1.0} and selected == []
    assert len([w for w in record if "keeps the global model" in str(w.message)]) == 1
    for name, tensor in _global().items():
        assert torch.equal(result[name], tensor)
    _aggregate(agg, models)
    assert agg.round_metrics() == {SKIPPED_KEY: 0.0}


def test_norm_bound_clips_the_distance_to_the_global_model_and_passes_the_rest_untouched():
    models = _clients(3, spread=0.1)
    far = {name: t + 3.0 if t.is_floating_point() else t for name, t in models[1].items()}
    seen: list[ClientUpdate] = []

    class Recorder(FedAvg):
        def update(self, update):
            seen.append(update)
            super().update(update)

    agg = NormBound(Recorder(), max_norm=1.0)
    _aggregate(agg, [models[0], far, models[2]])
    assert agg.round_metrics()[CLIPPED_KEY] == pytest.approx(1 / 3)
    assert seen[0].params is models[0] and seen[2].params is models[2]
    change = _flat(seen[1].params).double() - _flat(_global()).double()
    original = _flat(far).double() - _flat(_global()).double()
    assert change.norm().item() == pytest.approx(1.0, rel=1e-6)
    torch.testing.assert_close(change / change.norm(), original / original.norm(), rtol=1e-6, atol=1e-7)
    assert torch.equal(seen[1].params["bn.count"], far["bn.count"])


def test_norm_bound_with_a_loose_bound_is_the_wrapped_aggregator():
    models = _clients(4)
    plain = _aggregate(FedMedian(), models)
    wrapped = NormBound(FedMedian(), max_norm=1e6)
    bounded = _aggregate(wrapped, models)
    assert all(torch.equal(plain[name], bounded[name]) for name in plain)
    assert wrapped.round_metrics() == {SKIPPED_KEY: 0.0, CLIPPED_KEY: 0.0}


@pytest.mark.parametrize(
    ("aggregator", "clients_per_round", "minimum"),
    [(Krum(num_byzantine=2), 6, 7), (MultiKrum(1, num_selected=6), 5, 6), (Bulyan(num_byzantine=1), 6, 7)],
)
def test_too_few_clients_per_round_is_an_error_at_setup(tmp_path, aggregator, clients_per_round, minimum):
    trainer = fast_trainer(tmp_path, clients_per_round=clients_per_round, aggregator=NormBound(aggregator, 1.0))
    lower = aggregator.setting_to_lower().strip("`")
    with pytest.raises(InvalidArgumentError, match=rf"`clients_per_round` must be at least {minimum} for.*{lower}"):
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=8))


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: TrimmedMean(beta=0.5), "beta"),
        (lambda: Krum(num_byzantine=-1), "num_byzantine"),
        (lambda: MultiKrum(1, num_selected=0), "num_selected"),
        (lambda: Bulyan(num_byzantine=1.5), "num_byzantine"),
        (lambda: NormBound(FedMedian(), max_norm=0.0), "max_norm"),
        (lambda: NormBound("fedavg", max_norm=1.0), "aggregator"),
    ],
)
def test_bad_arguments_are_named(make, argument):
    with pytest.raises(InvalidArgumentError, match=f"`{argument}`"):
        make()


class _Poison(FedCallback):
    """Makes the listed clients' losses NaN in every round: their updates are rejected."""

    def __init__(self, *client_ids: int) -> None:
        self.client_ids = client_ids

    def on_client_start(self, trainer, pl_module, client_ctx):
        pl_module.poison = client_ctx.client_id in self.client_ids


def test_a_fit_with_rejected_clients_keeps_the_global_model_when_too_few_remain(tmp_path):
    dm = make_datamodule(num_clients=5)
    trainer = fast_trainer(tmp_path, clients_per_round=5, aggregator=Krum(num_byzantine=1), callbacks=[_Poison(2)])
    module = BoringClassifier()
    before = global_weights(module)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=dm)
    assert [entry[SKIPPED_KEY] for entry in trainer.federation_state.history] == [1.0, 1.0]
    after = global_weights(module)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_fit_with_fed_median_trains_and_stays_finite_beside_a_diverging_client(tmp_path):
    dm = make_datamodule(num_clients=4)
    trainer = fast_trainer(
        tmp_path, clients_per_round=4, aggregator=NormBound(FedMedian(), 5.0), callbacks=[_Poison(1)]
    )
    module = BoringClassifier()
    before = global_weights(module)
    trainer.fit(module, datamodule=dm)
    after = global_weights(module)
    assert all(torch.isfinite(t).all() for t in after.values())
    assert any(not torch.equal(before[name], after[name]) for name in before)
    last = trainer.federation_state.history[-1]
    assert last[SKIPPED_KEY] == 0.0 and 0.0 <= last[CLIPPED_KEY] <= 1.0
    assert isinstance(trainer.aggregator.aggregator, RobustAggregator)


@pytest.mark.slow
def test_killed_and_resumed_multi_krum_run_is_bit_identical(tmp_path):
    # Robust rules keep nothing across rounds: the resumed run must still redo the interrupted round exactly.
    assert_resume_bit_identical(tmp_path, "--aggregator", 'lightning_fed.aggregators.MultiKrum={"num_byzantine": 0}')
