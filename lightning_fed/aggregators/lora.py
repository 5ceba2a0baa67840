"""Federated averaging of LoRA adapters, with the average of the products B·A made explicit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.checks import InvalidArgumentError, check_bool, check_choice
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.functional.lora import (
    DEFAULT_LORA_PAIRS,
    LoRAPair,
    aggregation_gap,
    as_matrices,
    find_lora_pairs,
    refactorise,
    stack_factors,
)
from lightning_fed.functional.state_dict import StateDict

GAP_KEY = "lora/aggregation_gap"
GAP_MAX_KEY = "lora/aggregation_gap_max"
REFACTORISATION_ERROR_KEY = "lora/refactorisation_error"
REFACTORISATION_ERROR_MAX_KEY = "lora/refactorisation_error_max"

Mode = Literal["fedit", "ffa", "exact"]
MODES: tuple[Mode, ...] = ("fedit", "ffa", "exact")

# A client's trained factors for each layer whose A and B both train, (B_k, A_k) by pair name.
_Factors = dict[str, tuple[Tensor, Tensor]]


class LoRAFedAvg(FedAvg):
    r"""FedAvg for modules with LoRA adapters, in one of three modes that differ only on the adapters' factors.

    A LoRA layer adds :math:`\tfrac{\alpha}{r} B A` to a frozen weight (Hu et al., 2022, arXiv:2106.09685). The
    average that FedAvg stands for is the mean change :math:`\bar P = \sum_k p_k B_k A_k` (:math:`p_k` FedAvg's
    weights), but the factors are what travel and what the module holds:

    The modes, with :math:`A_0` the shared initialisation and :math:`U S V^\top` the SVD of :math:`\bar P`:

    .. math::
        \texttt{fedit}: &\quad B \leftarrow \textstyle\sum_k p_k B_k, \quad A \leftarrow \sum_k p_k A_k
            &&\qquad B A \ne \bar P \text{ in general} \\
        \texttt{ffa}: &\quad B \leftarrow \textstyle\sum_k p_k B_k, \quad A = A_0 \text{ (frozen)}
            &&\qquad B A = \bar P \\
        \texttt{exact}: &\quad B \leftarrow U_r S_r, \quad A \leftarrow V_r^\top
            &&\qquad B A = \text{the best rank-}r\text{ approximation of } \bar P

    Modes:
        * ``"fedit"`` (the default; what FlowerTune, NVFlare, OpenFedLLM do): each factor averaged on its own, FedIT
          (Zhang et al., 2024, "Towards Building the Federated GPT: Federated Instruction Tuning", ICASSP 2024,
          arXiv:2305.05644). With ``report_gap`` it logs how far that lands, :math:`\lVert \bar P - \bar B \bar A
          \rVert_F / \lVert \bar P \rVert_F` per layer (``lora/aggregation_gap``: the mean over layers;
          ``lora/aggregation_gap_max``).
        * ``"ffa"``: FFA-LoRA (Sun, Li, Ding, Wang, 2024, "Improving LoRA in Privacy-preserving Federated Learning",
          ICLR 2024, arXiv:2403.12313): :math:`A` frozen at its shared initialisation, only :math:`B` trains, and
          :math:`\sum_k p_k B_k A_0 = \bar B A_0` is exact. **The module freezes A** (``requires_grad_(False)`` on
          every ``lora_A``, or build it so); the aggregator verifies it: a client whose :math:`A` differs from the
          global one, to the bit, is refused in one line (``ValueError``), and the new :math:`A` is the global
          tensor itself. (A frozen A need not be in the update at all: a ``lora_B`` whose ``lora_A`` is absent is
          averaged, exactly, in every mode.)
        * ``"exact"``: the average product, re-factorised at the module's rank :math:`r` by a truncated SVD, the
          aggregation of FlexLoRA (Bai, Chen, Qian, Yao, Li, 2024, "Federated Fine-tuning of Large Language Models
          under Heterogeneous Tasks and Client Resources", arXiv:2402.11505), computed from FLoRA's stacked factors
          (Wang et al., 2024, arXiv:2409.05976) without forming a dense matrix
          (:func:`~lightning_fed.functional.lora.product_svd`). By Eckart–Young :math:`U_r S_r V_r^\top` is the
          best rank-:math:`r` approximation of :math:`\bar P`: **exact when** :math:`\operatorname{rank} \bar P \le
          r` (one client; clients whose :math:`A_k`, or whose :math:`B_k`, all agree), and otherwise off by
          :math:`\sqrt{\sum_{i>r}\sigma_i^2}`, logged relative to :math:`\lVert\bar P\rVert_F`
          (``lora/refactorisation_error``, mean over layers; ``lora/refactorisation_error_max``), next to the gap
          FedIT would have had. FLoRA's exact alternative keeps the stacked rank-:math:`\sum_k r_k` adapter (the
          module's shapes would grow every round), and FedEx-LoRA's (Singhal, Ponkshe, Vepakomma, 2024,
          arXiv:2410.09432) adds the residual :math:`\bar P - \bar B \bar A` to the frozen weight, which changes
          the base on the server; **neither is implemented**: here the base never changes and the adapter keeps
          its rank.

    Clients of different ranks (HetLoRA-style) train inside the module's rank with their extra components at zero
    (:class:`~lightning_fed.callbacks.LoRARanks`); then ``"fedit"`` is the zero-padding average
    :math:`B_{:,j} \leftarrow \sum_k p_k [j < r_k] B_{k,:,j}` (and likewise :math:`A`), and ``"exact"`` averages the
    products :math:`\sum_k p_k B_{k,:,:r_k} A_{k,:r_k,:}` and re-factorises at the largest rank, each client then
    taking the leading :math:`r_k` components (its best rank-:math:`r_k` approximation).

    Conventions:
        * Factors pair by key (:func:`~lightning_fed.functional.lora.find_lora_pairs`): PEFT's
          ``<layer>.lora_A.<adapter>.weight`` / ``lora_B`` and LitGPT's ``<layer>.lora_A`` / ``lora_B`` by default;
          ``lora_pairs`` names other components. The scaling :math:`\alpha/r` is one constant per layer, common to
          every client, so it factors out of the averages and the relative errors.
        * Every other entry (a trainable head, LayerNorms, BatchNorm statistics) is FedAvg's, bit for bit, and
          integer buffers follow the base's policy; ``weighting`` and ``server_lr`` are FedAvg's. In ``"exact"`` mode
          ``server_lr`` :math:`\eta_s` steps the product, :math:`P \leftarrow (1-\eta_s) B_g A_g + \eta_s \bar P`,
          before it is re-factorised.
        * Round state: FedAvg's sums; ``"fedit"`` with ``report_gap`` and ``"exact"`` also gather each client's
          factors of the layers where both train (``reduce="merge"``: rank-sized, the adapters themselves, not the
          dense product, and the server holds them all, :math:`K` × adapters, until ``compute``). So those are not
          all sums, and cannot run under secure aggregation; ``"ffa"`` and ``"fedit"`` without ``report_gap`` can.
        * ``"exact"`` hands out new factors every round (:math:`A \leftarrow V_r^\top` is a new basis of the
          adapter's row space, not an update of the old :math:`A`): optimizer state a client keeps between its rounds
          (``keep_optimizer_state``) refers to the old basis, and a client's momentum on :math:`A` no longer points
          along it. The product, which is what the module computes, is what is preserved.
        * A rejected client drops out and the weights renormalise, as in FedAvg.

    Args:
        mode: ``"fedit"``, ``"ffa"`` or ``"exact"``.
        weighting: ``"num_samples"`` or ``"uniform"`` (FedAvg's).
        server_lr: :math:`\eta_s` (FedAvg's; see the conventions for ``"exact"``).
        report_gap: Whether ``"fedit"`` measures and logs its gap (gathers the clients' factors).
        lora_pairs: (A-name, B-name) key components that mark the factors.
    """

    broadcast_keys = ()
    # The default mode's declaration ("fedit" gathers the factors to measure its gap); each instance states its own
    # mode's in __init__.
    round_state_is_sum = False

    def __init__(
        self,
        mode: Mode = "fedit",
        weighting: Literal["num_samples", "uniform"] = "num_samples",
        server_lr: float = 1.0,
        report_gap: bool = True,
        lora_pairs: Sequence[tuple[str, str]] = DEFAULT_LORA_PAIRS,
    ) -> None:
        super().__init__(weighting=weighting, server_lr=server_lr)
        self.mode = check_choice("mode", mode, MODES)
        self.report_gap = check_bool("report_gap", report_gap)
        self.lora_pairs = _checked_pairs(lora_pairs)
        # Whether the clients' factors are gathered (merged per client), which no secure sum can carry: a
        # per-instance value of the class declaration, since it depends on the mode.
        self.round_state_is_sum = not self.gathers_factors  # type: ignore[misc]
        self._pairs: list[LoRAPair] = []
        self._global_a: StateDict = {}
        self._factors: dict[int, _Factors] = {}
        self._metrics: dict[str, float] = {}

    @property
    def gathers_factors(self) -> bool:
        """Whether each client's trained factors reach ``compute`` (to re-factorise, or to measure the gap)."""
        return self.mode == "exact" or (self.mode == "fedit" and self.report_gap)

    @property
    def pairs(self) -> list[LoRAPair]:
        """The LoRA pairs of the round's global model."""
        return self._pairs

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        super().reset(global_params, round_ctx)
        self._pairs = find_lora_pairs(self.float_entries(global_params), self.lora_pairs)
        self._metrics = {}
        # FFA-LoRA's reference: the shared A every client must still hold (the global tensors, read-only).
        self._global_a = (
            {p.a_key: global_params[p.a_key] for p in self._pairs if p.a_key is not None} if self.mode == "ffa" else {}
        )
        if self.gathers_factors:
            self.add_round_state("_factors", {}, reduce="merge")

    @override
    def update(self, update: ClientUpdate) -> None:
        if self.mode == "ffa":
            self._check_a_frozen(update)
        super().update(update)
        if self.gathers_factors:
            factors = {
                p.name: (update.params[p.b_key].detach().clone(), update.params[p.a_key].detach().clone())
                for p in self._pairs
                if p.b_key is not None and p.a_key is not None
            }
            self._factors[update.client_id] = factors

    def _check_a_frozen(self, update: ClientUpdate) -> None:
        for key, reference in self._global_a.items():
            if not torch.equal(update.params[key], reference.to(update.params[key].device)):
                raise ValueError(
                    f"LoRAFedAvg(mode='ffa') needs every lora_A frozen at the shared initialisation, but client"
                    f" {update.client_id} changed `{key}`: freeze A in the module (`requires_grad_(False)` on every"
                    " lora_A parameter), or choose mode='fedit' or mode='exact'."
                )

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        new_params = super().compute(global_params)
        if self._accepted_weight == 0.0:
            return new_params
        if self.mode == "ffa":
            # A did not change on any client: keep the very tensor, not a float64 round trip of its average.
            for key, reference in self._global_a.items():
                new_params[key] = reference.clone()
        elif self.gathers_factors:
            self._combine_factors(global_params, new_params)
        return new_params

    def _combine_factors(self, global_params: StateDict, new_params: StateDict) -> None:
        """Measures the gap of the per-matrix average and, in ``"exact"`` mode, replaces it with the re-factorised
        average product; writes the round's metrics."""
        # Round order, whichever rank trained each client: every rank stacks alike.
        clients = sorted(self._factors, key=lambda cid: self._round_positions.get(cid, -1))
        weights = [self._weights[cid] / self._accepted_weight for cid in clients]
        gaps: list[float] = []
        errors: list[float] = []
        for pair in self._pairs:
            if pair.a_key is None or pair.b_key is None:
                continue
            # Gathered factors come back on the CPU with several processes: compute where the global model lives.
            device = global_params[pair.b_key].device
            matrices = []
            for cid in clients:
                b, a = self._factors[cid][pair.name]
                matrices.append(as_matrices(b.to(device), a.to(device), where=f"of `{pair.name}`"))
            bs, as_ = [m[0] for m in matrices], [m[1] for m in matrices]
            gaps.append(aggregation_gap(bs, as_, weights))
            if self.mode != "exact":
                continue
            step_weights = weights
            if self.server_lr != 1.0:
                # P <- (1 - eta) B_g A_g + eta * mean(B_k A_k): the global pair joins the stack.
                global_b, global_a = as_matrices(global_params[pair.b_key], global_params[pair.a_key])
                bs, as_ = [global_b, *bs], [global_a, *as_]
                step_weights = [1.0 - self.server_lr, *(self.server_lr * w for w in weights)]
            old_b, old_a = global_params[pair.b_key], global_params[pair.a_key]
            result = refactorise(*stack_factors(bs, as_, step_weights), rank=old_a.shape[0])
            errors.append(result.relative_error)
            new_params[pair.b_key] = result.b.reshape(old_b.shape).to(old_b.dtype)
            new_params[pair.a_key] = result.a.reshape(old_a.shape).to(old_a.dtype)
        if gaps:
            self._metrics[GAP_KEY] = sum(gaps) / len(gaps)
            self._metrics[GAP_MAX_KEY] = max(gaps)
        if errors:
            self._metrics[REFACTORISATION_ERROR_KEY] = sum(errors) / len(errors)
            self._metrics[REFACTORISATION_ERROR_MAX_KEY] = max(errors)

    @override
    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mode={self.mode!r}, weighting={self.weighting!r}, server_lr={self.server_lr},"
            f" report_gap={self.report_gap}, lora_pairs={self.lora_pairs!r})"
        )


def _checked_pairs(pairs: Any) -> tuple[tuple[str, str], ...]:
    """``pairs`` as a tuple of (A-name, B-name) tuples; refuses anything else in one line."""
    checked: list[tuple[str, str]] = []
    if isinstance(pairs, Sequence) and not isinstance(pairs, str):
        for pair in pairs:
            if not (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2):
                break
            a_name, b_name = pair
            if not all(isinstance(part, str) and part and "." not in part for part in (a_name, b_name)):
                break
            checked.append((a_name, b_name))
        else:
            if checked:
                return tuple(checked)
    raise InvalidArgumentError(
        "lora_pairs", pairs, 'a non-empty list of (A-name, B-name) key components, e.g. [["lora_A", "lora_B"]]'
    )


__all__ = [
    "GAP_KEY",
    "GAP_MAX_KEY",
    "MODES",
    "REFACTORISATION_ERROR_KEY",
    "REFACTORISATION_ERROR_MAX_KEY",
    "LoRAFedAvg",
]
