"""Datasets generated offline from a seed: MNIST-1D and the FedProx Synthetic(alpha, beta) family."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_bool, check_int, check_real
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.partitioners import NaturalIdPartitioner
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.sharing import DataSharing
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset


@contextmanager
def _restored_global_rngs() -> Iterator[None]:
    # mnist1d seeds Python's and NumPy's global generators; restoring them keeps the caller's seeding intact.
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


class MNIST1DFederated(FederatedDataModule):
    """MNIST-1D (Greydanus, 2020): ten 1-D digit templates, randomly padded, scaled, translated, sheared and
    noised into length-40 sequences; inputs ``[1, 40]`` (channel first, for 1-D CNNs), 10 balanced classes.

    Generated offline by the ``mnist1d`` package with its default settings except ``num_samples`` and the seed
    (``seed``); the train/test split is mnist1d's (80 % / 20 %).

    Args:
        partitioner: Splits the training set among clients.
        num_samples: Examples generated in total (train + test); a multiple of 10 keeps classes balanced.
        batch_size, eval_batch_size, client_test_fraction, client_test_size, val_fraction, num_workers, seed,
            sharing, evaluation_split, drop_last, pin_memory, persistent_workers, batch_format, batch_keys: As in
            :class:`FederatedDataModule`; ``seed`` also seeds the generator.
    """

    num_classes = 10

    def __init__(
        self,
        partitioner: Partitioner,
        num_samples: int = 5000,
        batch_size: int = 32,
        eval_batch_size: int = 256,
        client_test_fraction: float = 0.2,
        client_test_size: int | None = None,
        val_fraction: float = 0.0,
        num_workers: int = 0,
        seed: int = 0,
        sharing: DataSharing | None = None,
        evaluation_split: Literal["test", "validation"] = "test",
        drop_last: bool = False,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        batch_format: Literal["tuple", "dict"] = "tuple",
        batch_keys: Sequence[str] = ("image", "label"),
    ) -> None:
        # mnist1d draws num_samples // 10 examples per class and keeps 80 % for training.
        check_int("num_samples", num_samples, minimum=20)
        super().__init__(
            partitioner,
            batch_size,
            eval_batch_size,
            client_test_fraction,
            client_test_size,
            val_fraction,
            num_workers,
            seed,
            sharing,
            evaluation_split,
            drop_last=drop_last,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            batch_format=batch_format,
            batch_keys=batch_keys,
        )
        self.num_samples = num_samples

    @override
    def _load_datasets(self) -> tuple[TensorClassificationDataset, TensorClassificationDataset]:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = self.num_samples
        args.seed = self.seed
        with _restored_global_rngs():
            data = make_dataset(args)
        train, test = (
            TensorClassificationDataset(
                torch.as_tensor(data[x], dtype=torch.float32).unsqueeze(1), torch.as_tensor(data[y], dtype=torch.int64)
            )
            for x, y in (("x", "y"), ("x_test", "y_test"))
        )
        return train, test


def synthetic_fedprox(
    alpha: float, beta: float, num_clients: int, dimension: int, num_classes: int, iid: bool, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Draws the Synthetic(alpha, beta) data of FedProx (Li et al., MLSys 2020, arXiv:1812.06127, §5.1).

    Client ``k`` has ``floor(LogNormal(4, 2)) + 50`` examples (LEAF's power-law sizes). Its model is
    ``W_k ~ N(u_k, 1)``, ``b_k ~ N(u_k, 1)`` with ``u_k ~ N(0, alpha)``; its inputs are ``x ~ N(v_k, Sigma)`` with
    ``v_k ~ N(B_k, 1)``, ``B_k ~ N(0, beta)`` and diagonal ``Sigma_jj = j^-1.2``; labels are
    ``argmax(softmax(W_k x + b_k))``. ``alpha`` and ``beta`` are standard deviations, as in the reference generator:
    alpha controls how much local models differ, beta how much local inputs differ. ``iid`` gives every client the
    same ``W, b ~ N(0, 1)`` and ``v_k = 0``.

    Returns:
        float32 inputs ``[N, dimension]``, int64 labels ``[N]``, int64 client ids ``[N]`` (client 0's first).
    """
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + 50
    scales = np.arange(1, dimension + 1, dtype=np.float64) ** -0.6  # standard deviations: sqrt(j^-1.2)
    model_means, input_centres = rng.normal(0, alpha, num_clients), rng.normal(0, beta, num_clients)
    shared_w, shared_b = rng.normal(0, 1, (dimension, num_classes)), rng.normal(0, 1, num_classes)
    inputs, labels = [], []
    for client, size in enumerate(sizes):
        if iid:
            weights, bias, centre = shared_w, shared_b, np.zeros(dimension)
        else:
            weights = rng.normal(model_means[client], 1, (dimension, num_classes))
            bias = rng.normal(model_means[client], 1, num_classes)
            centre = rng.normal(input_centres[client], 1, dimension)
        x = centre + rng.standard_normal((size, dimension)) * scales
        inputs.append(x)
        labels.append(np.argmax(x @ weights + bias, axis=1))  # softmax is monotone, so argmax of the logits
    clients = np.repeat(np.arange(num_clients), sizes)
    return (
        torch.as_tensor(np.concatenate(inputs), dtype=torch.float32),
        torch.as_tensor(np.concatenate(labels), dtype=torch.int64),
        torch.as_tensor(clients, dtype=torch.int64),
    )


class SyntheticFederated(FederatedDataModule):
    """Synthetic(alpha, beta) of FedProx (Li et al., MLSys 2020, arXiv:1812.06127): naturally non-IID clients of a
    multinomial logistic regression task; inputs ``[dimension]`` (60), ``num_classes`` (10) classes. See
    :func:`synthetic_fedprox`.

    Each generated device is one client (a :class:`NaturalIdPartitioner` is used, no partitioner argument). A
    client's test split is held out from its own data (``client_test_fraction``, default 20 %); there is no other
    test data, so the global test set is the union of the client test splits, as in FedProx's evaluation.

    Args:
        alpha: Spread of the local models (0 = nearly identical).
        beta: Spread of the local input distributions (0 = nearly identical).
        num_clients: Number of generated devices (clients).
        dimension: Input dimension.
        num_classes: Number of classes.
        iid: Draw every client from the same model and input distribution (Synthetic-IID).
        seed: Seed of the generator and of the holdout draws.
        batch_size, eval_batch_size, client_test_fraction, client_test_size, val_fraction, num_workers, sharing,
            evaluation_split, drop_last, pin_memory, persistent_workers, batch_format, batch_keys: As in
            :class:`FederatedDataModule`.
    """

    num_classes = 10

    def __init__(
        self,
        alpha: float = 1.0,
        beta: float = 1.0,
        num_clients: int = 30,
        dimension: int = 60,
        num_classes: int = 10,
        iid: bool = False,
        seed: int = 0,
        batch_size: int = 32,
        eval_batch_size: int = 256,
        client_test_fraction: float = 0.2,
        client_test_size: int | None = None,
        val_fraction: float = 0.0,
        num_workers: int = 0,
        sharing: DataSharing | None = None,
        evaluation_split: Literal["test", "validation"] = "test",
        drop_last: bool = False,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        batch_format: Literal["tuple", "dict"] = "tuple",
        batch_keys: Sequence[str] = ("image", "label"),
    ) -> None:
        check_real("alpha", alpha, minimum=0.0)
        check_real("beta", beta, minimum=0.0)
        check_int("num_clients", num_clients, minimum=1)
        check_int("dimension", dimension, minimum=1)
        check_int("num_classes", num_classes, minimum=2)
        check_bool("iid", iid)
        if client_test_fraction == 0 and client_test_size is None:
            raise ValueError(
                "`client_test_fraction` must be > 0 (or `client_test_size` set); got 0: SyntheticFederated's global "
                "test set is the union of the client test splits."
            )
        self.num_classes = num_classes
        super().__init__(
            NaturalIdPartitioner(num_clients),
            batch_size,
            eval_batch_size,
            client_test_fraction,
            client_test_size,
            val_fraction,
            num_workers,
            seed,
            sharing,
            evaluation_split,
            drop_last=drop_last,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            batch_format=batch_format,
            batch_keys=batch_keys,
        )
        self.alpha, self.beta, self.dimension, self.iid = float(alpha), float(beta), dimension, iid
        self._client_of_example: Tensor | None = None

    @override
    def _load_datasets(self) -> tuple[TensorClassificationDataset, None]:
        inputs, labels, clients = synthetic_fedprox(
            self.alpha, self.beta, self.num_clients, self.dimension, self.num_classes, self.iid, self.seed
        )
        self._client_of_example = clients
        return TensorClassificationDataset(inputs, labels), None

    @override
    def _natural_ids(self) -> Tensor | None:
        return self._client_of_example
