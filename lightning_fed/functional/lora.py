r"""LoRA adapters as a federation sees them: pairing the factors by key, and the averages of their products.

A LoRA layer (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022, arXiv:2106.09685) computes
:math:`W = W_0 + \tfrac{\alpha}{r} B A` with :math:`W_0` frozen, :math:`A \in \mathbb{R}^{r \times d_{in}}` and
:math:`B \in \mathbb{R}^{d_{out} \times r}`. What a round of federated averaging should produce is the weighted mean
of the clients' weight changes,

.. math::
    \bar P = \sum_k p_k B_k A_k, \qquad p_k = w_k / \textstyle\sum_j w_j,

but averaging the factors one by one (FedIT; Zhang et al., "Towards Building the Federated GPT: Federated Instruction
Tuning", ICASSP 2024, arXiv:2305.05644) gives :math:`\bar B \bar A = (\sum_k p_k B_k)(\sum_k p_k A_k) \ne \bar P`.
This module holds the pure math: which keys pair up (:func:`find_lora_pairs`), the mean product from the stacked
factors without forming a dense matrix (:func:`product_svd`), the gap of the per-matrix average
(:func:`aggregation_gap`) and the re-factorisation at a rank (:func:`refactorise`).

The scaling :math:`\alpha / r` is left out everywhere: every client trains the same module, so the scaling is one
constant per layer that factors out of every average, and every error here is relative (a ratio of Frobenius norms)
and so the same in weight space. Everything is computed in float64.

Matrices, not tensors: :math:`A` is read as ``A.reshape(A.shape[0], -1)`` and :math:`B` as
``B.reshape(B.shape[0], B.shape[1])`` (a convolutional LoRA's ``lora_B`` is a 1×1 convolution, shape
``(out, r, 1, 1)``), see :func:`as_matrices`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: Name components that mark LoRA factors, as (A's, B's): PEFT's ``<layer>.lora_A.<adapter>.weight`` and LitGPT's
#: ``<layer>.lora_A`` (a parameter), and PEFT's embedding adapters ``<layer>.lora_embedding_A.<adapter>``.
DEFAULT_LORA_PAIRS: tuple[tuple[str, str], ...] = (("lora_A", "lora_B"), ("lora_embedding_A", "lora_embedding_B"))


@dataclass(frozen=True)
class LoRAPair:
    """One adapted layer's factors as keys of a state dict.

    Attributes:
        name: The layer and adapter, the key without its factor component (``"...q_proj.default.weight"``).
        a_key: The key of :math:`A` (``r × in``); ``None`` when :math:`A` is not in the state (frozen in the base).
        b_key: The key of :math:`B` (``out × r``); ``None`` when :math:`B` is not in the state.
    """

    name: str
    a_key: str | None
    b_key: str | None

    @property
    def trains_both(self) -> bool:
        """Whether both factors are in the state, so that averaging them one by one is not the average product."""
        return self.a_key is not None and self.b_key is not None


def find_lora_pairs(keys: Iterable[str], pairs: Sequence[tuple[str, str]] = DEFAULT_LORA_PAIRS) -> list[LoRAPair]:
    """Pairs each LoRA factor of ``keys`` with its partner, by the dotted key's name components.

    A key with a component equal to an A-name of ``pairs`` (``"lora_A"``) pairs with the same key whose component
    is the matching B-name (``"lora_B"``), and the other way round. A factor whose partner is not among ``keys``
    forms a pair with one side ``None``: the other factor is frozen (not part of the federated state), and then the
    per-matrix average is already the average product (:math:`\\bar B A = \\sum_k p_k B_k A`).

    Args:
        keys: State-dict keys, e.g. a module's federated state.
        pairs: (A-name, B-name) components; :data:`DEFAULT_LORA_PAIRS` recognises PEFT's and LitGPT's names.

    Returns:
        The pairs in the order their first key appears in ``keys``.

    Raises:
        ValueError: If a key holds two factor components, so that its layer is ambiguous.
    """
    a_names = dict(pairs)
    b_names = {b: a for a, b in pairs}
    found: dict[str, LoRAPair] = {}
    for key in keys:
        parts = key.split(".")
        hits = [i for i, part in enumerate(parts) if part in a_names or part in b_names]
        if not hits:
            continue
        if len(hits) > 1:
            raise ValueError(f"The key `{key}` names two LoRA factors ({[parts[i] for i in hits]}); rename the layer.")
        (i,) = hits
        name = ".".join(parts[:i] + ["*"] + parts[i + 1 :])
        pair = found.get(name, LoRAPair(name, None, None))
        if parts[i] in a_names:
            found[name] = LoRAPair(name, key, pair.b_key)
        else:
            found[name] = LoRAPair(name, pair.a_key, key)
    return list(found.values())


def as_matrices(b: Tensor, a: Tensor, where: str = "") -> tuple[Tensor, Tensor]:
    """:math:`B` as ``out × r`` and :math:`A` as ``r × in`` float64 matrices (views where possible).

    Raises:
        ValueError: If the shapes are no LoRA pair (the ranks differ, or ``B`` has trailing dimensions over 1).
    """
    if a.dim() < 2 or b.dim() < 2 or b.numel() != b.shape[0] * b.shape[1] or b.shape[1] != a.shape[0]:
        raise ValueError(
            f"The LoRA factors {where} have shapes B {tuple(b.shape)} and A {tuple(a.shape)}, which do not multiply"
            " as B (out × r) · A (r × in): check the pairing (`lora_pairs`)."
        )
    return b.detach().reshape(b.shape[0], b.shape[1]).double(), a.detach().reshape(a.shape[0], -1).double()


def stack_factors(bs: Sequence[Tensor], as_: Sequence[Tensor], weights: Sequence[float]) -> tuple[Tensor, Tensor]:
    r"""The stacked factors whose product is the weighted sum of the clients' products.

    FLoRA's stacking (Wang et al., "FLoRA: Federated Fine-Tuning Large Language Models with Heterogeneous Low-Rank
    Adaptations", NeurIPS 2024, arXiv:2409.05976):

    .. math::
        \sum_k p_k B_k A_k = \underbrace{[\,p_1 B_1 \;\cdots\; p_K B_K\,]}_{d_{out} \times \sum_k r_k}
        \underbrace{\begin{bmatrix} A_1 \\ \vdots \\ A_K \end{bmatrix}}_{\sum_k r_k \times d_{in}}

    The ranks :math:`r_k` may differ. Args are float64 matrices (:func:`as_matrices`) and their weights.
    """
    if not bs or len(bs) != len(as_) or len(bs) != len(weights):
        raise ValueError("`bs`, `as_` and `weights` must be non-empty and of the same length.")
    b_stack = torch.cat([b * float(w) for b, w in zip(bs, weights)], dim=1)
    return b_stack, torch.cat(list(as_), dim=0)


def product_svd(b_stack: Tensor, a_stack: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""The thin SVD of :math:`P = B_s A_s` without forming :math:`P`.

    With :math:`B_s = Q_B R_B` and :math:`A_s^\top = Q_A R_A` (reduced QR), :math:`P = Q_B (R_B R_A^\top) Q_A^\top`,
    and the SVD of the small core :math:`R_B R_A^\top = U' S V'^\top` gives :math:`P = (Q_B U') S (Q_A V')^\top`.
    Cost :math:`O((d_{out} + d_{in}) m^2)` for :math:`m = \sum_k r_k`, memory of the factors' size: the mean
    product of a 4096 × 4096 layer is never held densely.

    Returns:
        ``(U, S, Vh)`` with :math:`P = U \operatorname{diag}(S) V_h`, singular values in descending order.
    """
    q_b, r_b = torch.linalg.qr(b_stack)
    q_a, r_a = torch.linalg.qr(a_stack.T)
    u, s, vh = torch.linalg.svd(r_b @ r_a.T, full_matrices=False)
    return q_b @ u, s, vh @ q_a.T


def lowrank_frobenius(b_stack: Tensor, a_stack: Tensor) -> float:
    r""":math:`\lVert B_s A_s \rVert_F`, from the small core :math:`R_B R_A^\top` (see :func:`product_svd`)."""
    _, r_b = torch.linalg.qr(b_stack)
    _, r_a = torch.linalg.qr(a_stack.T)
    return float(torch.linalg.matrix_norm(r_b @ r_a.T))


def relative(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; 0 for 0/0 (nothing trained, nothing lost), ``inf`` for x/0."""
    if denominator > 0.0:
        return numerator / denominator
    return 0.0 if numerator == 0.0 else float("inf")


def aggregation_gap(bs: Sequence[Tensor], as_: Sequence[Tensor], weights: Sequence[float]) -> float:
    r"""The relative error of the per-matrix average (FedIT) against the average product.

    .. math::
        \mathrm{gap} = \frac{\lVert \sum_k p_k B_k A_k - \bar B \bar A \rVert_F}{\lVert \sum_k p_k B_k A_k \rVert_F},
        \qquad \bar B = \sum_k p_k B_k,\; \bar A = \sum_k p_k A_k

    with :math:`p_k` the weights normalised to sum to one. Zero when every client holds the same :math:`A` (FFA-LoRA)
    or the same :math:`B`, or with one client. Computed from the stacked factors
    :math:`[B_s \,|\, -\bar B]\,[A_s; \bar A]` (:func:`lowrank_frobenius`), never densely.

    Args:
        bs: The clients' :math:`B_k` as float64 ``out × r_k`` matrices.
        as_: Their :math:`A_k` as float64 ``r_k × in`` matrices; the ranks must all be equal (the per-matrix average
            needs equal shapes).
        weights: :math:`w_k`, any positive scale.
    """
    probabilities = _normalised(weights)
    b_stack, a_stack = stack_factors(bs, as_, probabilities)
    b_mean = sum(p * b for p, b in zip(probabilities, bs))
    a_mean = sum(p * a for p, a in zip(probabilities, as_))
    assert isinstance(b_mean, Tensor) and isinstance(a_mean, Tensor)
    difference = lowrank_frobenius(torch.cat([b_stack, -b_mean], dim=1), torch.cat([a_stack, a_mean], dim=0))
    return relative(difference, lowrank_frobenius(b_stack, a_stack))


@dataclass(frozen=True)
class Refactorised:
    """A product re-factorised at a rank.

    Attributes:
        b: :math:`B' = U_r S_r` (``out × rank``, float64).
        a: :math:`A' = V_r^\\top` (``rank × in``, float64; orthonormal rows).
        error: :math:`\\lVert P - B'A' \\rVert_F = \\sqrt{\\sum_{i > r} \\sigma_i^2}`.
        norm: :math:`\\lVert P \\rVert_F = \\sqrt{\\sum_i \\sigma_i^2}`.
    """

    b: Tensor
    a: Tensor
    error: float
    norm: float

    @property
    def relative_error(self) -> float:
        """``error / norm`` (0 for a zero product)."""
        return relative(self.error, self.norm)


def refactorise(b_stack: Tensor, a_stack: Tensor, rank: int) -> Refactorised:
    r"""The best rank-``rank`` factorisation of :math:`P = B_s A_s` (truncated SVD), and what it loses.

    By Eckart–Young–Mirsky, :math:`P_r = U_r S_r V_r^\top` minimises :math:`\lVert P - X \rVert_F` over every
    :math:`X` of rank at most :math:`r`, with error :math:`\sqrt{\sum_{i>r}\sigma_i^2}`: exact when
    :math:`\operatorname{rank} P \le r`, and otherwise the closest a rank-:math:`r` adapter can get. The split
    :math:`B' = U_r S_r`, :math:`A' = V_r^\top` keeps :math:`A'`'s rows orthonormal, like the projection LoRA's
    :math:`A` starts as, and puts the magnitude in :math:`B'`, which LoRA starts at zero; so a direction whose
    singular value is zero stays trainable (its :math:`A'` row is a unit vector). If the product has fewer than
    ``rank`` singular directions (a layer narrower than the rank), the missing ones are zero in both factors. Each
    direction's sign is fixed (the largest entry of each column of :math:`U_r` is positive), so close inputs give
    close factors.

    Args:
        b_stack: ``out × m`` (:func:`stack_factors`).
        a_stack: ``m × in``.
        rank: :math:`r \ge 1`.
    """
    u, s, vh = product_svd(b_stack, a_stack)
    kept = min(rank, s.numel())
    # Singular vectors are defined up to sign: fix it (each column of U has its largest entry positive), so that the
    # factors, not only their product, agree where the inputs agree up to rounding (ranks, batched clients, devices).
    columns = torch.arange(u.shape[1], device=u.device)
    signs = torch.sign(u[u.abs().argmax(dim=0), columns])
    signs[signs == 0] = 1.0
    u, vh = u * signs, vh * signs[:, None]
    b = torch.zeros(b_stack.shape[0], rank, dtype=torch.float64, device=b_stack.device)
    a = torch.zeros(rank, a_stack.shape[1], dtype=torch.float64, device=a_stack.device)
    b[:, :kept] = u[:, :kept] * s[:kept]
    a[:kept] = vh[:kept]
    error = float(torch.linalg.vector_norm(s[kept:])) if s.numel() > kept else 0.0
    return Refactorised(b=b, a=a, error=error, norm=float(torch.linalg.vector_norm(s)))


def truncate_rank(b: Tensor, a: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    r"""The factors with every component from ``rank`` on set to zero: :math:`B[:, j] = 0`, :math:`A[j, :] = 0` for
    :math:`j \ge` ``rank``. Copies; the shapes stay the module's.

    This is how a client of rank :math:`r_k` trains inside a module of rank :math:`r \ge r_k` (HetLoRA; Cho et al.,
    "Heterogeneous LoRA for Federated Fine-tuning of On-Device Foundation Models", EMNLP 2024, arXiv:2401.06432): a
    component with both factors zero gets zero gradients (:math:`\partial L/\partial B_{:,j} \propto A_{j,:} = 0`,
    :math:`\partial L/\partial A_{j,:} \propto B_{:,j} = 0`) and so stays exactly zero under SGD, momentum, weight
    decay and Adam. The client's factors are then its rank-:math:`r_k` factors zero-padded to :math:`r`.
    """
    b, a = b.detach().clone(), a.detach().clone()
    b[:, rank:] = 0
    a[rank:] = 0
    return b, a


def _normalised(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    if total <= 0.0:
        raise ValueError(f"The weights must sum to a positive number; got {list(weights)}.")
    return [float(w) / total for w in weights]


__all__ = [
    "DEFAULT_LORA_PAIRS",
    "LoRAPair",
    "Refactorised",
    "aggregation_gap",
    "as_matrices",
    "find_lora_pairs",
    "lowrank_frobenius",
    "product_svd",
    "refactorise",
    "relative",
    "stack_factors",
    "truncate_rank",
]
