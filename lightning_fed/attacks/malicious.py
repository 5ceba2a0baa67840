"""Attack simulation: a seeded share of the clients is malicious and attacks every round it is sampled in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_fed.attacks.label_flip import LabelFlip
from lightning_fed.attacks.selection import choose_malicious
from lightning_fed.checks import InvalidArgumentError, check_choice, check_int, check_real
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.attacks import alie_update, alie_z, gaussian_update, scale_update, sign_flip
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.hooks import FedCallback
from lightning_fed.parallel import distributed
from lightning_fed.utilities.seeding import derive_seed

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

ATTACKS = ("label_flip", "sign_flip", "scale", "gaussian", "alie")


class MaliciousClients(FedCallback):
    r"""Makes a fixed, seeded share of the clients malicious; each attacks with ``attack`` whenever it is sampled.

    The malicious clients are the first :math:`\lfloor \text{fraction} \cdot N \rfloor` of a permutation of the
    :math:`N` clients seeded by the run seed (:func:`~lightning_fed.attacks.selection.choose_malicious`): the same on
    every rank and after a resume, and nested across fractions for one seed. They train honestly on their own data
    (except under label flipping) and then tamper with what they send. Attacks:

    * ``"label_flip"`` (data poisoning; Fang et al., USENIX Security 2020, arXiv:1911.11815): the client trains on
      labels :math:`C - 1 - y`. The labels are flipped in the batches of local training only (through
      ``ClientContext.batch_transforms``); loaders handed to other hooks and to aggregator probes hold the client's
      true labels. Needs ``(inputs, labels, ...)`` batches; :math:`C` is ``num_classes`` or the datamodule's.
    * ``"sign_flip"`` (Li et al., AAAI 2019, arXiv:1811.03761): :math:`\Delta' = -s\,\Delta`, :math:`s` = ``scale``
      (default 1).
    * ``"scale"`` (model replacement; Bagdasaryan et al., AISTATS 2020, arXiv:1807.00459, Eq. 3):
      :math:`\Delta' = \gamma\,\Delta` with :math:`\gamma` = ``scale``, by default the paper's :math:`n/\eta`: the
      round's :math:`n` sampled clients over the aggregator's server learning rate :math:`\eta` (its ``server_lr``,
      1 if it has none). One such client replaces a FedAvg model with its own when the clients hold equal data.
    * ``"gaussian"`` (Blanchard et al., NeurIPS 2017, arXiv:1703.02757): :math:`\Delta' \sim \mathcal{N}(0,
      \sigma^2 I)` with :math:`\sigma` = ``noise_std``, seeded by (run seed, round, client).
    * ``"alie"``, "a little is enough" (Baruch et al., NeurIPS 2019, arXiv:1902.06156):
      :math:`\Delta' = \mu - z\,\sigma` coordinate-wise, where :math:`\mu, \sigma` are the mean and (population)
      standard deviation of the honest updates the round's malicious clients computed themselves (the paper's
      setting: the attackers do not see the honest clients' updates), and every attacker sends the same
      :math:`\Delta'`. :math:`z` = ``z``, by default the paper's
      :math:`z = \Phi^{-1}((n - s)/n)`, :math:`s = \lfloor n/2 + 1 \rfloor - f`, with :math:`n` the round's sampled
      clients and :math:`f` its malicious updates (:func:`~lightning_fed.functional.attacks.alie_z`).

    Update-space attacks act on :math:`\Delta = w_k - w_g` (the client's model minus the round's global model) of the
    trainable parameters, and the client sends :math:`w_g + \Delta'`. Buffers are sent as trained: integer ones
    (``num_batches_tracked``) must stay counts, and BatchNorm's running variances must stay positive, which a flipped
    or noisy update would break.

    How updates are replaced in a streaming round: ``on_client_end`` holds every malicious client's update back
    (``update.held``), so the aggregator sees the honest updates as they come; once the rank's clients have trained,
    ``on_clients_end`` rewrites the held updates and the round aggregates them (rejecting any that came out
    non-finite, e.g. a huge ``scale``, as it rejects diverged clients). "A little is enough" needs every attacker's
    update of the round: with several processes each rank gathers the others' held updates (one
    ``all_gather_object``), every rank computes the same :math:`\Delta'` from them in round order, and each rank sends
    it for the attackers it trained, so the result equals one process's. Holding costs one model copy per
    malicious client of the round, on the rank that trained it.

    Logged each round: ``attack/malicious_sampled``, the number of malicious clients among the sampled ones.
    ``summary.json`` gets an ``"attack"`` entry with the attack, its settings and ``malicious_clients``.

    Args:
        fraction: Share of the clients that is malicious, in ``[0, 1)``.
        attack: One of ``"label_flip"``, ``"sign_flip"``, ``"scale"``, ``"gaussian"``, ``"alie"``.
        scale: :math:`s` of ``"sign_flip"`` (default 1) or :math:`\gamma` of ``"scale"`` (default :math:`n/\eta`);
            positive.
        noise_std: :math:`\sigma` of ``"gaussian"``; positive.
        z: :math:`z` of ``"alie"`` (default: the paper's formula); positive.
        num_classes: :math:`C` of ``"label_flip"`` (default: the datamodule's ``num_classes``).
    """

    # ALIE gathers the honest updates of every rank itself: no secure aggregation.
    round_state_is_sum = False

    def __init__(
        self,
        fraction: float,
        attack: str,
        scale: float | None = None,
        noise_std: float = 1.0,
        z: float | None = None,
        num_classes: int | None = None,
    ) -> None:
        self.fraction = check_real("fraction", fraction, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        self.attack = check_choice("attack", attack, ATTACKS)
        self.scale = check_real("scale", scale, minimum=0.0, exclusive_minimum=True, allow_none=True)
        self.noise_std = check_real("noise_std", noise_std, minimum=0.0, exclusive_minimum=True)
        self.z = check_real("z", z, minimum=0.0, exclusive_minimum=True, allow_none=True)
        self.num_classes = check_int("num_classes", num_classes, minimum=2, allow_none=True)
        self._chosen_for: tuple[int, int] | None = None  # (seed, num_clients) of the cached choice
        self._malicious: frozenset[int] = frozenset()
        self._sampled: list[int] = []
        self._held: set[int] = set()

    def malicious_clients(self, trainer: FederatedTrainerView) -> list[int]:
        """The run's malicious client ids, sorted (drawn from the run seed on first use)."""
        key = (trainer.federation_state.seed, trainer.datamodule.num_clients)
        if key != self._chosen_for:
            self._malicious = frozenset(choose_malicious(key[0], key[1], self.fraction))
            self._chosen_for = key
        return sorted(self._malicious)

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        self._label_classes(datamodule)

    def _label_classes(self, datamodule: Any) -> int:
        if self.attack != "label_flip":
            return 0
        num_classes = self.num_classes if self.num_classes is not None else getattr(datamodule, "num_classes", None)
        if num_classes is None:
            raise InvalidArgumentError(
                "num_classes", None, "set for attack='label_flip' when the datamodule has no `num_classes`"
            )
        return int(num_classes)

    @override
    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        self.malicious_clients(trainer)
        self._sampled = [cid for cid in round_ctx.client_ids if cid in self._malicious]
        self._held = set()

    @override
    def on_client_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        if self.attack == "label_flip" and client_ctx.client_id in self._malicious:
            client_ctx.batch_transforms.append(LabelFlip(self._label_classes(trainer.datamodule)))

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        if self.attack != "label_flip" and update.client_id in self._malicious:
            update.held = True
            self._held.add(update.client_id)

    @override
    def on_clients_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        held: list[ClientUpdate],
    ) -> None:
        if self.attack == "label_flip":
            return
        mine = [update for update in held if update.client_id in self._held]
        global_params = round_ctx.global_params
        names = [n for n, p in pl_module.named_parameters() if p.requires_grad and p.is_floating_point()]
        deltas = {u.client_id: {n: u.params[n] - global_params[n] for n in names} for u in mine}
        if self.attack == "alie":
            attacked = self._alie(round_ctx, deltas)
        else:
            attacked = {cid: self._attack_one(trainer, round_ctx, cid, delta) for cid, delta in deltas.items()}
        for update in mine:
            for name, delta in attacked[update.client_id].items():
                base = global_params[name]
                update.params[name] = base + delta.to(device=base.device, dtype=base.dtype)

    def _attack_one(
        self, trainer: FederatedTrainerView, round_ctx: RoundContext, client_id: int, delta: StateDict
    ) -> StateDict:
        if self.attack == "sign_flip":
            return sign_flip(delta, 1.0 if self.scale is None else self.scale)
        if self.attack == "scale":
            server_lr = float(getattr(trainer.aggregator, "server_lr", 1.0))
            gamma = len(round_ctx.client_ids) / server_lr if self.scale is None else self.scale
            return scale_update(delta, gamma)
        seed = derive_seed(trainer.federation_state.seed, "attack", round_ctx.round_idx, client_id)
        return gaussian_update(delta, self.noise_std, torch.Generator().manual_seed(seed))

    def _alie(self, round_ctx: RoundContext, deltas: dict[int, StateDict]) -> dict[int, StateDict]:
        """Every rank's attackers' honest updates, in round order, turned into the one malicious update."""
        everyone = deltas
        if distributed.is_distributed():
            local = {cid: {n: t.detach().cpu() for n, t in delta.items()} for cid, delta in deltas.items()}
            everyone = {cid: delta for share in distributed.all_gather_object(local) for cid, delta in share.items()}
        if not everyone:
            return {}
        position = {cid: i for i, cid in enumerate(round_ctx.client_ids)}
        ordered = [everyone[cid] for cid in sorted(everyone, key=position.__getitem__)]
        z = alie_z(len(round_ctx.client_ids), len(ordered)) if self.z is None else self.z
        malicious = alie_update(ordered, z)
        return dict.fromkeys(deltas, malicious)

    @override
    def on_round_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        metrics: dict[str, float],
    ) -> None:
        metrics["attack/malicious_sampled"] = float(len(self._sampled))

    @override
    def summary_entries(self, trainer: FederatedTrainerView) -> dict[str, Any]:
        settings = {"scale": self.scale, "noise_std": self.noise_std, "z": self.z, "num_classes": self.num_classes}
        return {
            "attack": {
                "attack": self.attack,
                "fraction": self.fraction,
                **settings,
                "malicious_clients": self.malicious_clients(trainer),
            }
        }


__all__ = ["ATTACKS", "MaliciousClients"]
