r"""Client-level privacy accounting for DP-FedAvg, delegated to Google's ``dp-accounting`` library (RDP accountant).

What is accounted, and under which assumption:

* **Sampling.** :class:`~lightning_fed.engine.sampling.UniformClientSampler` draws a fixed number :math:`m` of distinct
  clients uniformly at random out of :math:`N` each round, independently of earlier rounds. That is *sampling
  without replacement*, not the Poisson sampling of McMahan et al. (arXiv:1710.06963), so the bound used is the one
  for sampling without replacement: Wang, Balle, Kasiviswanathan, "Subsampled Rényi Differential Privacy and
  Analytical Moments Accountant", AISTATS 2019, arXiv:1808.00087, Theorem 27, as ``dp-accounting`` implements it
  (``SampledWithoutReplacementDpEvent``). It holds only for that sampler, so DP-FedAvg refuses any other.
* **Neighbouring relation.** With a fixed number of clients the neighbouring federations are those that differ in
  **one client's data replaced** (``REPLACE_ONE``): :math:`N` is public. Replacing a client changes the sum of
  clipped updates by up to :math:`2S`, so the Gaussian noise :math:`zS` gives the accountant a noise multiplier of
  :math:`z/2` (noise over sensitivity). ε is therefore larger than the add-or-remove-one ε of the paper for the same
  :math:`z`; the two are not comparable.
* **Composition.** One subsampled Gaussian release per round, composed over the rounds with Rényi DP and converted
  to :math:`(\varepsilon, \delta)` by the library. With adaptive clipping the clipped-count release and the update
  release together form one Gaussian release of multiplier :math:`z` (Andrew et al. 2021, arXiv:1905.03871,
  Theorem 1), so the same accounting applies.

Only the releases of the global model are covered: anything else computed from client data and sent to the server
(evaluation metrics, server sums of other algorithms) is outside the guarantee.
"""

from __future__ import annotations

from typing import Any

from lightning_fed.checks import check_int, check_real


def check_accounting(noise_multiplier: float, num_clients: int, clients_per_round: int, delta: float) -> None:
    """Raises for settings the accountant cannot give a finite ε for, naming the argument to change.

    Raises:
        InvalidArgumentError: If ``noise_multiplier <= 0``, ``delta`` is outside (0, 1), or the sample is empty or
            larger than the federation (sampling rate outside (0, 1]).
    """
    check_real("noise_multiplier", noise_multiplier, minimum=0.0, exclusive_minimum=True)
    check_real("delta", delta, minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True)
    check_int("num_clients", num_clients, minimum=1)
    check_int("clients_per_round", clients_per_round, minimum=1, maximum=num_clients)


def client_level_epsilon(
    noise_multiplier: float, num_clients: int, clients_per_round: int, rounds: int, delta: float
) -> float:
    """ε at ``delta`` after ``rounds`` rounds of DP-FedAvg with ``clients_per_round`` of ``num_clients`` sampled
    uniformly without replacement, one client's data replaced (see the module docstring).

    Args:
        noise_multiplier: :math:`z`, the noise standard deviation over the clip norm :math:`S` (for adaptive
            clipping, the effective :math:`z` of both releases).
        num_clients: :math:`N`, the registered clients.
        clients_per_round: :math:`m`, the clients sampled each round.
        rounds: Rounds released so far; 0 gives 0.
        delta: The target δ.

    Raises:
        InvalidArgumentError: See :func:`check_accounting`.
        ModuleNotFoundError: If ``dp-accounting`` is not installed (``pip install lightning-fed[privacy]``).
    """
    check_accounting(noise_multiplier, num_clients, clients_per_round, delta)
    check_int("rounds", rounds, minimum=0)
    if rounds == 0:
        return 0.0
    dp_accounting, rdp = _library()
    # Replacing one client moves the clipped sum by up to 2S: the noise zS is z/2 sensitivities.
    release = dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, clients_per_round, dp_accounting.GaussianDpEvent(noise_multiplier / 2.0)
    )
    accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(release, rounds))
    return float(accountant.get_epsilon(delta))


def _library() -> tuple[Any, Any]:
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "Privacy accounting needs Google's `dp-accounting` package: install the `privacy` extra"
            " (`pip install lightning-fed[privacy]`), or pass `delta=None` to DPFedAvg to train without accounting."
        ) from error
    return dp_accounting, rdp


__all__ = ["check_accounting", "client_level_epsilon"]
