r"""The transformations of simulated attacks on federated learning: labels flipped, updates replaced.

An update-space attack acts on a client's update :math:`\Delta_k = w_k - w_g` (its local model minus the round's
global model), given here as a name -> tensor mapping of the entries it attacks; the client then sends
:math:`w_g + \Delta'_k`. The functions are pure: they return new tensors and never edit their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import torch
from torch import Tensor

from lightning_fed.functional.state_dict import StateDict


def flip_labels(labels: Tensor, num_classes: int) -> Tensor:
    r"""Label flipping: every class label :math:`y \in \{0, \dots, C-1\}` becomes :math:`C - 1 - y`.

    The data-poisoning attack of Fang et al., "Local Model Poisoning Attacks to Byzantine-Robust Federated
    Learning", USENIX Security 2020 (arXiv:1911.11815), among others: each class is mapped to another one (the
    middle class of an odd :math:`C` maps to itself), so a malicious client trains on consistently wrong labels.

    Args:
        labels: Integer class labels in ``[0, num_classes)``.
        num_classes: :math:`C`.
    """
    return (num_classes - 1) - labels


def sign_flip(delta: Mapping[str, Tensor], scale: float = 1.0) -> StateDict:
    r"""Sign flipping: :math:`\Delta' = -s\,\Delta`, the client pushes the model against its own descent direction.

    Li et al., "RSA: Byzantine-Robust Stochastic Aggregation Methods for Distributed Learning from Heterogeneous
    Datasets", AAAI 2019 (arXiv:1811.03761), whose sign-flipping attack scales the flipped value (:math:`s`).
    """
    return {name: tensor * -scale for name, tensor in delta.items()}


def scale_update(delta: Mapping[str, Tensor], gamma: float) -> StateDict:
    r"""Scaled update (model replacement): :math:`\Delta' = \gamma\,\Delta`.

    Bagdasaryan et al., "How To Backdoor Federated Learning", AISTATS 2020 (arXiv:1807.00459), Eq. 3: an attacker
    who wants the global model replaced by its own model :math:`X` submits :math:`\gamma (X - G^t) + G^t` with
    :math:`\gamma = n / \eta` (:math:`n` clients per round, server learning rate :math:`\eta`), so that the averaging
    step's :math:`\frac{\eta}{n}` cancels and, with the honest updates nearly cancelling each other, the new global
    model is :math:`X`.
    """
    return {name: tensor * gamma for name, tensor in delta.items()}


def gaussian_update(delta: Mapping[str, Tensor], std: float, generator: torch.Generator) -> StateDict:
    r"""Gaussian noise: the update is replaced by :math:`\Delta' \sim \mathcal{N}(0, \sigma^2 I)`.

    The random Byzantine update of Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017 (arXiv:1703.02757), and of Li et al., AAAI 2019 (arXiv:1811.03761). The noise is
    drawn on the CPU from ``generator`` in float32, entry by entry in the mapping's order, and then moved to each
    entry's device and dtype, so it does not depend on where the client trained.
    """
    noise = {}
    for name, tensor in delta.items():
        draw = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * std
        noise[name] = draw.to(device=tensor.device, dtype=tensor.dtype)
    return noise


def alie_z(num_clients: int, num_malicious: int) -> float:
    r"""The largest safe deviation :math:`z` of "a little is enough", for :math:`n` clients of which :math:`f` attack.

    Baruch et al., "A Little Is Enough: Circumventing Defenses For Distributed Learning", NeurIPS 2019
    (arXiv:1902.06156), Sec. 4: the attackers need :math:`s = \lfloor n/2 + 1 \rfloor - f` honest clients whose
    values lie farther from the mean than theirs, so with normally distributed honest values

    .. math::
        z = \Phi^{-1}\!\left(\frac{n - s}{n}\right),

    :math:`\Phi` the standard normal CDF. When the attackers alone are a majority (:math:`s \le 0`) the formula has
    no finite value; :math:`s` is then taken as 1 (one honest supporter), and a lone attacker (:math:`n = 1`) has
    :math:`z = 0`.

    Args:
        num_clients: :math:`n`, the clients whose updates are aggregated (at least 1).
        num_malicious: :math:`f`, the attackers among them (at least 1, at most :math:`n`).

    Raises:
        ValueError: If the counts are out of range.
    """
    if num_clients < 1 or not 1 <= num_malicious <= num_clients:
        raise ValueError(f"need 1 <= f <= n; got n={num_clients}, f={num_malicious}")
    supporters = max(math.floor(num_clients / 2 + 1) - num_malicious, 1)
    probability = (num_clients - supporters) / num_clients
    if probability <= 0.0:
        return 0.0
    return NormalDist().inv_cdf(probability)


def alie_update(deltas: Sequence[Mapping[str, Tensor]], z: float) -> StateDict:
    r"""The malicious update of "a little is enough": :math:`\Delta' = \mu - z\,\sigma`, coordinate-wise.

    Baruch et al., NeurIPS 2019 (arXiv:1902.06156), Algorithm 3: :math:`\mu_j` and :math:`\sigma_j` are the mean
    and standard deviation over clients of coordinate :math:`j` of the honest updates the attackers computed
    themselves (``deltas``); every attacker sends the same :math:`\Delta'`. :math:`\sigma` is the population standard
    deviation (divided by :math:`f`, so that one attacker gives :math:`\sigma = 0`), computed in float64 and cast
    back to each entry's dtype.

    Args:
        deltas: The attackers' honest updates, one mapping per attacker, all with the same names and shapes.
        z: The deviation in standard deviations (see :func:`alie_z`).
    """
    if not deltas:
        raise ValueError("alie_update needs at least one update")
    result = {}
    for name, first in deltas[0].items():
        stacked = torch.stack([delta[name].to(device=first.device, dtype=torch.float64) for delta in deltas])
        mean = stacked.mean(dim=0)
        std = stacked.std(dim=0, correction=0)
        result[name] = (mean - z * std).to(first.dtype)
    return result


__all__ = ["alie_update", "alie_z", "flip_labels", "gaussian_update", "scale_update", "sign_flip"]
