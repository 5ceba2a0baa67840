"""The attacks' formulas against direct transcriptions of the papers' definitions."""

import math
import statistics

import pytest
import torch

from lightning_fed.functional.attacks import (
    alie_update,
    alie_z,
    flip_labels,
    gaussian_update,
    scale_update,
    sign_flip,
)


def _delta(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=generator), "b": torch.randn(4, generator=generator)}


def test_flip_labels_maps_each_class_to_c_minus_1_minus_y():
    labels = torch.tensor([0, 1, 2, 3, 4, 9, 5])
    flipped = flip_labels(labels, 10)
    assert flipped.tolist() == [10 - 1 - y for y in labels.tolist()]
    assert torch.equal(flip_labels(flipped, 10), labels)  # an involution
    assert flip_labels(torch.tensor([1]), 3).item() == 1  # the middle class of an odd C stays


def test_sign_flip_and_scale_multiply_the_update():
    delta = _delta()
    for s in (1.0, 4.0):
        flipped = sign_flip(delta, s)
        for name, value in delta.items():
            assert torch.equal(flipped[name], -s * value)
    scaled = scale_update(delta, 7.5)
    for name, value in delta.items():
        assert torch.allclose(scaled[name], 7.5 * value)
    assert torch.equal(delta["w"], _delta()["w"])  # inputs are not edited


def test_gaussian_update_ignores_the_update_and_has_the_given_std():
    big = {"w": torch.full((200, 100), 5.0), "b": torch.zeros(300, dtype=torch.float64)}
    noise = gaussian_update(big, 0.5, torch.Generator().manual_seed(1))
    other = gaussian_update({k: -v for k, v in big.items()}, 0.5, torch.Generator().manual_seed(1))
    assert all(torch.equal(noise[k], other[k]) for k in big)  # independent of the update's values
    assert noise["b"].dtype == torch.float64 and noise["w"].shape == (200, 100)
    values = torch.cat([noise["w"].flatten(), noise["b"].float()])
    assert abs(values.mean().item()) < 0.02 and abs(values.std().item() - 0.5) < 0.02
    again = gaussian_update(big, 0.5, torch.Generator().manual_seed(2))
    assert not torch.equal(noise["w"], again["w"])


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@pytest.mark.parametrize(("n", "f"), [(50, 12), (10, 3), (10, 1), (20, 5), (7, 2)])
def test_alie_z_solves_phi_z_equals_n_minus_s_over_n(n, f):
    # Baruch et al. 2019, Sec. 4: s = floor(n/2 + 1) - f supporters; z_max with phi(z) = (n - s) / n.
    s = math.floor(n / 2 + 1) - f
    assert _phi(alie_z(n, f)) == pytest.approx((n - s) / n, abs=1e-9)


def test_alie_z_grows_with_the_attackers_and_stays_finite_past_a_majority():
    values = [alie_z(20, f) for f in range(1, 21)]
    assert all(a <= b for a, b in zip(values, values[1:]))
    assert all(math.isfinite(v) for v in values)
    assert alie_z(50, 12) == pytest.approx(0.5828, abs=1e-4)  # s = 14: Phi^-1(0.72)
    assert alie_z(1, 1) == 0.0
    with pytest.raises(ValueError):
        alie_z(5, 0)


def test_alie_update_is_mean_minus_z_population_std_per_coordinate():
    deltas = [_delta(seed) for seed in range(4)]
    z = 1.3
    result = alie_update(deltas, z)
    for name in deltas[0]:
        flat = [d[name].flatten().tolist() for d in deltas]
        for j, got in enumerate(result[name].flatten().tolist()):
            column = [values[j] for values in flat]
            expected = statistics.fmean(column) - z * statistics.pstdev(column)
            assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert result["w"].dtype == torch.float32
    alone = alie_update(deltas[:1], z)
    assert torch.equal(alone["w"], deltas[0]["w"])  # one attacker: sigma = 0
