"""DPFedAvg against transcriptions of McMahan et al. 2018 and Andrew et al. 2021 (Algorithm 1), and in a real fit."""

import json
import math

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule
from helpers.resume import assert_resume_bit_identical

from lightning_fed import ClientStateStore, FedCallback
from lightning_fed.aggregators import DPFedAvg
from lightning_fed.aggregators.privacy_accounting import client_level_epsilon
from lightning_fed.callbacks import FedCurv
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.utilities.seeding import derive_seed

SEED = 11
PARAMS = ("w", "b")


def _global() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(3, 2), "b": torch.zeros(2), "bn.mean": torch.zeros(2), "bn.count": torch.tensor(0)}


def _client(global_params, delta_scale: float, seed: int, buffer: float = 1.0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    params = {
        n: global_params[n] + torch.randn(global_params[n].shape, generator=generator) * delta_scale for n in PARAMS
    }
    if "bn.mean" not in global_params:
        return params
    return {**params, "bn.mean": torch.full((2,), buffer), "bn.count": torch.tensor(seed)}


def _round(aggregator, global_params, clients, round_idx, client_ids=None):
    client_ids = client_ids or list(range(len(clients)))
    ctx = RoundContext(round_idx, client_ids, global_params, dict.fromkeys(client_ids, 10), ClientStateStore())
    aggregator.reset(global_params, ctx)
    for cid, params in zip(client_ids, clients):
        if params is not None:  # None: a rejected client, never handed to the aggregator
            aggregator.update(ClientUpdate(cid, 10, 1, params))
    return aggregator.compute(global_params)


def _configured(expected_clients: int, num_clients: int = 100, **kwargs) -> DPFedAvg:
    aggregator = DPFedAvg(**{"delta": None, **kwargs})
    aggregator.configure(SEED, num_clients, expected_clients, PARAMS)
    return aggregator


def _flat(state, names=PARAMS) -> torch.Tensor:
    return torch.cat([state[n].double().flatten() for n in names])


def _noise(purpose: str, round_idx: int, shapes) -> torch.Tensor:
    generator = torch.Generator().manual_seed(derive_seed(SEED, f"dp-fedavg/{purpose}", round_idx))
    return torch.cat([torch.randn(s, generator=generator, dtype=torch.float64).flatten() for s in shapes])


def test_without_noise_it_averages_clipped_updates_over_the_expected_clients():
    global_params = _global()
    clients = [_client(global_params, 10.0, 1), _client(global_params, 0.01, 2), None]  # large, small, rejected
    aggregator = _configured(expected_clients=4, noise_multiplier=0.0, clip_norm=1.0)
    new = _round(aggregator, global_params, clients, round_idx=0, client_ids=[3, 5, 8])
    # Written out: w_g + sum_k Delta_k min(1, S/||Delta_k||) / m with m = 4 expected clients.
    expected = torch.zeros(8, dtype=torch.float64)
    for params in clients[:2]:
        delta = _flat(params) - _flat(global_params)
        expected += delta * min(1.0, 1.0 / float(delta.norm()))
    torch.testing.assert_close(_flat(new), (expected / 4).float().double(), rtol=0, atol=0)
    assert new["bn.mean"].tolist() == [1.0, 1.0] and new["bn.count"].item() == 2
    metrics = aggregator.round_metrics()
    assert metrics["privacy/clipped_fraction"] == 0.5 and metrics["privacy/clip_norm"] == 1.0
    assert "privacy/epsilon" not in metrics


def test_noise_std_is_z_times_s_over_the_expected_clients():
    z, clip_norm, m = 0.8, 0.5, 20
    global_params = {"w": torch.zeros(100, 100), "b": torch.zeros(10)}
    aggregator = _configured(expected_clients=m, noise_multiplier=z, clip_norm=clip_norm)
    # Clients that send back the global model: the new model is the noise alone.
    draws = [_flat(_round(aggregator, global_params, [dict(global_params)] * 5, r)) for r in range(3)]
    noise = torch.cat(draws)
    assert float(noise.std()) == pytest.approx(z * clip_norm / m, rel=0.02)
    assert abs(float(noise.mean())) < 4 * z * clip_norm / m / math.sqrt(noise.numel())
    # Each round draws fresh noise.
    assert not torch.equal(draws[0], draws[1])
    assert aggregator.round_metrics()["privacy/noise_std"] == pytest.approx(z * clip_norm / m)


def test_buffers_are_averaged_without_noise_and_rounds_are_reproducible():
    global_params = _global()
    clients = [_client(global_params, 1.0, s, buffer=float(s)) for s in (1, 2, 3)]
    first = _round(_configured(3, noise_multiplier=1.0), global_params, clients, 4)
    again = _round(_configured(3, noise_multiplier=1.0), global_params, clients, 4)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert first["bn.mean"].tolist() == [2.0, 2.0]


def test_every_client_rejected_still_releases_noise():
    global_params = _global()
    noisy = _round(_configured(4, noise_multiplier=1.0), global_params, [None, None], 0)
    assert not torch.equal(noisy["w"], global_params["w"])
    assert torch.equal(noisy["bn.mean"], global_params["bn.mean"])
    quiet = _round(_configured(4, noise_multiplier=0.0), global_params, [None, None], 0)
    assert all(torch.equal(quiet[n], global_params[n]) for n in global_params)


def algorithm_1(global_params, rounds_of_clients, clip_norm, z, sigma_b, m, quantile, clip_lr):
    """Andrew et al. 2021, Algorithm 1 with DP-FedAvg's server step, over flat vectors; noise from the same seeds."""
    w = _flat(global_params)
    shapes = [global_params[n].shape for n in PARAMS]
    sigma_delta = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    clip_norms = []
    for round_idx, clients in enumerate(rounds_of_clients):
        clip_norms.append(clip_norm)
        total, unclipped = torch.zeros_like(w), 0
        for local in clients:
            delta = _flat(local) - w
            norm = float(delta.norm())
            unclipped += norm <= clip_norm
            total += delta * min(1.0, clip_norm / norm)
        w = w + (total + sigma_delta * clip_norm * _noise("update", round_idx, shapes)) / m
        b_tilde = (unclipped + sigma_b * float(_noise("count", round_idx, [()]))) / m
        clip_norm = clip_norm * math.exp(-clip_lr * (b_tilde - quantile))
    return w, clip_norms, clip_norm


def test_adaptive_clipping_follows_algorithm_1():
    z, sigma_b, m, quantile, clip_lr = 0.5, 1.0, 4, 0.3, 0.5
    aggregator = _configured(
        m,
        noise_multiplier=z,
        clip_norm=0.5,
        adaptive_clipping=True,
        target_quantile=quantile,
        clip_lr=clip_lr,
        clipped_count_stddev=sigma_b,
    )
    global_params = {n: torch.zeros(3, 2).double() if n == "w" else torch.zeros(2).double() for n in PARAMS}
    rounds, seen_norms = [], []
    for round_idx in range(4):
        clients = [_client(global_params, s, 10 * round_idx + k) for k, s in enumerate((0.05, 0.2, 0.5, 2.0))]
        rounds.append(clients)
        seen_norms.append(aggregator.current_clip_norm)
        global_params = _round(aggregator, global_params, clients, round_idx)
    start = {n: torch.zeros(3, 2).double() if n == "w" else torch.zeros(2).double() for n in PARAMS}
    # The transcription re-derives each round's clients from its own running model: feed it the same ones.
    w, clip_norms, final = algorithm_1(start, rounds, 0.5, z, sigma_b, m, quantile, clip_lr)
    assert seen_norms == pytest.approx(clip_norms, rel=1e-12)
    assert aggregator.current_clip_norm == pytest.approx(final, rel=1e-12)
    torch.testing.assert_close(_flat(global_params), w, rtol=1e-12, atol=1e-12)


def test_adaptive_clip_norm_tracks_the_target_quantile_of_update_norms():
    # Noise-free (z = 0, sigma_b = 0): S converges to the gamma-quantile of the clients' update norms.
    norms = torch.linspace(0.1, 2.0, 20).tolist()
    global_params = {"w": torch.zeros(1), "b": torch.zeros(1)}
    clients = [{"w": torch.tensor([n]), "b": torch.zeros(1)} for n in norms]
    aggregator = _configured(20, noise_multiplier=0.0, adaptive_clipping=True, clip_lr=0.2, clipped_count_stddev=0.0)
    for round_idx in range(300):
        _round(aggregator, global_params, clients, round_idx)
    median = sorted(norms)[9:11]
    assert median[0] * 0.9 <= aggregator.current_clip_norm <= median[1] * 1.1


def test_state_dict_restores_the_clip_norm_and_the_rounds():
    global_params = _global()
    clients = [_client(global_params, 1.0, s) for s in (1, 2)]
    run = _configured(2, noise_multiplier=0.5, adaptive_clipping=True, clipped_count_stddev=1.0)
    for r in range(2):
        _round(run, global_params, clients, r)
    restored = _configured(2, noise_multiplier=0.5, adaptive_clipping=True, clipped_count_stddev=1.0)
    restored.load_state_dict(run.state_dict())
    assert restored.current_clip_norm == run.current_clip_norm != 1.0 and restored.rounds_accounted == 2
    a, b = _round(run, global_params, clients, 2), _round(restored, global_params, clients, 2)
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),  # accounting on by default
        ({"delta": 1.0}, "delta"),
        ({"target_quantile": 1.5}, "target_quantile"),
        ({"clip_lr": -1.0}, "clip_lr"),
        ({"adaptive_clipping": True, "noise_multiplier": 1.0, "clipped_count_stddev": 0.5}, "clipped_count_stddev"),
        ({"server_lr": 0.0}, "server_lr"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(InvalidArgumentError, match=f"`{argument}`"):
        DPFedAvg(**kwargs)


def test_default_count_noise_too_small_for_the_sample_is_refused():
    # sigma_b = m / 20 = 0.25 leaves nothing of z = 1 for the update.
    aggregator = DPFedAvg(noise_multiplier=1.0, adaptive_clipping=True)
    with pytest.raises(InvalidArgumentError, match="`clipped_count_stddev`"):
        aggregator.configure(0, 100, 5, PARAMS)


class Poison(FedCallback):
    def on_client_start(self, trainer, pl_module, client_ctx):
        pl_module.poison = client_ctx.client_id == 1


def test_fit_logs_epsilon_and_rejects_a_diverging_client_before_clipping(tmp_path):
    torch.manual_seed(0)
    aggregator = DPFedAvg(clip_norm=0.5, noise_multiplier=1.0, delta=1e-4)
    trainer = fast_trainer(tmp_path, num_rounds=3, clients_per_round=4, aggregator=aggregator, callbacks=[Poison()])
    module = BoringClassifier()
    trainer.fit(module, datamodule=make_datamodule(num_clients=6))
    assert all(torch.isfinite(t).all() for t in module.state_dict().values())
    history = trainer.federation_state.history
    epsilons = [entry["privacy/epsilon"] for entry in history]
    assert epsilons == pytest.approx([client_level_epsilon(1.0, 6, 4, r + 1, 1e-4) for r in range(3)], rel=1e-12)
    rejected = [entry for entry in history if entry.get("clients/rejected", 0) > 0]
    assert rejected, "client 1 never diverged: pick another seed"
    summary = json.loads(trainer.summary_path.read_text())
    assert summary["final"]["privacy/epsilon"] == pytest.approx(epsilons[-1])
    assert 0.0 <= summary["final"]["privacy/clipped_fraction"] <= 1.0


def test_accounting_refuses_callbacks_that_send_client_data_to_the_server(tmp_path):
    trainer = fast_trainer(tmp_path, aggregator=DPFedAvg(), callbacks=[FedCurv(lam=0.1)])
    with pytest.raises(InvalidArgumentError, match="`trainer.callbacks`"):
        trainer.fit(BoringClassifier(), datamodule=make_datamodule())
    # Without accounting the same combination trains.
    trainer = fast_trainer(
        tmp_path, aggregator=DPFedAvg(noise_multiplier=0.1, delta=None), callbacks=[FedCurv(lam=0.1)]
    )
    trainer.fit(BoringClassifier(), datamodule=make_datamodule())


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    kwargs = '{"noise_multiplier": 1.0, "clip_norm": 0.3, "adaptive_clipping": true, "clipped_count_stddev": 1.0}'
    result = assert_resume_bit_identical(tmp_path, "--aggregator", f"lightning_fed.aggregators.DPFedAvg={kwargs}")
    assert result["aggregator_state"]["rounds"] == 4 and result["aggregator_state"]["clip_norm"] != 0.3


def test_accounting_refuses_a_sampler_it_does_not_assume():
    from types import SimpleNamespace

    from lightning_fed.engine.sampling import UniformClientSampler

    class OtherSampler(UniformClientSampler):
        pass

    trainer = SimpleNamespace(
        sampler=OtherSampler(2),
        callbacks=[],
        datamodule=SimpleNamespace(num_clients=4),
        federation_state=SimpleNamespace(seed=0),
        lightning_module=BoringClassifier(),
    )
    with pytest.raises(InvalidArgumentError, match="`trainer.sampler`"):
        DPFedAvg().check_setup(trainer, trainer.datamodule)
    unaccounted = DPFedAvg(delta=None, noise_multiplier=0.0)
    unaccounted.check_setup(trainer, trainer.datamodule)
    unaccounted.setup(trainer)


def test_accounting_reads_the_callbacks_flag_not_their_names():
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Callback

    from lightning_fed.engine.sampling import UniformClientSampler

    class Uploader(FedCallback):
        sends_client_data_to_server = True

    class Quiet(FedCallback):
        pass

    def trainer(*callbacks):
        return SimpleNamespace(sampler=UniformClientSampler(2), callbacks=list(callbacks))

    with pytest.raises(InvalidArgumentError, match=r"`trainer.callbacks`.*sends_client_data_to_server.*\['Uploader'\]"):
        DPFedAvg().check_setup(trainer(Quiet(), Uploader(), Callback()), None)
    # A federated callback without the flag, and a plain Lightning callback, send nothing.
    DPFedAvg().check_setup(trainer(Quiet(), Callback()), None)
    DPFedAvg(delta=None).check_setup(trainer(Uploader()), None)
