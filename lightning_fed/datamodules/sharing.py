"""Zhao et al.'s data sharing: a class-balanced global set G and a random α share of it for every client.

Source: Zhao, Li, Lai, Suda, Civin, Chandra, "Federated Learning with Non-IID Data" (arXiv:1806.00582), §4.2: "A
globally shared dataset G that consists of a uniform distribution over classes is centralized in the cloud. At the
initialization stage of FedAvg, the warm-up model trained on G and a random α portion of G are distributed to each
client", with β = ‖G‖/‖D‖ × 100 %, D the total data of the clients.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_fed.callbacks.warmup import SharedDataWarmup
from lightning_fed.checks import check_int, check_real
from lightning_fed.datamodules._splits import RaggedIndex
from lightning_fed.functional.partition_stats import earth_movers_distance, label_histogram
from lightning_fed.utilities.seeding import derive_seed


@dataclass
class DataSharing:
    """Settings of the data-sharing strategy, e.g. ``data.init_args.sharing: {beta: 0.05, alpha: 0.5}`` in YAML.

    The datamodule holds out G and merges the shares; the warm-up runs only where
    :class:`~lightning_fed.callbacks.warmup.SharedDataWarmup` is listed in ``trainer.callbacks`` (explicit, so a
    run's YAML shows every training phase); the datamodule warns at setup when ``warmup_epochs > 0`` and it is not.

    Args:
        beta: β = |G| / |D|, the global set's size relative to the clients' data D (all of it: training and
            client-test splits), in [0, 1). 0 shares nothing (G is empty).
        alpha: Fraction of G each client receives, in [0, 1]; each share is ``round(α · |G|)`` examples.
        warmup_epochs: Epochs of central training on G by
            :class:`~lightning_fed.callbacks.warmup.SharedDataWarmup`; 0 starts FL from the random initialisation.
        warmup_lr: Learning rate of the warm-up instead of the trainer optimizer's; ``None`` keeps it.
    """

    beta: float = 0.05
    alpha: float = 1.0
    warmup_epochs: int = 5
    warmup_lr: float | None = None

    def __post_init__(self) -> None:
        # Named as the YAML spells them, since the settings are nested under the datamodule's `sharing`.
        check_real("sharing.beta", self.beta, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        check_real("sharing.alpha", self.alpha, minimum=0.0, maximum=1.0)
        check_int("sharing.warmup_epochs", self.warmup_epochs, minimum=0)
        check_real("sharing.warmup_lr", self.warmup_lr, minimum=0.0, exclusive_minimum=True, allow_none=True)

    def encode(self) -> Tensor:
        """The settings as a tensor, for the datamodule's fingerprint."""
        lr = -1.0 if self.warmup_lr is None else float(self.warmup_lr)
        # Fixed-point (1e-9) so that the fingerprint, which hashes int64 values, tells settings apart.
        return torch.tensor([round(v * 1e9) for v in (self.beta, self.alpha, self.warmup_epochs, lr)])


def global_set_size(beta: float, pool_size: int) -> int:
    """``|G| = round(β · |D|)`` with ``|D| = pool_size − |G|``, i.e. ``round(β / (1 + β) · pool_size)``."""
    return math.floor(beta / (1.0 + beta) * pool_size + 0.5)


def hold_out_global_set(
    labels: Tensor, pool: Tensor, beta: float, num_classes: int, seed: int
) -> tuple[Tensor, Tensor]:
    """Draws the class-balanced global set G from ``pool``; returns (G, the rest of the pool).

    Every class gets ``|G| // C`` examples and the remainder goes one each to randomly chosen classes, so class
    counts differ by at most one. The draw is seeded by ``derive_seed(seed, "sharing", "global")``.

    Raises:
        ValueError: If a class has too few examples in the pool for its share of G.
    """
    size = global_set_size(beta, pool.numel())
    generator = torch.Generator().manual_seed(derive_seed(seed, "sharing", "global"))
    per_class = torch.full((num_classes,), size // num_classes, dtype=torch.int64)
    per_class[torch.randperm(num_classes, generator=generator)[: size % num_classes]] += 1
    pool_labels = labels[pool]
    chosen = []
    for cls in range(num_classes):
        members = pool[pool_labels == cls]
        if members.numel() < per_class[cls]:
            # The pool is what the global validation set left: when it took examples, `val_fraction` is a cause too.
            after_val = pool.numel() < labels.numel()
            where = "remain after `val_fraction`'s validation holdout" if after_val else "are in the data"
            fix = f"lower `sharing.beta` ({beta})" + (" or `val_fraction`" if after_val else "")
            raise ValueError(
                f"A class-balanced G of {size} examples needs {int(per_class[cls])} of class {cls}, but "
                f"{members.numel()} {where}: {fix}."
            )
        chosen.append(members[torch.randperm(members.numel(), generator=generator)[: int(per_class[cls])]])
    shared = torch.sort(torch.cat(chosen)).values
    keep = torch.ones(labels.numel(), dtype=torch.bool)
    keep[shared] = False
    return shared, pool[keep[pool]]


def hold_out_shares(
    labels: Tensor, pool: Tensor, sharing: DataSharing | None, num_classes: int, num_clients: int, seed: int
) -> tuple[Tensor | None, RaggedIndex | None, Tensor]:
    """(G, every client's share of G, the pool without G), G drawn from ``pool`` before it is partitioned.

    Drawing G first keeps it disjoint from every client's own data; see :func:`hold_out_global_set` and
    :func:`draw_shares`. Without ``sharing`` it is ``(None, None, pool)``.
    """
    if sharing is None:
        return None, None, pool
    shared, rest = hold_out_global_set(labels, pool, sharing.beta, num_classes, seed)
    return shared, draw_shares(shared, num_clients, sharing.alpha, seed), rest


def draw_shares(shared: Tensor, num_clients: int, alpha: float, seed: int) -> RaggedIndex:
    """Client k's share: ``round(α · |G|)`` examples of G drawn without replacement, seeded by (seed, k)."""
    size = math.floor(alpha * shared.numel() + 0.5)
    parts = []
    for client_id in range(num_clients):
        generator = torch.Generator().manual_seed(derive_seed(seed, "sharing", "share", client_id))
        parts.append(torch.sort(shared[torch.randperm(shared.numel(), generator=generator)[:size]]).values)
    return RaggedIndex.from_parts(parts)


def sharing_statistics(
    labels: Tensor, clients: RaggedIndex, shared: Tensor, shares: RaggedIndex, num_classes: int
) -> dict[str, float]:
    """|G|, mean share size and the size-weighted mean EMD of the clients before and after merging their shares.

    Both EMDs are taken against the same reference, the class distribution of the clients' local training splits
    (the population :meth:`FederatedDataModule.client_emd` uses), so they are comparable.
    """
    before = label_histogram(labels, clients.parts(), num_classes)
    after = before + label_histogram(labels, shares.parts(), num_classes)
    reference = before.sum(dim=0)
    return {
        "sharing/global_set_size": float(shared.numel()),
        "sharing/share_size_mean": float(shares.lengths().double().mean()) if len(shares) else 0.0,
        "sharing/emd_before": _weighted_mean(earth_movers_distance(before, reference), before.sum(dim=1)),
        "sharing/emd_after": _weighted_mean(earth_movers_distance(after, reference), after.sum(dim=1)),
    }


def warn_without_warmup(sharing: DataSharing | None, trainer: Any) -> None:
    """Warns when ``sharing`` asks for a warm-up that no callback of ``trainer`` (``None``: not attached) will run."""
    if sharing is None or sharing.warmup_epochs == 0 or trainer is None:
        return

    if not any(isinstance(callback, SharedDataWarmup) for callback in trainer.callbacks):
        warnings.warn(
            f"`sharing.warmup_epochs` is {sharing.warmup_epochs} but the trainer has no SharedDataWarmup "
            "callback, so FL starts from the random initialisation: add "
            "`lightning_fed.callbacks.warmup.SharedDataWarmup` to `trainer.callbacks`, or set warmup_epochs: 0.",
            UserWarning,
            stacklevel=2,
        )


def _weighted_mean(values: Tensor, weights: Tensor) -> float:
    weights = weights.double()
    return float((values.nan_to_num(0.0) * weights).sum() / weights.sum().clamp(min=1.0))
