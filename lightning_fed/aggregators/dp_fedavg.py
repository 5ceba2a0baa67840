"""DP-FedAvg: federated averaging with client-level differential privacy, optionally with adaptive clipping."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_fed.aggregation import Aggregator
from lightning_fed.aggregators.privacy_accounting import check_accounting, client_level_epsilon
from lightning_fed.checks import InvalidArgumentError, check_bool, check_real
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.engine import UniformClientSampler
from lightning_fed.functional.dp import clip_update, gaussian_noise, next_clip_norm, update_noise_multiplier
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.utilities.seeding import derive_seed

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

EPSILON_KEY = "privacy/epsilon"
CLIPPED_KEY = "privacy/clipped_fraction"
CLIP_NORM_KEY = "privacy/clip_norm"
NOISE_STD_KEY = "privacy/noise_std"


class DPFedAvg(Aggregator):
    r"""DP-FedAvg with fixed or adaptive clipping, and its privacy accounting.

    McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018,
    arXiv:1710.06963 (DP-FedAvg); Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
    Clipping", NeurIPS 2021, arXiv:1905.03871, Algorithm 1 (adaptive clipping).

    .. math::
        w_g \leftarrow w_g + \frac{\eta_s}{m}\Big(\sum_{k \in \mathcal{S}_t}
        \Delta_k \min\big(1, S / \lVert\Delta_k\rVert_2\big) + \mathcal{N}(0, \sigma_\Delta^2 S^2 I)\Big),
        \qquad \Delta_k = w_k - w_g

    over the round's accepted clients :math:`\mathcal{S}_t`, with :math:`\sigma_\Delta = z` for a fixed clip norm.
    With ``adaptive_clipping`` the clip norm follows :math:`S \leftarrow S \exp(-\eta_S(\tilde b - \gamma))`, where
    :math:`\tilde b` is the fraction of clients whose update was *not* clipped, noised with
    :math:`\mathcal{N}(0, \sigma_b^2)` before dividing by :math:`m`, and
    :math:`\sigma_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}` so that both releases together cost what one Gaussian
    release with multiplier :math:`z` costs (see :mod:`lightning_fed.functional.dp`).

    Conventions:
        * :math:`\Delta_k` covers every floating-point **parameter** as one vector. Floating-point buffers (BatchNorm
          running statistics) are averaged uniformly over the accepted clients **without clipping or noise**, so
          they are not covered by the guarantee: use a model without BatchNorm (e.g. GroupNorm) when it matters.
          Integer buffers are copied from the last accepted client.
        * Uniform weights and a **fixed denominator**: the sum is divided by the expected number of clients
          :math:`m` (the sampler's ``clients_per_round``), never by the number that reported, as in the paper. A
          rejected (non-finite) client is dropped before clipping and counts as a zero update, which keeps the
          sensitivity at :math:`S`. Noise is added even when every client was rejected (returning :math:`w_g`
          unchanged would reveal it), unless :math:`z = 0`.
        * The noise is drawn from a generator seeded with ``(run seed, round)`` (:func:`~lightning_fed.utilities.seeding
          .derive_seed`): a resumed run draws the same noise, and under ``strategy="ddp"`` every rank adds the same
          noise once to the reduced sum, so all ranks hold the same model. The clip norm and the rounds accounted
          are server state in :meth:`state_dict`.
        * Accounting (``delta`` set): ε at ``delta`` after each round, by ``dp-accounting``'s RDP accountant for
          fixed-size sampling without replacement and one client's data replaced (the sampler's behaviour; see
          :mod:`lightning_fed.aggregators.privacy_accounting`), logged as ``privacy/epsilon``. It needs :math:`z > 0`,
          the trainer's :class:`~lightning_fed.engine.sampling.UniformClientSampler` and no callback that sends client
          data to the server outside the noised sum (``FedCallback.sends_client_data_to_server``: SCAFFOLD, FedCurv,
          FedAMP, rFedAvg, WeightDivergence); ``delta=None`` trains without accounting and accepts any of them.
        * Logs ``privacy/clipped_fraction`` (the true fraction of accepted clients whose update was clipped, a
          diagnostic outside the guarantee), ``privacy/clip_norm`` (the round's :math:`S`) and
          ``privacy/noise_std`` (:math:`\sigma_\Delta S / m`, the noise on each coordinate of the averaged update).
        * Andrew et al. set :math:`\sigma_b = m/20`, the default of ``clipped_count_stddev``.

    Args:
        clip_norm: :math:`S`, or its starting value with ``adaptive_clipping``.
        noise_multiplier: :math:`z \ge 0`; 0 clips without noise (no privacy; needs ``delta=None``).
        adaptive_clipping: Whether :math:`S` follows Andrew et al.'s geometric update.
        target_quantile: :math:`\gamma`, the fraction of updates that should be left unclipped.
        clip_lr: :math:`\eta_S`, the step of the geometric update.
        clipped_count_stddev: :math:`\sigma_b`; ``None`` uses :math:`m/20`. Must exceed :math:`z/2`.
        delta: The δ at which ε is reported; ``None`` turns accounting off.
        server_lr: :math:`\eta_s`; 1 applies the noised mean update as it is.
    """

    # In DP-FedAvg each client clips its own update with the round's clip norm S (sent down: with adaptive clipping
    # it changes every round) and only sums reach the server, as secure aggregation allows; the rounds accounted
    # stay at the server.
    broadcast_keys = ("clip_norm",)
    round_state_is_sum = True

    def __init__(
        self,
        clip_norm: float = 1.0,
        noise_multiplier: float = 1.0,
        adaptive_clipping: bool = False,
        target_quantile: float = 0.5,
        clip_lr: float = 0.2,
        clipped_count_stddev: float | None = None,
        delta: float | None = 1e-5,
        server_lr: float = 1.0,
    ) -> None:
        self.clip_norm = check_real("clip_norm", clip_norm, minimum=0.0, exclusive_minimum=True)
        self.noise_multiplier = check_real("noise_multiplier", noise_multiplier, minimum=0.0)
        self.adaptive_clipping = check_bool("adaptive_clipping", adaptive_clipping)
        self.target_quantile = check_real("target_quantile", target_quantile, minimum=0.0, maximum=1.0)
        self.clip_lr = check_real("clip_lr", clip_lr, minimum=0.0)
        self.clipped_count_stddev = check_real(
            "clipped_count_stddev", clipped_count_stddev, minimum=0.0, allow_none=True
        )
        self.delta = check_real(
            "delta", delta, minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True, allow_none=True
        )
        self.server_lr = check_real("server_lr", server_lr, minimum=0.0, exclusive_minimum=True)
        if self.delta is not None and self.noise_multiplier == 0.0:
            raise InvalidArgumentError(
                "noise_multiplier", noise_multiplier, "> 0 when privacy is accounted; pass `delta=None` to clip only"
            )
        if adaptive_clipping and clipped_count_stddev is not None:
            _check_count_stddev(self.noise_multiplier, self.clipped_count_stddev)
        # Server state (state_dict): the current clip norm and the rounds released so far.
        self._current_clip_norm = self.clip_norm
        self._rounds = 0
        # Set by configure (the trainer calls it through setup).
        self._seed: int | None = None
        self._num_clients = 0
        self._expected_clients = 0
        self._parameter_names: frozenset[str] = frozenset()
        self._count_stddev = 0.0
        self._update_multiplier = self.noise_multiplier
        # The round's bookkeeping; sums and counts are declared round state in reset.
        self._round_idx = 0
        self._round_clip_norm = self.clip_norm
        self._global: StateDict = {}
        self._update_sum: StateDict = {}
        self._buffer_sum: StateDict = {}
        self._num_accepted = 0
        self._num_unclipped = 0
        self._epsilon: float | None = None

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        """Refuses, when privacy is accounted, a sampler or callbacks that the accounting does not cover."""

        if self.delta is not None:
            if type(trainer.sampler) is not UniformClientSampler:
                raise InvalidArgumentError(
                    "trainer.sampler",
                    type(trainer.sampler).__name__,
                    "UniformClientSampler (the sampling the privacy accounting assumes) with DPFedAvg(delta=...)",
                )
            # Read by attribute: trainer.callbacks also holds plain Lightning callbacks, which send nothing.
            leaking = [
                type(cb).__name__ for cb in trainer.callbacks if getattr(cb, "sends_client_data_to_server", False)
            ]
            if leaking:
                raise InvalidArgumentError(
                    "trainer.callbacks",
                    leaking,
                    "free of callbacks that send client data to the server without noise"
                    " (`sends_client_data_to_server = True`) when DPFedAvg accounts privacy (remove them, or pass"
                    " `delta=None` to DPFedAvg to train without accounting)",
                )

    @override
    def setup(self, trainer: FederatedTrainerView) -> None:
        """Reads the run seed, the federation's size, the sample size and the module's parameter names."""
        num_clients = trainer.datamodule.num_clients
        self.configure(
            seed=trainer.federation_state.seed,
            num_clients=num_clients,
            clients_per_round=trainer.sampler.num_sampled(num_clients),
            parameter_names=[name for name, _ in trainer.lightning_module.named_parameters()],
        )

    def configure(self, seed: int, num_clients: int, clients_per_round: int, parameter_names: Collection[str]) -> None:
        """Sets what :meth:`setup` reads from the trainer (callable directly when no trainer runs the rounds).

        Args:
            seed: The run seed, from which each round's noise seed is derived.
            num_clients: :math:`N`, the registered clients.
            clients_per_round: :math:`m`, the expected (with this sampler: exact) number of clients per round.
            parameter_names: The state-dict names of the model's parameters (the rest are buffers).
        """
        if self.delta is not None:
            check_accounting(self.noise_multiplier, num_clients, clients_per_round, self.delta)
        self._seed = seed
        self._num_clients = num_clients
        self._expected_clients = clients_per_round
        self._parameter_names = frozenset(parameter_names)
        if self.adaptive_clipping:
            stddev = self.clipped_count_stddev
            self._count_stddev = clients_per_round / 20.0 if stddev is None else stddev
            _check_count_stddev(self.noise_multiplier, self._count_stddev)
            self._update_multiplier = update_noise_multiplier(self.noise_multiplier, self._count_stddev)

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        if self._seed is None:
            raise RuntimeError("DPFedAvg.setup (or configure) must run before the first round.")
        self._round_idx = round_ctx.round_idx
        self._round_clip_norm = self._current_clip_norm
        self._global = global_params
        self._epsilon = None
        floats = self.float64_zeros(global_params)
        params = {name: zeros for name, zeros in floats.items() if name in self._parameter_names}
        buffers = {name: zeros for name, zeros in floats.items() if name not in self._parameter_names}
        self.add_round_state("_update_sum", params, reduce="sum")
        self.add_round_state("_buffer_sum", buffers, reduce="sum")
        self.add_round_state("_num_accepted", 0, reduce="sum")
        self.add_round_state("_num_unclipped", 0, reduce="sum")

    @override
    def update(self, update: ClientUpdate) -> None:
        delta = {name: update.params[name].double() - self._global[name].double() for name in self._update_sum}
        clipped, norm = clip_update(delta, self._round_clip_norm)
        for name, total in self._update_sum.items():
            total.add_(clipped[name].to(total.device))
        for name, total in self._buffer_sum.items():
            total.add_(update.params[name].detach().double().to(total.device))
        self._num_accepted += 1
        self._num_unclipped += int(norm <= self._round_clip_norm)

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        assert self._seed is not None  # reset checked it
        clip_norm, m = self._round_clip_norm, self._expected_clients
        update_noise = gaussian_noise(self._update_sum, self._update_multiplier * clip_norm, self._generator("update"))
        new_params: StateDict = {}
        for name, old in global_params.items():
            if name in self._update_sum:
                mean_update = (self._update_sum[name] + update_noise[name]) / m
                new_params[name] = (old.double() + self.server_lr * mean_update).to(old.dtype)
            elif name in self._buffer_sum and self._num_accepted:
                new_params[name] = (self._buffer_sum[name] / self._num_accepted).to(old.dtype)
            else:
                new_params[name] = old.clone()
        if self.adaptive_clipping:
            count_noise = torch.randn((), generator=self._generator("count"), dtype=torch.float64).item()
            unclipped_fraction = (self._num_unclipped + self._count_stddev * count_noise) / m
            self._current_clip_norm = next_clip_norm(clip_norm, unclipped_fraction, self.target_quantile, self.clip_lr)
        self._rounds += 1
        if self.delta is not None:
            self._epsilon = client_level_epsilon(self.noise_multiplier, self._num_clients, m, self._rounds, self.delta)
        self._global = {}
        return new_params

    def _generator(self, purpose: str) -> torch.Generator:
        """A CPU generator for this round's ``purpose`` draws, seeded from (run seed, round) alone."""
        assert self._seed is not None
        return torch.Generator().manual_seed(derive_seed(self._seed, f"dp-fedavg/{purpose}", self._round_idx))

    @override
    def round_metrics(self) -> dict[str, float]:
        metrics = {
            CLIP_NORM_KEY: self._round_clip_norm,
            NOISE_STD_KEY: self._update_multiplier * self._round_clip_norm / self._expected_clients,
        }
        if self._num_accepted:
            metrics[CLIPPED_KEY] = 1.0 - self._num_unclipped / self._num_accepted
        if self._epsilon is not None:
            metrics[EPSILON_KEY] = self._epsilon
        return metrics

    @property
    def current_clip_norm(self) -> float:
        """The clip norm the next round will use."""
        return self._current_clip_norm

    @property
    def rounds_accounted(self) -> int:
        """Rounds released so far (with noise), which the privacy accounting composes."""
        return self._rounds

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"clip_norm": self._current_clip_norm, "rounds": self._rounds}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._current_clip_norm = float(state_dict["clip_norm"])
        self._rounds = int(state_dict["rounds"])

    @override
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(clip_norm={self.clip_norm}, noise_multiplier={self.noise_multiplier},"
            f" adaptive_clipping={self.adaptive_clipping}, target_quantile={self.target_quantile},"
            f" clip_lr={self.clip_lr}, clipped_count_stddev={self.clipped_count_stddev}, delta={self.delta},"
            f" server_lr={self.server_lr})"
        )


def _check_count_stddev(noise_multiplier: float, count_stddev: float) -> None:
    if noise_multiplier > 0 and not 2.0 * count_stddev > noise_multiplier:
        raise InvalidArgumentError(
            "clipped_count_stddev",
            count_stddev,
            f"> noise_multiplier / 2 = {noise_multiplier / 2} (the count's noise must leave some for the update)",
        )


__all__ = ["DPFedAvg"]
