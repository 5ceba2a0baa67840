"""FedGG: a model-cosine loss that steers each client's update along the last global update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from typing_extensions import override

from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.checks import InvalidArgumentError, check_bool, check_real
from lightning_fed.context import ClientContext, RoundContext
from lightning_fed.functional.fedgg import adaptive_weight, cosine_loss, cosine_loss_gradient, flatten, unflatten
from lightning_fed.hooks import GroupStep

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def _trainable(pl_module: LightningModule) -> dict[str, Tensor]:
    return {name: p for name, p in pl_module.named_parameters() if p.requires_grad}


class FedGG(ParameterPenalty):
    r"""Global-update-guided federated learning: CE plus a model-cosine loss with an adaptive weight.

    Paper: Q. Wu, L. Liu, S. Xue, "Global Update Guided Federated Learning", 2022, arXiv:2204.03920.

    Local objective of client i at local step m of round r (Eq. 8, 9, 12 and Algorithm 1):

    .. math::
        \ell = \ell_{task}(w) + λ_m \big(1 - \cos(g, d)\big), \qquad g = w^r - w^{r-1}, \quad d = w - w^r,

        λ_m = μ \, \lVert w(m-1) - w^r \rVert \, \lVert w(m-1) - w(m-2) \rVert \quad (\text{adaptive}), \qquad
        λ_m = λ \quad (\text{fixed}),

    with :math:`w(0) = w^r`. λ_m is held constant (detached), as in the paper, so the injected gradient is

    .. math::
        -λ_m \Big( \frac{g}{\lVert g \rVert \lVert d \rVert} - \cos(g, d) \frac{d}{\lVert d \rVert^2} \Big).

    Conventions:

    - The cosine and all norms are over the concatenation of every trainable parameter (``requires_grad``);
      buffers are ignored. The term is a value, not a mean over anything.
    - No term at the first local step (m = 1, where d = 0) and none in round 0 (no g yet), as in Algorithm 1; for
      the adaptive weight λ_1 = 0 follows from w(0) = w^r anyway.
    - ``cos(g, d) := 0`` when ``‖g‖ = 0`` or ``‖d‖ = 0``, and the gradient is then 0, so no NaN arises when the
      global model did not move or the client has not (yet) moved. With the adaptive weight, the factor ‖d‖ in
      λ_m cancels the 1/‖d‖ of the gradient, which is why it is stable near d = 0 and the fixed λ is not.
    - g is server state: the difference of the global models at the start of this round and of the previous one
      (any ``on_aggregate`` edits included), kept in :meth:`state_dict` so a resumed run is bit-identical. Every
      client of a round uses the same, latest g.
    - Communication: a client sampled in round r−1 holds w^{r−1} and forms g itself; every other sampled client
      receives g, which is counted in ``bytes_down`` (one model's parameters each). With full participation,
      as in the paper's experiments, FedGG sends nothing beyond FedAvg.
    - Logged: ``train/fedgg_cosine`` (the term λ_m(1 − cos)) and ``train/fedgg_lambda`` (λ_m), as round means
      over local steps and clients; the task loss stays the module's own (``train/loss``).

    Deviations from the paper:

    - The paper's Eq. (11)/(13) print ``+ cos·d̂`` in the gradient; the derivative of its Eq. (8) is ``− cos·d̂``,
      which is used here (checked against autograd).
    - For non-persistent clients the paper takes w^{r−1} as "the latest received global model" of the client (a
      possibly stale copy); here g is always the server's latest global update.
    - The paper's update rule (Algorithm 1, line 20) is plain SGD; here the term's gradient goes through the
      module's optimizer (the paper's experiments use SGD with momentum 0.9) and through gradient clipping.

    Paper defaults: SGD lr 0.01, momentum 0.9, batch 64, E = 5, N = 10, μ = 0.01 (best of {0.001, 0.01, 0.1, 1});
    fixed λ ≈ 5e-8 (diverges at 1e-7 on CIFAR-10).

    Args:
        mu: Coefficient μ ≥ 0 of the adaptive weight.
        adaptive: Use the adaptive weight λ_m (the paper's method); ``False`` uses the fixed ``lam``.
        lam: The fixed weight λ ≥ 0, only with ``adaptive=False``.
        log_every_n_steps: Log the term every n local steps.
    """

    broadcast_keys = ()

    # The step weight and the anchors live in single slots of the callback, one client at a time: no batched form.
    supports_batched_clients = False

    def __init__(
        self, mu: float = 0.01, adaptive: bool = True, lam: float | None = None, log_every_n_steps: int = 1
    ) -> None:
        self.mu = check_real("mu", mu, minimum=0.0)
        self.adaptive = check_bool("adaptive", adaptive)
        if adaptive and lam is not None:
            # `lam` is the fixed weight: silently ignoring it would run another method than the user asked for.
            raise InvalidArgumentError("lam", lam, "None with `adaptive=True` (set `adaptive=False` to use a fixed λ)")
        self.lam: float | None = None if adaptive else check_real("lam", lam, minimum=0.0)
        super().__init__("fedgg_cosine", log_every_n_steps)
        self._previous_global: dict[str, Tensor] | None = None
        self._previous_clients: list[int] = []
        self._g: Tensor | None = None
        self._anchor = torch.zeros(0)
        self._before_last_step = torch.zeros(0)
        self._weight: Tensor | float = 0.0

    @property
    def global_update(self) -> dict[str, Tensor] | None:
        """This round's g = w^r − w^{r−1} per trainable parameter (views), or ``None`` in round 0."""
        if self._g is None or self._previous_global is None:
            return None
        return unflatten(self._g, self._previous_global)

    @override
    def setup(self, trainer: Any, pl_module: LightningModule, stage: str) -> None:
        # Runs before a checkpoint is restored: a reused callback must not carry g into a fresh fit.
        if stage == "fit":
            self._g, self._previous_global, self._previous_clients = None, None, []

    @override
    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        current = {name: round_ctx.global_params[name].detach().clone() for name in _trainable(pl_module)}
        previous = self._previous_global
        self._g = None
        if previous is not None and list(previous) == list(current):
            self._g = flatten(current[name] - previous[name].to(current[name]) for name in current)
            receivers = [cid for cid in round_ctx.client_ids if cid not in set(self._previous_clients)]
            round_ctx.bytes_down += len(receivers) * self._g.numel() * self._g.element_size()
        self._previous_global, self._previous_clients = current, list(round_ctx.client_ids)

    @override
    def is_active(self, client_ctx: ClientContext) -> bool:
        return self._g is not None

    @override
    def on_client_train_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> None:
        self._weight = 0.0
        if self._previous_global is not None and self._g is not None:
            self._anchor = flatten(client_ctx.global_params[name].detach() for name in self._previous_global)
            self._before_last_step = self._flat(_trainable(pl_module))

    def _flat(self, params: dict[str, Tensor]) -> Tensor:
        assert self._previous_global is not None
        return flatten(params[name].detach() for name in self._previous_global)

    def step_weight(self, params: dict[str, Tensor], client_ctx: ClientContext) -> Tensor | float:
        """λ_m for the step about to be taken (``client_ctx.num_steps`` = m − 1 steps done), detached."""
        if client_ctx.num_steps == 0:
            return 0.0
        if self.lam is not None:  # the fixed weight, set exactly when `adaptive=False`
            return self.lam
        return adaptive_weight(self.mu, self._flat(params), self._anchor, self._before_last_step)

    @override
    def on_client_before_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        (client_ctx,) = step.contexts  # one client at a time (supports_batched_clients is off)
        if not self.is_active(client_ctx):
            return
        params = {name: p[0] for name, p in step.params.items()}
        self._weight = self.step_weight(params, client_ctx)
        self._before_last_step.copy_(self._flat(params))
        super().on_client_before_optimizer_step(trainer, pl_module, step)
        if client_ctx.num_steps % self.log_every_n_steps == 0:
            weight = self._weight
            step.log(0, "fedgg_lambda", weight if isinstance(weight, Tensor) else torch.tensor(weight))

    @override
    def penalty(self, params: dict[str, Tensor], client_ctx: ClientContext) -> Tensor:
        """λ_m (1 − cos(g, w − w^r)) with λ_m the current step's (constant) weight."""
        if self._g is None or self._previous_global is None:
            return torch.zeros(())
        d = flatten(params[name] for name in self._previous_global) - self._anchor
        return cosine_loss(self._g, d, self._weight)

    @override
    def penalty_gradient(self, params: dict[str, Tensor], client_ctx: ClientContext) -> dict[str, Tensor]:
        """The closed-form gradient of :meth:`penalty`.

        See :func:`~lightning_fed.functional.fedgg.cosine_loss_gradient`.
        """
        if self._g is None or self._previous_global is None:
            return {}
        gradient = cosine_loss_gradient(self._g, self._flat(params) - self._anchor, self._weight)
        return unflatten(gradient, {name: params[name] for name in self._previous_global})

    @override
    def state_dict(self) -> dict[str, Any]:
        previous = self._previous_global
        return {
            "previous_global": None if previous is None else {n: t.detach().cpu().clone() for n, t in previous.items()},
            "previous_clients": list(self._previous_clients),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._previous_global = state_dict["previous_global"]
        self._previous_clients = list(state_dict["previous_clients"])
