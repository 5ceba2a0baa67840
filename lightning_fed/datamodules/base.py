"""The federated datamodule: one dataset split into a global validation set, clients and client tests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_bool, check_choice, check_instance, check_int, check_real
from lightning_fed.datamodules._splits import RaggedIndex
from lightning_fed.datamodules.batch_format import check_batch_keys
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
    no_labels_error,
)
from lightning_fed.datamodules.loaders import LoaderOptions, index_loader
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.sharing import DataSharing, hold_out_shares, sharing_statistics, warn_without_warmup
from lightning_fed.functional.partition_stats import earth_movers_distance, label_histogram
from lightning_fed.utilities.seeding import derive_seed


class FederatedDataModule(LightningDataModule, ABC):
    """Splits a map-style dataset among clients for federated training.

    ``setup`` carves a label-stratified global validation set out of the pooled training data, partitions the rest
    among ``num_clients`` clients with ``partitioner``, and holds out a label-stratified test split from every
    client's partition, so each client is evaluated on its own distribution.

    Labels come only from a ``targets``/``labels`` attribute, a ``label_fn`` (:class:`DatasetFederated`), or items
    that declare one ((input, integer scalar) pairs); a feature is never read as a label. Data without labels
    (bare tensors, say) works with label-free partitioners (:class:`IidPartitioner`,
    :class:`NaturalIdPartitioner`): its holdouts are uniform random draws, its ``label_histogram`` has one column
    (the client sizes), and settings that need labels (a label-based partitioner, ``sharing``, ``num_classes``)
    are refused in one line. Per-client state is two flat index
    tensors, so registering 10 000 clients costs little; loaders are built only for the client asked for.

    Subclasses set the class attribute (or instance attribute, before ``super().__init__``) ``num_classes`` (``None``
    takes the largest label + 1, and is what data without labels needs) and
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
        num_workers: DataLoader worker processes of every loader; keep 0 for in-memory datasets, which gather in
            microseconds.
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
        drop_last: Drop each training pass's last batch when it is smaller than ``batch_size`` (clients, G and
            ``train_dataloader``; never evaluation). What trains changes, so a resume must keep it; a client with
            fewer than ``batch_size`` training examples is refused. Set it for BatchNorm modules, which cannot
            train on a batch of one.
        pin_memory: DataLoader ``pin_memory`` of every loader (page-locked batches for faster copies to a GPU).
        persistent_workers: DataLoader ``persistent_workers`` of every loader (needs ``num_workers`` > 0).
        batch_format: ``"tuple"`` (the default): batches as the dataset's items collate, ``(input, label)`` for
            the shipped datasets. ``"dict"``: every batch a dict keyed by ``batch_keys``, the Hugging Face style
            that Flower's quickstart modules read (``batch["image"]``, ``batch["label"]``).
        batch_keys: The keys of ``"dict"`` batches, one per part of an item (``("image", "label")`` by default;
            e.g. ``["text", "label"]``). A dataset whose items are already dicts keeps its own keys.

    ``num_workers``, ``pin_memory``, ``persistent_workers`` and ``batch_format`` change no data order, so a run may
    resume with other values; ``drop_last`` does, and enters the partition fingerprint.
    """

    num_classes: int | None

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
        drop_last: bool = False,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        batch_format: Literal["tuple", "dict"] = "tuple",
        batch_keys: Sequence[str] = ("image", "label"),
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
        if not hasattr(self, "num_classes"):
            raise InvalidArgumentError(
                "num_classes", None, f"set by {type(self).__name__} (an int, or None for the largest label + 1)"
            )
        check_int("num_classes", self.num_classes, minimum=1, allow_none=True)
        check_bool("drop_last", drop_last)
        check_bool("pin_memory", pin_memory)
        check_bool("persistent_workers", persistent_workers)
        if persistent_workers and num_workers == 0:
            raise InvalidArgumentError(
                "persistent_workers", persistent_workers, "false with `num_workers: 0` (there are no workers to keep)"
            )
        self.batch_format = check_choice("batch_format", batch_format, ("tuple", "dict"))
        self.batch_keys = check_batch_keys(batch_keys)
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
        self.drop_last = drop_last
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
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

    def _read_labels(self, train: Dataset) -> Tensor | None:
        """The training data's int64 labels, or ``None`` when it has none (see the class docstring)."""
        return extract_labels(train, "train")

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
        labels, num_classes, labelled = self._labels_and_classes(train)
        natural_ids = self._natural_ids()
        val, pool = carve_validation(labels, natural_ids, self.val_fraction, self.num_clients, self.seed)
        shared, shares, pool = hold_out_shares(labels, pool, self.sharing, num_classes, self.num_clients, self.seed)
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
        self._check_drop_last(clients, shares)
        if test is None:
            if tests.flat.numel() == 0:
                raise ValueError(
                    f"{type(self).__name__} has no separate test set, so its global test set is the union of the "
                    "client test splits, which are empty: set `client_test_fraction` > 0 or `client_test_size`."
                )
            test, test_indices = source, tests.flat
        if self.num_classes is not None:
            check_evaluation_labels(test, test_indices, tests, source, train, self.num_classes)
        digest = layout_fingerprint(labels, clients, tests, val, self.sharing, shared, shares, self.drop_last)
        check_fingerprint(digest, self._expected_fingerprint, self.partitioner, self.sharing)
        layout = Layout(train, labels, val, clients, tests, source, test, test_indices, digest, shared, shares)
        layout.labelled, layout.num_classes = labelled, num_classes
        self._layout = layout

    def _labels_and_classes(self, train: Dataset) -> tuple[Tensor, int, bool]:
        """The labels to split by, the number of classes they range over and whether they are the data's labels,
        after the checks that need labels.

        Data without labels gets zeros (one class), so every stratified holdout becomes a uniform random draw.
        """
        labels = self._read_labels(train)
        if labels is None:
            if self.num_classes is not None:
                raise no_labels_error("num_classes", self.num_classes, "null")
            if self.partitioner.uses_labels:
                raise no_labels_error(
                    "partitioner", self.partitioner, "a label-free partitioner such as IidPartitioner"
                )
            if self.sharing is not None:
                raise no_labels_error("sharing", self.sharing, "null (data sharing draws a class-balanced set)")
            return torch.zeros(len(train), dtype=torch.int64), 1, False  # type: ignore[arg-type]  # map-style: sized
        if self.num_classes is None:
            self.num_classes = int(labels.max()) + 1
        check_label_range(labels, self.num_classes)
        return labels, self.num_classes, True

    def _check_drop_last(self, clients: RaggedIndex, shares: RaggedIndex | None) -> None:
        """With ``drop_last``, every client must have a full batch to train on."""
        if not self.drop_last:
            return
        sizes = clients.lengths() if shares is None else clients.lengths() + shares.lengths()
        short = (sizes < self.batch_size).nonzero().squeeze(1).tolist()
        if short:
            raise InvalidArgumentError(
                "drop_last",
                True,
                f"false, or `batch_size` at most {int(sizes.min())}: {len(short)} clients (e.g. {short[:5]}) have"
                f" fewer than batch_size={self.batch_size} training examples, so dropping the last batch leaves"
                " them nothing to train on",
            )

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
        return self._loader(self._split.train, indices, self.batch_size, generator, federated=True, train=True)

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
        return self._loader(self._split.train, shared, self.batch_size, generator, federated=True, train=True)

    def sharing_statistics(self) -> dict[str, float]:
        """``sharing/global_set_size``, ``sharing/share_size_mean``, ``sharing/emd_before`` and ``emd_after``.

        Empty when ``sharing`` is ``None``; see :func:`~lightning_fed.datamodules.sharing.sharing_statistics`.
        """
        split = self._split
        if split.shared is None or split.shares is None:
            return {}
        return sharing_statistics(split.labels, split.clients, split.shared, split.shares, split.num_classes)

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
        return self._loader(self._split.train, self._split.clients.flat, self.batch_size, generator, train=True)

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

    @property
    def has_labels(self) -> bool:
        """Whether the training data has labels (see the class docstring); ``setup`` must have run."""
        return self._split.labelled

    def label_histogram(self) -> Tensor:
        """``[num_clients, num_classes]`` int64 label counts of the clients' training splits.

        Data without labels has one column: the clients' sizes.
        """
        return label_histogram(self._split.labels, self._split.clients.parts(), self._split.num_classes)

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
        train: bool = False,
    ) -> DataLoader:
        # The federated loop's own loaders (`federated=True`) never reach Lightning's DistributedSampler: they keep
        # the batched fast path, so a client's data order is the same whatever the number of processes.
        trainer = self.trainer
        batched = federated or trainer is None or trainer.world_size == 1
        return index_loader(dataset, indices, batch_size, generator, self._loader_options(train), batched)

    def _loader_options(self, train: bool) -> LoaderOptions:
        """The loader settings; ``drop_last`` applies to training loaders only."""
        return LoaderOptions(
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            drop_last=self.drop_last and train,
            batch_keys=self.batch_keys if self.batch_format == "dict" else None,
        )


__all__ = ["FederatedDataModule", "extract_labels"]
