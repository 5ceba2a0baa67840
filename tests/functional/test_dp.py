"""DP-FedAvg's pure math (clipping, noise, adaptive clipping) and its privacy accounting."""

import math

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from lightning_fed.aggregators.privacy_accounting import check_accounting, client_level_epsilon
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.functional.dp import (
    clip_update,
    effective_noise_multiplier,
    gaussian_noise,
    l2_norm,
    next_clip_norm,
    update_noise_multiplier,
)


def _update(scale: float, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 3, generator=generator) * scale, "b": torch.randn(3, generator=generator) * scale}


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.double().flatten() for t in state.values()])


def test_l2_norm_is_the_norm_of_all_entries_as_one_vector():
    update = _update(1.0)
    assert l2_norm(update.values()) == pytest.approx(float(_flat(update).norm()), rel=1e-12)
    assert l2_norm([]) == 0.0


@pytest.mark.parametrize("scale", [0.01, 0.3, 5.0, 100.0])
def test_clipping_bounds_the_norm_and_keeps_the_direction(scale):
    clip_norm = 1.0
    update = _update(scale, seed=3)
    clipped, norm = clip_update(update, clip_norm)
    flat, flat_clipped = _flat(update), _flat(clipped)
    assert norm == pytest.approx(float(flat.norm()), rel=1e-12)
    # Written out: Delta * min(1, S / ||Delta||).
    torch.testing.assert_close(flat_clipped, flat * min(1.0, clip_norm / float(flat.norm())), rtol=1e-12, atol=0)
    assert float(flat_clipped.norm()) <= clip_norm * (1 + 1e-12)
    if norm > clip_norm:
        assert float(flat_clipped.norm()) == pytest.approx(clip_norm, rel=1e-12)


def test_an_update_within_the_ball_is_left_exactly_as_it_is():
    update = _update(0.01)
    clipped, _ = clip_update(update, 10.0)
    for name, tensor in update.items():
        assert torch.equal(clipped[name], tensor.double())


def test_noise_is_reproducible_from_the_generator_and_has_the_asked_std():
    like = {"w": torch.zeros(200, 100), "b": torch.zeros(1000)}
    first = gaussian_noise(like, 0.3, torch.Generator().manual_seed(7))
    again = gaussian_noise(like, 0.3, torch.Generator().manual_seed(7))
    other = gaussian_noise(like, 0.3, torch.Generator().manual_seed(8))
    assert all(torch.equal(first[n], again[n]) for n in like)
    assert not torch.equal(first["w"], other["w"])
    draws = _flat(first)
    assert draws.dtype == torch.float64 and draws.numel() == 21000
    # 21,000 draws: the sample std is within 1% of the true one with overwhelming probability (SE ~ 0.5%).
    assert float(draws.std()) == pytest.approx(0.3, rel=0.02)
    assert abs(float(draws.mean())) < 4 * 0.3 / math.sqrt(draws.numel())


def test_noise_split_follows_andrew_et_al_theorem_1():
    z, sigma_b = 1.0, 2.5
    sigma_delta = update_noise_multiplier(z, sigma_b)
    # Transcribed: sigma_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2).
    assert sigma_delta == pytest.approx((1 / z**2 - 1 / (2 * sigma_b) ** 2) ** -0.5, rel=1e-12)
    assert sigma_delta > z
    assert effective_noise_multiplier(sigma_delta, sigma_b) == pytest.approx(z, rel=1e-12)
    assert update_noise_multiplier(0.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="half the noise multiplier"):
        update_noise_multiplier(1.0, 0.5)


@pytest.mark.parametrize(("fraction", "direction"), [(1.0, -1), (0.0, 1), (0.5, 0)])
def test_geometric_clip_update(fraction, direction):
    new = next_clip_norm(2.0, fraction, target_quantile=0.5, clip_lr=0.2)
    assert new == pytest.approx(2.0 * math.exp(-0.2 * (fraction - 0.5)), rel=1e-12)
    # Too many unclipped updates shrink S, too few grow it.
    assert (new > 2.0) - (new < 2.0) == direction


@pytest.mark.parametrize(("z", "num_clients", "per_round", "rounds"), [(1.0, 100, 20, 30), (0.7, 200, 50, 5)])
def test_epsilon_is_the_rdp_accountants_for_sampling_without_replacement(z, num_clients, per_round, rounds):
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    release = dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, per_round, dp_accounting.GaussianDpEvent(z / 2)
    )
    accountant.compose(release, rounds)
    assert client_level_epsilon(z, num_clients, per_round, rounds, 1e-5) == pytest.approx(
        accountant.get_epsilon(1e-5), rel=1e-12
    )


@pytest.mark.parametrize(("z", "rounds"), [(1.0, 10), (4.0, 30)])
def test_replace_one_sensitivity_is_twice_the_clip_norm(z, rounds):
    """With every client in every round, T rounds are one Gaussian release with multiplier (z/2)/sqrt(T) for the
    replace-one sensitivity 2S; the exact Gaussian epsilon (Balle & Wang 2018) lower-bounds the RDP one, tightly."""
    exact = dp_accounting.get_epsilon_gaussian((z / 2) / math.sqrt(rounds), 1e-5)
    accounted = client_level_epsilon(z, 10, 10, rounds, 1e-5)
    assert exact <= accounted <= 1.15 * exact


def test_epsilon_grows_with_rounds_and_sampling_and_shrinks_with_noise():
    eps = lambda z, m, t: client_level_epsilon(z, 100, m, t, 1e-5)  # noqa: E731
    assert eps(1.0, 10, 0) == 0.0
    assert eps(1.0, 10, 5) < eps(1.0, 10, 10) < eps(1.0, 20, 10)
    assert eps(2.0, 10, 10) < eps(1.0, 10, 10)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"clients_per_round": 11}, "clients_per_round"),
        ({"clients_per_round": 0}, "clients_per_round"),
    ],
)
def test_settings_the_accountant_cannot_cover_are_refused(kwargs, argument):
    settings = {"noise_multiplier": 1.0, "num_clients": 10, "clients_per_round": 5, "delta": 1e-5, **kwargs}
    with pytest.raises(InvalidArgumentError, match=f"`{argument}`"):
        check_accounting(**settings)
