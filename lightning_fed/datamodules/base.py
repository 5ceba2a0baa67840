"""The federated datamodule: one labelled dataset split into a global validation set, clients and client tests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_choice, check_instance, check_int, check_real
from lightning_fed.datamodules._splits import RaggedIndex
from lightning_fed.datamodules.fingerprint import check_fingerprint, layout_fingerprint
from lightning_fed.datamodules.layout import (
    Layout,
    assign_partitions,
    carve_validation,
    check_evaluation_labels,
    check_label_range,
    check_no_empty_client,
    extract_labels,
    hold_out_client_tests,
)
from lightning_fed.datamodules.loaders import index_loader
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.sharing import DataSharing, hold_out_shares, sharing_statistics, warn_without_warmup
from lightning_fed.engine.seeding import derive_seed
from lightning_fed.functional.partition_stats import earth_movers_distance, label_histogram


class FederatedDataModule(LightningDataModule, ABC):
    """Splits a labelled map-style dataset among clients for federated training.

    ``setup`` carves a label-stratified global validation set out of the pooled training data, partitions the rest
    among ``num_clients`` clients with ``partitioner``, and holds out a label-stratified test split from every
    client's partition, so each client is evaluated on its own distribution. Per-client state is two flat index
    tensors, so registering 10 000 clients costs little; loaders are built only for the client asked for.

    Subclasses set the class attribute (or instance attribute, before ``super().__init__``) ``num_classes`` and
    implement :meth:`_load_datasets` (an abstract method: a subclass without it cannot be instantiated); they may
    download in ``prepare_data``. To federate datasets you already hold, use :class:`DatasetFederated`.

    Args:
        partitioner: Splits the training indices among clients; its ``num_partitions`` is ``num_clients``.
        batch_size: Batch size of client training and of the pooled ``train_dataloader``.
        eval_batch_size: Batch size of the validation and test loaders.
        client_test_fraction: Fraction of every client's partition held out as its test split (``round(n * f)``,
            stratified by label, at least one training example kept); 0 disables it.
        client_test_size: Absolute per-client test size instead (e.g. 100); requires ``client_test_fraction=0``.
        val_fraction: Fraction of the pooled training data held out (stratified) as the global validation set,
            before partitioning; 0 means no validation (``val_dataloader`` returns ``[]``).
        num_workers: DataLoader worker processes; keep 0 for in-memory datasets, which gather in microseconds.
        seed: Seed of the validation and client-test draws and of ``train_dataloader``'s order. The partition's
            seed belongs to the partitioner.
        sharing: Zhao et al.'s data sharing (:class:`~lightning_fed.datamodules.sharing.DataSharing`): a
            class-balanced global set G is held out before partitioning and every client trains on its split
            merged with a seeded α share of G (``client_num_samples`` counts the share). ``None`` shares nothing.
        evaluation_split: What the test metrics measure. ``"test"`` (the default): the global test set and the
            clients' test splits. ``"validation"``, for choosing hyperparameters without touching test data: the
            global "test" set becomes the global validation set (needs ``val_fraction`` > 0; a seeded subset of it
            when it is larger than the test set), and every client's "test" split is held out from its *training*
            split, with the same ``client_test_fraction`` or ``client_test_size``; the clients' real test splits
            and the test set are then never evaluated. Metric names stay ``*/test_*`` so that one selection rule
            reads both modes.
    """

    num_classes: int

    def __init__(
        self,
        partitioner: Partitioner,
        batch_size: int = 32,
        eval_batch_size: int = 256,
        client_test_fraction: float = 0.2,
        client_test_size: int | None = None,
        val_fraction: float = 0.0,
        num_workers: int = 0,
        seed: int = 0,
        sharing: DataSharing | None = None,
        evaluation_split: Literal["test", "validation"] = "test",
    ) -> None:
        super().__init__()
        check_instance("partitioner", partitioner, Partitioner, "a Partitioner, e.g. IidPartitioner(num_partitions=10)")
        check_int("batch_size", batch_size, minimum=1)
        check_int("eval_batch_size", eval_batch_size, minimum=1)
        check_real("client_test_fraction", client_test_fraction, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        check_int("client_test_size", client_test_size, minimum=1, allow_none=True)
        if client_test_size is not None and client_test_fraction != 0:
            raise InvalidArgumentError(
                "client_test_size",
                client_test_size,
                f"None while `client_test_fraction` is {client_test_fraction}: set client_test_fraction=0 to hold "
                "out a fixed number per client",
            )
        check_real("val_fraction", val_fraction, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        check_int("num_workers", num_workers, minimum=0)
        check_int("seed", seed)
        check_instance("sharing", sharing, (DataSharing, type(None)), "a DataSharing or None")
        check_int("num_classes", getattr(self, "num_classes", None), minimum=1)
        self.evaluation_split = check_choice("evaluation_split", evaluation_split, ("test", "validation"))
        if evaluation_split == "validation" and val_fraction == 0:
            raise InvalidArgumentError(
                "val_fraction",
                val_fraction,
                "> 0 with evaluation_split='validation': the global validation set stands in for the test set",
            )
        self.partitioner = partitioner
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.client_test_fraction = float(client_test_fraction)
        self.client_test_size = client_test_size
        self.val_fraction = float(val_fraction)
        self.num_workers = num_workers
        self.seed = seed
        self.sharing = sharing
        self._layout: Layout | None = None
        self._expected_fingerprint: str | None = None

    @property
    def num_clients(self) -> int:
        """Number of clients (the partitioner's ``num_partitions``)."""
        return self.partitioner.num_partitions

    @abstractmethod
    def _load_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Returns the (train, test) datasets.

        ``test`` may be ``None`` for data without a separate test set; the global test set is then the union of the
        clients' test splits.
        """

    def _natural_ids(self) -> Tensor | None:
        """Per-example natural client ids of the train dataset (e.g. LEAF users), for partitioners that use them."""
        return None

    @override
    def setup(self, stage: str | None = None) -> None:
        """Loads the data and splits it; later calls do nothing."""
        warn_without_warmup(self.sharing, getattr(self, "trainer", None))
        if self._layout is not None:
            return
        train, test = self._load_datasets()
        labels = extract_labels(train, "train")
        check_label_range(labels, self.num_classes)
        natural_ids = self._natural_ids()
        val, pool = carve_validation(labels, natural_ids, self.val_fraction, self.num_clients, self.seed)
        shared, shares, pool = hold_out_shares(
            labels, pool, self.sharing, self.num_classes, self.num_clients, self.seed
        )
        held_out: dict[str, tuple[object, int]] = {
            "val_fraction": (self.val_fraction, val.numel()),
            "sharing": (self.sharing, 0 if shared is None else shared.numel()),
        }
        partitions = assign_partitions(self.partitioner, labels, natural_ids, pool, held_out)
        clients, tests, source = self._client_test_split(partitions, labels, train, test)
        test_indices = None
        if self.evaluation_split == "validation":
            # Hold the clients' validation splits out of what they train on; their test splits stay unused.
            clients, tests = hold_out_client_tests(
                clients, labels, self.client_test_fraction, self.client_test_size, derive_seed(self.seed, "tuning")
            )
            source, test, test_indices = train, train, self._no_larger_than_test(val, test)
        check_no_empty_client(clients, self.partitioner)
        if test is None:
            if tests.flat.numel() == 0:
                raise ValueError(
                    f"{type(self).__name__} has no separate test set, so its global test set is the union of the "
                    "client test splits, which are empty: set `client_test_fraction` > 0 or `client_test_size`."
                )
            test, test_indices = source, tests.flat
        check_evaluation_labels(test, test_indices, tests, source, train, self.num_classes)
        digest = layout_fingerprint(labels, clients, tests, val, self.sharing, shared, shares)
        check_fingerprint(digest, self._expected_fingerprint, self.partitioner, self.sharing)
        self._layout = Layout(train, labels, val, clients, tests, source, test, test_indices, digest, shared, shares)

    def _no_larger_than_test(self, val: Tensor, test: Dataset | None) -> Tensor:
        """``val``, or a seeded subset of it as large as the test set, so a tuning run evaluates no more than a run.

        Presets that train on a subset hold the rest out as a large validation set; evaluating all of it every
        round would make tuning runs several times slower than the runs they tune.
        """
        size = len(test) if test is not None and hasattr(test, "__len__") else val.numel()
        if val.numel() <= size:
            return val
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "tuning", "global"))
        return val[torch.randperm(val.numel(), generator=generator)[:size]].sort().values

    def _client_test_split(
        self, partitions: RaggedIndex, labels: Tensor, train: Dataset, test: Dataset | None
    ) -> tuple[RaggedIndex, RaggedIndex, Dataset]:
        """Splits the clients' partitions into (train splits, test splits, the dataset the test splits index).

        The default holds out a label-stratified part of every partition of ``train``; subclasses with natural
        per-client test data (LEAF) override it.
        """
        fraction, size = self.client_test_fraction, self.client_test_size
        return (*hold_out_client_tests(partitions, labels, fraction, size, self.seed), train)

    @property
    def _split(self) -> Layout:
        if self._layout is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run yet: call `setup()` first.")
        return self._layout

    def client_ids(self) -> list[int]:
        """Ids of all clients, ``0 .. num_clients - 1``."""
        return list(range(self.num_clients))

    def client_num_samples(self, client_id: int) -> int:
        """Size of the client's training split, its share of G included (FedAvg weights by what clients train on)."""
        return int(self._client_train_indices(client_id).numel())

    def client_dataloader(self, client_id: int, seed: int) -> DataLoader:
        """The client's training split (and share of G), reshuffled by a generator seeded with ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        indices = self._client_train_indices(client_id)
        return self._loader(self._split.train, indices, self.batch_size, generator, federated=True)

    def _client_train_indices(self, client_id: int) -> Tensor:
        self._check_client(client_id)
        local = self._split.clients[client_id]
        shares = self._split.shares
        return local if shares is None else torch.cat([local, shares[client_id]])

    def shared_dataloader(self, seed: int | None = None) -> DataLoader:
        """The global set G for the warm-up model (Zhao et al. §4.2), shuffled by a generator seeded with ``seed``.

        ``seed`` defaults to one derived from the datamodule's ``seed``.
        """
        shared = self._split.shared
        if shared is None or shared.numel() == 0:
            raise RuntimeError(
                f"{type(self).__name__} shares no data: set `sharing` with `beta` > 0 to train a warm-up model on G."
            )
        seed = derive_seed(self.seed, "sharing", "loader") if seed is None else seed
        generator = torch.Generator().manual_seed(seed)
        return self._loader(self._split.train, shared, self.batch_size, generator, federated=True)

    def sharing_statistics(self) -> dict[str, float]:
        """``sharing/global_set_size``, ``sharing/share_size_mean``, ``sharing/emd_before`` and ``emd_after``.

        Empty when ``sharing`` is ``None``; see :func:`~lightning_fed.datamodules.sharing.sharing_statistics`.
        """
        split = self._split
        if split.shared is None or split.shares is None:
            return {}
        return sharing_statistics(split.labels, split.clients, split.shared, split.shares, self.num_classes)

    def client_test_dataloader(self, client_id: int) -> DataLoader | None:
        """The client's test split in fixed order, or ``None`` if it has none."""
        self._check_client(client_id)
        indices = self._split.client_tests[client_id]
        if indices.numel() == 0:
            return None
        return self._loader(self._split.client_test_source, indices, self.eval_batch_size, None, federated=True)

    @override
    def train_dataloader(self) -> DataLoader:
        """All clients' training splits pooled (a centralised baseline), shuffled by a generator seeded by ``seed``."""
        generator = torch.Generator().manual_seed(self.seed)
        return self._loader(self._split.train, self._split.clients.flat, self.batch_size, generator)

    @override
    def val_dataloader(self) -> DataLoader | list:
        """The global validation set, or ``[]`` (Lightning then skips validation) when ``val_fraction`` is 0."""
        if self._split.val.numel() == 0:
            return []
        return self._loader(self._split.train, self._split.val, self.eval_batch_size, None)

    @override
    def test_dataloader(self) -> DataLoader:
        """The global test set."""
        return self._loader(self._split.test, self._split.test_indices, self.eval_batch_size, None)

    def label_histogram(self) -> Tensor:
        """``[num_clients, num_classes]`` int64 label counts of the clients' training splits."""
        return label_histogram(self._split.labels, self._split.clients.parts(), self.num_classes)

    def client_emd(self) -> Tensor:
        """Per-client earth mover's distance between the client's and the population's label distributions."""
        return earth_movers_distance(self.label_histogram())

    @override
    def state_dict(self) -> dict[str, str]:
        """``{"partition_fingerprint": ...}``, a hash of the labels and every split, checked on resume."""
        return {} if self._layout is None else {"partition_fingerprint": self._layout.fingerprint}

    @override
    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        """Checks that the checkpoint's splits match these (now, or at ``setup`` if it has not run)."""
        expected = state_dict.get("partition_fingerprint")
        if expected is None:
            return
        if self._layout is None:
            self._expected_fingerprint = expected
        else:
            check_fingerprint(self._layout.fingerprint, expected, self.partitioner, self.sharing)

    def _check_client(self, client_id: int) -> None:
        if not 0 <= client_id < self.num_clients:
            raise IndexError(f"`client_id` must lie in [0, {self.num_clients}); got {client_id}.")

    def _loader(
        self,
        dataset: Dataset,
        indices: Tensor | None,
        batch_size: int,
        generator: torch.Generator | None,
        federated: bool = False,
    ) -> DataLoader:
        # The federated loop's own loaders (`federated=True`) never reach Lightning's DistributedSampler: they keep
        # the batched fast path, so a client's data order is the same whatever the number of processes.
        trainer = self.trainer
        batched = federated or trainer is None or trainer.world_size == 1
        return index_loader(dataset, indices, batch_size, generator, self.num_workers, batched)


def __getattr__(name: str) -> object:
    # `DatasetFederated` lives in its own module, which imports this one; it is looked up lazily so that
    # `from lightning_fed.datamodules.base import DatasetFederated` keeps working without an import cycle.
    if name == "DatasetFederated":
        from lightning_fed.datamodules.dataset_federated import DatasetFederated

        return DatasetFederated
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FederatedDataModule", "extract_labels"]
