"""FedAMP / HeurFedAMP weights and cloud models against the paper's formulas (Eqs. 5, 7, 8)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lightning_fed.functional.fedamp import (
    FedAMPWeightWarning,
    fedamp_log_weights,
    fedamp_weights,
    heurfedamp_weights,
    pairwise_cosine_similarity,
    pairwise_squared_distances,
    personalized_cloud_models,
)


def _random_states(num: int, seed: int = 0, scale: float = 1.0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "a": scale * torch.randn(3, 4, generator=generator),
            "b": scale * torch.randn(5, generator=generator),
            "count": torch.tensor(i),
        }
        for i in range(num)
    ]


def _flat(state: dict[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    return torch.cat([state[k].double().flatten() for k in keys])


def test_squared_distances_and_cosines_match_the_flattened_reference():
    states, keys = _random_states(4), ["a", "b"]
    distances, cosine = pairwise_squared_distances(states, keys), pairwise_cosine_similarity(states, keys)
    for i in range(4):
        for j in range(4):
            difference = _flat(states[i], keys) - _flat(states[j], keys)
            torch.testing.assert_close(distances[i, j], difference.dot(difference))
            expected = torch.nn.functional.cosine_similarity(_flat(states[i], keys), _flat(states[j], keys), dim=0)
            torch.testing.assert_close(cosine[i, j], expected)
    assert distances.dtype == torch.float64 and torch.equal(distances.diagonal(), torch.zeros(4, dtype=torch.float64))


def test_fedamp_weights_are_the_papers_formula_and_rows_are_convex():
    states = _random_states(4, scale=0.2)
    distances = pairwise_squared_distances(states, ["a", "b"])
    alpha_k, sigma = 0.3, 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xi = fedamp_weights(distances, alpha_k, sigma)
    for i in range(4):
        for j in range(4):
            if i != j:
                expected = alpha_k * math.exp(-float(distances[i, j]) / sigma) / sigma
                torch.testing.assert_close(xi[i, j].item(), expected)
        others = sum(alpha_k * math.exp(-float(distances[i, j]) / sigma) / sigma for j in range(4) if j != i)
        torch.testing.assert_close(xi[i, i].item(), 1.0 - others)
    torch.testing.assert_close(xi.sum(1), torch.ones(4, dtype=torch.float64))
    assert (xi >= 0).all()


def test_negative_self_weight_is_clipped_renormalised_and_warned_about():
    # Identical models and alpha_k (m - 1) / sigma = 3 > 1: the raw xi_ii is 1 - 3 = -2.
    distances = torch.zeros(4, 4, dtype=torch.float64)
    with pytest.warns(FedAMPWeightWarning, match="`alpha_k`.*`sigma`"):
        xi = fedamp_weights(distances, alpha_k=1.0, sigma=1.0)
    torch.testing.assert_close(xi.sum(1), torch.ones(4, dtype=torch.float64))
    assert torch.equal(xi.diagonal(), torch.zeros(4, dtype=torch.float64)) and (xi >= 0).all()
    torch.testing.assert_close(xi[0, 1:], torch.full((3,), 1 / 3, dtype=torch.float64))


def test_the_documented_safe_alpha_k_gives_no_warning_on_identical_models():
    # alpha_k = sigma / (m - 1) and identical models (every run's first round): xi_ij = 1 / (m - 1) exactly, so
    # the self-weight is 0 up to rounding; that must not be reported as a negative self-weight.
    m = 20
    for sigma in (0.05, 0.5, 5.0, 50.0):  # 0.5, 5 and 50 round the row sum up to 1 + 2.2e-16
        with warnings.catch_warnings():
            warnings.simplefilter("error", FedAMPWeightWarning)
            xi = fedamp_weights(torch.zeros(m, m, dtype=torch.float64), alpha_k=sigma / (m - 1), sigma=sigma)
        assert (xi.diagonal() >= 0).all() and (xi.diagonal() < 1e-12).all()
        torch.testing.assert_close(xi.sum(1), torch.ones(m, dtype=torch.float64))


def test_clipping_keeps_the_relative_attention_of_a_row():
    distances = torch.tensor([[0.0, 0.1, 2.0], [0.1, 0.0, 0.5], [2.0, 0.5, 0.0]], dtype=torch.float64)
    with pytest.warns(FedAMPWeightWarning):
        xi = fedamp_weights(distances, alpha_k=2.0, sigma=1.0)
    raw = 2.0 * torch.exp(-distances)
    for i in range(3):
        others = [j for j in range(3) if j != i]
        if raw[i, others].sum() > 1:
            assert xi[i, i] == 0
            torch.testing.assert_close(xi[i, others], raw[i, others] / raw[i, others].sum())
        assert (xi[i] >= 0).all() and math.isclose(float(xi[i].sum()), 1.0, rel_tol=1e-12)


@pytest.fixture(scope="module")
def million_parameter_models():
    """Three 1000x1000 linear layers (1M parameters each), initialised independently, as client models."""
    states = []
    for seed in range(3):
        torch.manual_seed(seed)
        states.append({k: v.detach() for k, v in torch.nn.Linear(1000, 1000, bias=False).state_dict().items()})
    return states


def test_no_underflow_for_a_million_parameters(million_parameter_models):
    states = million_parameter_models
    distances = pairwise_squared_distances(states, ["weight"])
    reference = (states[0]["weight"].double() - states[1]["weight"].double()).square().sum()
    torch.testing.assert_close(distances[0, 1], reference, rtol=1e-12, atol=0)
    sigma = 1.0
    # The naive float32 weight is exactly zero: this is the underflow that erases collaboration.
    assert torch.exp(-distances[0, 1].float() / sigma) == 0
    log_xi = fedamp_log_weights(distances, alpha_k=0.1, sigma=sigma)
    torch.testing.assert_close(log_xi[0, 1], math.log(0.1) - distances[0, 1] / sigma)
    with pytest.warns(FedAMPWeightWarning, match=r"clients \[0, 1, 2\] do not collaborate.*`sigma`"):
        xi = fedamp_weights(distances, alpha_k=0.1, sigma=sigma, resolution=torch.finfo(torch.float32).eps)
    # float64 keeps the weight (about 1e-290): tiny, exact, and reported rather than silently zero.
    assert 0 < xi[0, 1] < 1e-200
    torch.testing.assert_close(xi[0, 1].log(), log_xi[0, 1])


def test_weights_that_underflow_even_float64_are_still_reported(million_parameter_models):
    distances = pairwise_squared_distances(million_parameter_models, ["weight"])
    with pytest.warns(FedAMPWeightWarning, match=r"at most 1e-\d{4}"):
        xi = fedamp_weights(distances, alpha_k=0.1, sigma=0.1)
    torch.testing.assert_close(xi, torch.eye(3, dtype=torch.float64))


def test_sigma_at_the_distance_scale_lets_deep_models_collaborate(million_parameter_models):
    states = million_parameter_models
    distances = pairwise_squared_distances(states, ["weight"])
    sigma = float(distances[0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # alpha_k / sigma = 1 / (m - 1) keeps xi_ii >= 0 for any distances.
        xi = fedamp_weights(distances, alpha_k=sigma / 2, sigma=sigma, resolution=torch.finfo(torch.float32).eps)
    assert (xi[~torch.eye(3, dtype=torch.bool)] > 0.1).all()
    cloud = personalized_cloud_models(xi, states, [0])[0]
    assert not torch.equal(cloud["weight"], states[0]["weight"])


def test_heurfedamp_rows_are_a_scaled_softmax_over_the_other_clients():
    cosine = pairwise_cosine_similarity(_random_states(5), ["a", "b"])
    sigma, self_weight = 3.0, 0.4
    xi = heurfedamp_weights(cosine, sigma, self_weight)
    for i in range(5):
        others = [j for j in range(5) if j != i]
        exps = torch.tensor([math.exp(sigma * float(cosine[i, j])) for j in others], dtype=torch.float64)
        torch.testing.assert_close(xi[i, others], (1 - self_weight) * exps / exps.sum())
        assert xi[i, i] == self_weight
    torch.testing.assert_close(xi.sum(1), torch.ones(5, dtype=torch.float64))


def test_heurfedamp_is_stable_for_a_large_scale_and_trivial_for_one_client():
    cosine = torch.tensor([[1.0, 0.99, -1.0], [0.99, 1.0, 0.0], [-1.0, 0.0, 1.0]], dtype=torch.float64)
    xi = heurfedamp_weights(cosine, sigma=1e4, self_weight=0.2)
    assert torch.isfinite(xi).all()
    torch.testing.assert_close(xi[0], torch.tensor([0.2, 0.8, 0.0], dtype=torch.float64))
    assert torch.equal(heurfedamp_weights(torch.ones(1, 1), 5.0, 0.3), torch.ones(1, 1, dtype=torch.float64))


def test_cloud_models_are_the_hand_computed_convex_combination():
    states = [
        {"w": torch.tensor([1.0, 0.0]), "steps": torch.tensor(7)},
        {"w": torch.tensor([0.0, 2.0]), "steps": torch.tensor(8)},
        {"w": torch.tensor([3.0, 3.0]), "steps": torch.tensor(9)},
    ]
    xi = torch.tensor([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    clouds = personalized_cloud_models(xi, states, [2, 0])
    # u_2 = 0.2 (1, 0) + 0.3 (0, 2) + 0.5 (3, 3) = (1.7, 2.1);  u_0 = 0.5 (1, 0) + 0.25 (0, 2) + 0.25 (3, 3).
    torch.testing.assert_close(clouds[0]["w"], torch.tensor([1.7, 2.1]))
    torch.testing.assert_close(clouds[1]["w"], torch.tensor([1.25, 1.25]))
    assert clouds[0]["w"].dtype == torch.float32
    assert clouds[0]["steps"] == 9 and clouds[1]["steps"] == 7


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: fedamp_weights(torch.zeros(2, 3), 0.1, 1.0), "squared_distances"),
        (lambda: heurfedamp_weights(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), 1.0, 0.5), "cosine"),
        (lambda: personalized_cloud_models(torch.eye(2), [{"w": torch.zeros(1)}], [0]), "one row per model"),
        (lambda: pairwise_squared_distances([], ["w"]), "states"),
        (lambda: pairwise_cosine_similarity([{"w": torch.zeros(1)}], []), "keys"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
