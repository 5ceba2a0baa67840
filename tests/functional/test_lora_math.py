"""LoRA aggregation math against a dense reference: every client's B·A built explicitly and averaged densely."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fed.functional.lora import (
    aggregation_gap,
    as_matrices,
    find_lora_pairs,
    lowrank_frobenius,
    product_svd,
    refactorise,
    stack_factors,
    truncate_rank,
)


def _clients(num_clients: int, out: int, inp: int, rank: int, seed: int = 0, shared_a: bool = False):
    generator = torch.Generator().manual_seed(seed)
    a0 = torch.randn(rank, inp, generator=generator, dtype=torch.float64)
    bs = [torch.randn(out, rank, generator=generator, dtype=torch.float64) for _ in range(num_clients)]
    as_ = [a0 if shared_a else torch.randn(rank, inp, generator=generator, dtype=torch.float64) for _ in bs]
    weights = [float(w) for w in torch.rand(num_clients, generator=generator, dtype=torch.float64) + 0.5]
    return bs, as_, weights


def _dense_mean_product(bs, as_, weights):
    total = sum(weights)
    return sum((w / total) * (b @ a) for b, a, w in zip(bs, as_, weights))


def test_pairs_recognise_peft_and_litgpt_names():
    keys = [
        "base_model.model.layers.0.q_proj.base_layer.weight",
        "base_model.model.layers.0.q_proj.lora_A.default.weight",
        "base_model.model.layers.0.q_proj.lora_B.default.weight",
        "transformer.h.0.attn.lora_A",
        "transformer.h.0.attn.lora_B",
        "embed.lora_embedding_A.default",
        "embed.lora_embedding_B.default",
        "head.weight",
    ]
    pairs = {p.name: (p.a_key, p.b_key) for p in find_lora_pairs(keys)}
    assert pairs == {
        "base_model.model.layers.0.q_proj.*.default.weight": (keys[1], keys[2]),
        "transformer.h.0.attn.*": (keys[3], keys[4]),
        "embed.*.default": (keys[5], keys[6]),
    }


def test_a_factor_without_its_partner_is_a_one_sided_pair_and_custom_names_pair():
    (pair,) = find_lora_pairs(["x.lora_B.default.weight", "x.base.weight"])
    assert (pair.a_key, pair.b_key, pair.trains_both) == (None, "x.lora_B.default.weight", False)
    (pair,) = find_lora_pairs(["m.down", "m.up", "m.lora_A"], pairs=[("down", "up")])
    assert (pair.a_key, pair.b_key) == ("m.down", "m.up")


def test_product_svd_is_the_dense_svd_of_the_mean_product():
    bs, as_, weights = _clients(3, out=12, inp=9, rank=2)
    total = sum(weights)
    u, s, vh = product_svd(*stack_factors(bs, as_, [w / total for w in weights]))
    dense = _dense_mean_product(bs, as_, weights)
    torch.testing.assert_close(u @ torch.diag(s) @ vh, dense, rtol=0, atol=1e-12)
    torch.testing.assert_close(s, torch.linalg.svdvals(dense)[: s.numel()], rtol=0, atol=1e-12)


def test_gap_of_the_per_matrix_average_equals_the_dense_computation():
    bs, as_, weights = _clients(4, out=10, inp=7, rank=3, seed=1)
    total = sum(weights)
    dense = _dense_mean_product(bs, as_, weights)
    fedit = sum(w / total * b for b, w in zip(bs, weights)) @ sum(w / total * a for a, w in zip(as_, weights))
    expected = float(torch.linalg.matrix_norm(dense - fedit) / torch.linalg.matrix_norm(dense))
    assert expected > 0.1  # independent clients: the per-matrix average is far from the mean product
    assert aggregation_gap(bs, as_, weights) == pytest.approx(expected, rel=1e-10)


def test_gap_is_zero_when_the_clients_share_a():
    bs, as_, weights = _clients(4, out=10, inp=7, rank=3, seed=2, shared_a=True)
    assert aggregation_gap(bs, as_, weights) < 1e-14


def test_refactorisation_is_exact_when_the_mean_product_has_rank_at_most_r():
    # A shared A (FFA-LoRA's situation): the mean product is (sum p_k B_k) A, of rank <= r.
    bs, as_, weights = _clients(5, out=11, inp=8, rank=3, seed=3, shared_a=True)
    total = sum(weights)
    result = refactorise(*stack_factors(bs, as_, [w / total for w in weights]), rank=3)
    dense = _dense_mean_product(bs, as_, weights)
    torch.testing.assert_close(result.b @ result.a, dense, rtol=0, atol=1e-12)
    assert result.relative_error < 1e-12
    # A's rows come back orthonormal; B carries the magnitude.
    torch.testing.assert_close(result.a @ result.a.T, torch.eye(3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_refactorisation_error_equals_the_measured_residual_and_eckart_young():
    bs, as_, weights = _clients(4, out=11, inp=9, rank=2, seed=4)
    total = sum(weights)
    result = refactorise(*stack_factors(bs, as_, [w / total for w in weights]), rank=2)
    dense = _dense_mean_product(bs, as_, weights)
    residual = float(torch.linalg.matrix_norm(dense - result.b @ result.a))
    tail = float(torch.linalg.svdvals(dense)[2:].square().sum().sqrt())
    assert residual > 0.1
    assert result.error == pytest.approx(residual, rel=1e-9)
    assert result.error == pytest.approx(tail, rel=1e-9)
    assert result.relative_error == pytest.approx(residual / float(torch.linalg.matrix_norm(dense)), rel=1e-9)
    # The best rank-2 approximation: no better factorisation of that rank exists (the per-matrix average is one).
    fedit = sum(w / total * b for b, w in zip(bs, weights)) @ sum(w / total * a for a, w in zip(as_, weights))
    assert residual < float(torch.linalg.matrix_norm(dense - fedit))


def test_different_ranks_stack_into_the_mean_product():
    generator = torch.Generator().manual_seed(5)
    ranks = [1, 2, 4]
    bs = [torch.randn(9, r, generator=generator, dtype=torch.float64) for r in ranks]
    as_ = [torch.randn(r, 6, generator=generator, dtype=torch.float64) for r in ranks]
    weights = [1.0, 2.0, 3.0]
    result = refactorise(*stack_factors(bs, as_, [w / 6 for w in weights]), rank=4)
    dense = _dense_mean_product(bs, as_, weights)
    residual = float(torch.linalg.matrix_norm(dense - result.b @ result.a))
    assert result.error == pytest.approx(residual, rel=1e-9, abs=1e-12)
    # HetLoRA's zero padding: each client at rank 4 with its components from r_k on zeroed (in both factors, whatever
    # they held) has the same product, so the same mean product.
    padded = []
    for b, a, r in zip(bs, as_, ranks):
        wide_b = torch.cat([b, torch.randn(9, 4 - r, generator=generator, dtype=b.dtype)], dim=1)
        tall_a = torch.cat([a, torch.randn(4 - r, 6, generator=generator, dtype=a.dtype)], dim=0)
        padded.append(truncate_rank(wide_b, tall_a, r))
    padded_bs, padded_as = [b for b, _ in padded], [a for _, a in padded]
    torch.testing.assert_close(_dense_mean_product(padded_bs, padded_as, weights), dense, rtol=0, atol=1e-12)


def test_lowrank_frobenius_matches_the_dense_norm():
    bs, as_, weights = _clients(3, out=5, inp=13, rank=4, seed=6)
    b_stack, a_stack = stack_factors(bs, as_, weights)
    assert lowrank_frobenius(b_stack, a_stack) == pytest.approx(
        float(torch.linalg.matrix_norm(b_stack @ a_stack)), rel=1e-12
    )


def test_truncate_rank_zeroes_both_factors_from_the_rank_on():
    b, a = torch.randn(6, 4), torch.randn(4, 5)
    tb, ta = truncate_rank(b, a, 2)
    assert torch.equal(tb[:, :2], b[:, :2]) and torch.equal(ta[:2], a[:2])
    assert not tb[:, 2:].any() and not ta[2:].any()
    torch.testing.assert_close(tb @ ta, b[:, :2] @ a[:2])


def test_conv_shaped_factors_read_as_matrices_and_bad_shapes_are_refused():
    b, a = as_matrices(torch.randn(8, 3, 1, 1), torch.randn(3, 2, 3, 3))
    assert b.shape == (8, 3) and a.shape == (3, 18) and b.dtype == torch.float64
    with pytest.raises(ValueError, match="do not multiply"):
        as_matrices(torch.randn(8, 3), torch.randn(2, 5), where="of `x`")


def test_zero_product_has_zero_gap_and_error():
    bs = [torch.zeros(4, 2, dtype=torch.float64)] * 2
    as_ = [torch.randn(2, 3, dtype=torch.float64)] * 2
    assert aggregation_gap(bs, as_, [1.0, 1.0]) == 0.0
    result = refactorise(*stack_factors(bs, as_, [0.5, 0.5]), rank=2)
    assert result.relative_error == 0.0 and not result.b.any()
    assert not math.isnan(float(result.a.sum()))


def test_refactorised_factors_depend_on_the_product_only_signs_included():
    # The same mean product from the clients in another order, and with each client's pair negated (-B)(-A): the
    # SVD's signs are fixed, so the factors themselves agree, not just their product.
    bs, as_, weights = _clients(3, out=10, inp=7, rank=2, seed=7)
    first = refactorise(*stack_factors(bs, as_, weights), rank=2)
    again = refactorise(*stack_factors([-b for b in bs[::-1]], [-a for a in as_[::-1]], weights[::-1]), rank=2)
    torch.testing.assert_close(again.b, first.b, rtol=0, atol=1e-10)
    torch.testing.assert_close(again.a, first.a, rtol=0, atol=1e-10)
