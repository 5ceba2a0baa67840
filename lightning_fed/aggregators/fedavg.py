"""Federated averaging."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from typing_extensions import override

from lightning_fed.aggregation import Aggregator
from lightning_fed.checks import check_choice, check_real
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.functional.weighted_share import share_as_float32, share_from_float32

#: The packed round state's name for one client's share of the sum as float32 entries (see ``pack_round_state``).
_SUM_AS_FLOAT32 = "_sum_as_float32"


class FedAvg(Aggregator):
    r"""Federated averaging with an optional server learning rate.

    McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017,
    arXiv:1602.05629.

    .. math::
        w_g \leftarrow w_g + \eta_s \sum_{k \in S} p_k (w_k - w_g), \qquad p_k = n_k / \sum_{j \in S} n_j

    Conventions:
        * ``weighting="num_samples"`` uses :math:`p_k \propto n_k` (the paper); ``"uniform"`` uses
          :math:`p_k = 1/|S|` (what the rFedAvg authors' code does).
        * Float entries (parameters and BatchNorm running statistics) are averaged; integer buffers such as
          ``num_batches_tracked`` are copied from the last accepted client, never averaged.
        * :math:`\eta_s` steps the module's trainable parameters only (``RoundContext.parameter_names``); buffers
          and frozen parameters take the plain weighted average, since extrapolating a running variance past
          the clients' values can make it negative. Subclasses replace that step (:meth:`server_step`) with a
          server optimizer's (FedAvgM, FedAdam, ...).
        * Rejected (diverged) clients drop out and the weights of the others are renormalised.
        * The weights are fixed at ``reset`` from the sampled clients' sizes, and the sum is accumulated in
          float64. With one client and :math:`\eta_s = 1` the result is exactly that client's model, so one-client
          FedAvg is bit-identical to centralised training.
        * With several processes each rank sums its own clients; the sum and the accepted weight are declared
          round state, which ``compute`` reduces over ranks (one float64 all-reduce), and integer buffers come from
          the round's last accepted client wherever it trained. The result equals one process's up to the order of
          the float64 additions.
        * A deployment's site sends its one client's share of the sum, :math:`0 + p_k w_k`, as the float32
          :math:`w_k` and :math:`p_k` (half the bytes) where the server rebuilds it bit for bit
          (:mod:`~lightning_fed.functional.weighted_share`), so the wire carries the federated part's own size.

    Args:
        weighting: ``"num_samples"`` or ``"uniform"``.
        server_lr: :math:`\eta_s`; 1 gives the plain weighted average.
    """

    # Clients train from the global model alone; the round state (weighted sum, accepted weight) is all sums.
    broadcast_keys = ()

    def __init__(self, weighting: Literal["num_samples", "uniform"] = "num_samples", server_lr: float = 1.0) -> None:
        self.weighting = check_choice("weighting", weighting, ("num_samples", "uniform"))
        self.server_lr = check_real("server_lr", server_lr, minimum=0.0, exclusive_minimum=True)
        self._weights: dict[int, float] = {}
        # Round state (declared in reset): the weighted sum of the float entries and the accepted clients' weight.
        self._sum: StateDict = {}
        self._accepted_weight = 0.0
        self._parameter_names: frozenset[str] = frozenset()

    @property
    def steps_parameters(self) -> bool:
        """Whether the trainable parameters take :meth:`server_step` rather than the plain weighted average."""
        return self.server_lr != 1.0

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        uniform = self.weighting == "uniform"
        sizes = {cid: (1.0 if uniform else float(n)) for cid, n in round_ctx.num_samples.items()}
        total = sum(sizes.values())
        if total <= 0:
            raise ValueError("The sampled clients hold no training samples; check the partition.")
        self._weights = {cid: size / total for cid, size in sizes.items()}
        self.add_round_state("_sum", self.float64_zeros(global_params), reduce="sum")
        self.add_round_state("_accepted_weight", 0.0, reduce="sum")
        if self.steps_parameters:
            self._parameter_names = required_parameter_names(self, round_ctx)

    @override
    def update(self, update: ClientUpdate) -> None:
        weight = self._weights[update.client_id]
        self._accepted_weight += weight
        for name, tensor in self.float_entries(update.params).items():
            # float64 += weight * float32 reads the float32 values as float64 exactly, as `.double()` would, without
            # a float64 copy of the model per client: the same sum to the bit.
            real = tensor.detach() if tensor.is_floating_point() else tensor.detach().double()
            self._sum[name].add_(real, alpha=weight)

    @override
    def update_group(self, updates: Sequence[ClientUpdate]) -> None:
        if type(self).update is not FedAvg.update:
            super().update_group(updates)  # a subclass that changes `update` folds one update at a time
            return
        # `update`'s sum, one update after another in the same order.
        for update in updates:
            weight = self._weights[update.client_id]
            self._accepted_weight += weight
            for name, tensor in self.float_entries(update.params).items():
                real = tensor.detach() if tensor.is_floating_point() else tensor.detach().double()
                self._sum[name].add_(real, alpha=weight)

    @override
    def pack_round_state(self) -> dict[str, Any]:
        # A site's sum is one client's share, 0 + p_k w_k: sent as the float32 w_k and p_k, half the float64 bytes,
        # wherever that rebuilds the share bit for bit (functional.weighted_share); otherwise as it is.
        state = self.round_state()
        entries = share_as_float32(self._sum, self._accepted_weight)
        if entries is not None:
            del state["_sum"]
            state[_SUM_AS_FLOAT32] = entries
        return state

    @override
    def unpack_round_state(self, packed: Mapping[str, Any]) -> dict[str, Any]:
        state = dict(packed)
        entries = state.pop(_SUM_AS_FLOAT32, None)
        if entries is not None:
            state["_sum"] = share_from_float32(entries, state["_accepted_weight"])
        return state

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        if self._accepted_weight == 0.0:
            return {name: tensor.clone() for name, tensor in global_params.items()}
        renormalise = self._accepted_weight != 1.0
        means = {name: total / self._accepted_weight if renormalise else total for name, total in self._sum.items()}
        if self.steps_parameters:
            # Only the trainable parameters move by the server step; buffers keep the weighted mean.
            pseudo_gradient = {
                name: means[name] - global_params[name].double() for name in means if name in self._parameter_names
            }
            for name, step in self.server_step(pseudo_gradient).items():
                means[name] = global_params[name].double() + step
        new_params: StateDict = {}
        for name, old in global_params.items():
            if name in means:
                new_params[name] = means[name].to(old.dtype)
            else:
                new_params[name] = old.clone()
        return new_params

    def server_step(self, pseudo_gradient: StateDict) -> StateDict:
        r"""What is added to each trainable parameter, from :math:`\Delta = \bar w - w_g` (float64, per name).

        Called once per round with at least one accepted client, after the reduction over ranks (so every rank
        steps alike), only when :attr:`steps_parameters`. FedAvg's is :math:`\eta_s \Delta`.
        """
        return {name: self.server_lr * delta for name, delta in pseudo_gradient.items()}

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(weighting={self.weighting!r}, server_lr={self.server_lr})"


def required_parameter_names(aggregator: Aggregator, round_ctx: RoundContext) -> frozenset[str]:
    """``round_ctx.parameter_names``, which a server step needs to leave the buffers out."""
    if round_ctx.parameter_names is None:
        raise ValueError(
            f"{aggregator!r} steps the trainable parameters only, but the round's `RoundContext.parameter_names` is"
            " None: the round runner sets it; when building a RoundContext by hand, pass the names of the module's"
            " trainable parameters (`parameter_names=frozenset(n for n, p in module.named_parameters())`)."
        )
    return round_ctx.parameter_names


__all__ = ["FedAvg", "required_parameter_names"]
