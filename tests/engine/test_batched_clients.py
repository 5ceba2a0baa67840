"""client_parallelism: clients trained side by side give the sequential path's global model, metrics and store;
what cannot be vectorised falls back to one client at a time with one warning."""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import NUM_CLASSES, BoringClassifier, fast_trainer, global_weights, make_datamodule, make_tensors

from lightning_fed.aggregators import FedAvg, QFedAvg
from lightning_fed.callbacks import FedAMP, FedCurv, FedGG, FedProx, Scaffold
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules import DatasetFederated, DirichletPartitioner, IidPartitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset

NUM_CLIENTS = 10


class OptimizerModule(BoringClassifier):
    """The boring MLP with a chosen optimizer and two logged values per step."""

    def __init__(self, optimizer: str = "sgd", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.optimizer = optimizer

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_margin", self(batch[0]).max(1).values.mean(), batch_size=3)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1)
        if self.optimizer == "momentum":
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True)
        if self.optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)
        return torch.optim.Adam(self.parameters(), lr=0.01, weight_decay=1e-3)


class BranchingModule(BoringClassifier):
    """A training step whose control flow depends on the data: vmap cannot run it."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if loss > 1.0:
            loss = loss * 2.0
        return loss


class ItemModule(BoringClassifier):
    """A training step that reads a tensor's value on the host."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_scale", loss.item())
        return loss


def _fit(
    parallelism: int | str,
    make_module: Any,
    callbacks: list[Any] = (),
    aggregator: Any = None,
    rounds: int = 3,
    iid: bool = False,
    **kwargs: Any,
) -> tuple[dict[str, torch.Tensor], dict[str, float], Any]:
    L.seed_everything(0)
    module = make_module()
    # Dirichlet client sizes: unequal clients, ragged last batches, different numbers of batches.
    partitioner = (
        IidPartitioner(NUM_CLIENTS)
        if iid
        else DirichletPartitioner(NUM_CLIENTS, alpha=0.5, min_partition_size=5, seed=3)
    )
    datamodule = make_datamodule(num_samples=300, partitioner=partitioner, batch_size=8)
    trainer = fast_trainer(
        None, num_rounds=rounds, clients_per_round=7, client_parallelism=parallelism, aggregator=aggregator,
        callbacks=list(callbacks), client_eval="none", eval_every_n_rounds=0, **kwargs,
    )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    history = trainer.federation_state.history
    metrics = {k: v for row in history for k, v in row.items() if k.startswith("train/")}
    return global_weights(module), metrics, trainer


def _assert_same(batched: dict[str, torch.Tensor], sequential: dict[str, torch.Tensor]) -> None:
    for name, expected in sequential.items():
        scale = expected.abs().max().clamp_min(1e-12)
        assert ((batched[name] - expected).abs().max() / scale).item() <= 1e-5, name


ALGORITHMS = {
    "fedavg": lambda: ([], None),
    "fedprox": lambda: ([FedProx(mu=0.5)], None),
    "scaffold": lambda: ([Scaffold()], FedAvg(weighting="uniform")),
    "fedcurv": lambda: ([FedCurv(lam=1.0)], None),
    "qfedavg": lambda: ([], QFedAvg(q=1.0)),
    "fedamp": lambda: ([FedAMP(alpha_k=0.5, lam=1.0)], None),
}


@pytest.mark.parametrize(
    ("algorithm", "optimizer"),
    [
        ("fedavg", "sgd"),
        ("fedavg", "momentum"),
        ("fedavg", "adam"),
        ("fedavg", "adamw"),
        ("fedprox", "momentum"),
        ("scaffold", "sgd"),
        ("scaffold", "adam"),
        ("fedcurv", "momentum"),
        ("qfedavg", "adam"),
        ("fedamp", "sgd"),
    ],
)
def test_groups_give_the_sequential_global_model(tmp_path, algorithm, optimizer):
    results = []
    for parallelism in (1, 3):
        callbacks, aggregator = ALGORITHMS[algorithm]()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="client_parallelism")
            weights, metrics, _ = _fit(
                parallelism, lambda: OptimizerModule(optimizer), callbacks, aggregator, default_root_dir=str(tmp_path)
            )
        results.append((weights, metrics))
    (sequential, seq_metrics), (batched, batched_metrics) = results
    _assert_same(batched, sequential)
    # Per-client logs (the module's two values, and the penalty's) reach the round's metrics as sequentially.
    assert batched_metrics.keys() == seq_metrics.keys() and "train/margin" in seq_metrics
    for key, value in seq_metrics.items():
        assert batched_metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_auto_and_a_group_larger_than_the_round_match_too(tmp_path):
    sequential, _, _ = _fit(1, lambda: OptimizerModule("momentum"), default_root_dir=str(tmp_path))
    for parallelism in ("auto", 64):
        batched, _, trainer = _fit(parallelism, lambda: OptimizerModule("momentum"), default_root_dir=str(tmp_path))
        _assert_same(batched, sequential)
        assert trainer.fed_runner.batched.size > 1


def test_store_and_step_count_follow_the_sequential_path(tmp_path):
    _, _, sequential = _fit(
        1, lambda: OptimizerModule("sgd"), [Scaffold()], FedAvg(weighting="uniform"), default_root_dir=str(tmp_path)
    )
    _, _, batched = _fit(
        4, lambda: OptimizerModule("sgd"), [Scaffold()], FedAvg(weighting="uniform"), default_root_dir=str(tmp_path)
    )
    assert batched.global_step == sequential.global_step
    store_a, store_b = sequential.federation_state.store, batched.federation_state.store
    assert store_a.clients("scaffold") == store_b.clients("scaffold")
    for client_id in store_a.clients("scaffold"):
        _assert_same(store_b.get("scaffold", client_id), store_a.get("scaffold", client_id))


def test_dropout_runs_batched_and_is_reproducible(tmp_path):
    first, _, trainer = _fit(4, lambda: OptimizerModule("sgd", dropout=0.3), default_root_dir=str(tmp_path))
    second, _, _ = _fit(4, lambda: OptimizerModule("sgd", dropout=0.3), default_root_dir=str(tmp_path))
    assert trainer.fed_runner.batched.size == 4
    for name in first:
        assert torch.equal(first[name], second[name])


@pytest.mark.parametrize(
    ("make_module", "callbacks", "reason"),
    [
        (lambda: BoringClassifier(batch_norm=True), [], "BatchNorm"),
        (BranchingModule, [], "cannot be vectorised"),
        (ItemModule, [], "cannot be vectorised"),
        (BoringClassifier, [FedGG(mu=0.01)], "FedGG"),
    ],
)
def test_what_cannot_be_vectorised_trains_sequentially_with_one_warning(tmp_path, make_module, callbacks, reason):
    # Equal clients: BatchNorm cannot train on a last batch of one example, batched or not.
    sequential, _, _ = _fit(
        1, make_module, [type(cb)(**_init_args(cb)) for cb in callbacks], iid=True, default_root_dir=str(tmp_path)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batched, _, trainer = _fit(4, make_module, callbacks, iid=True, default_root_dir=str(tmp_path))
    fallbacks = [w for w in caught if "client_parallelism" in str(w.message)]
    assert len(fallbacks) == 1 and reason in str(fallbacks[0].message)
    assert trainer.fed_runner.batched.size == 1
    for name in sequential:
        assert torch.equal(batched[name], sequential[name])


def _init_args(callback: Any) -> dict[str, Any]:
    return {"mu": callback.mu} if isinstance(callback, FedGG) else {}


@pytest.mark.parametrize("value", [0, -2, 1.5, "fast", True])
def test_invalid_client_parallelism_names_the_argument(tmp_path, value):
    with pytest.raises(InvalidArgumentError, match="client_parallelism"):
        fast_trainer(tmp_path, client_parallelism=value)


def test_a_diverging_client_of_a_group_is_rejected_as_sequentially(tmp_path):
    def fit(parallelism: int) -> tuple[dict[str, torch.Tensor], list[list[int]], Any]:
        L.seed_everything(0)
        module = OptimizerModule("momentum")
        inputs, labels = make_tensors(300, seed=0)
        inputs[17] = float("nan")  # whichever client holds example 17 diverges; the others must not notice
        datamodule = DatasetFederated(
            TensorClassificationDataset(inputs, labels),
            TensorClassificationDataset(*make_tensors(50, seed=1)),
            NUM_CLASSES,
            IidPartitioner(NUM_CLIENTS),
            batch_size=8,
        )
        trainer = fast_trainer(
            tmp_path, num_rounds=2, clients_per_round=NUM_CLIENTS, client_parallelism=parallelism,
            client_eval="none", eval_every_n_rounds=0, callbacks=[Scaffold()], aggregator=FedAvg(weighting="uniform"),
        )  # fmt: skip
        trainer.fit(module, datamodule=datamodule)
        rejected = [row["clients/rejected"] for row in trainer.federation_state.history]
        return global_weights(module), rejected, trainer

    sequential, rejected_seq, trainer_seq = fit(1)
    batched, rejected_batched, trainer_batched = fit(5)
    assert rejected_seq == rejected_batched == [1.0, 1.0]
    assert all(torch.isfinite(t).all() for t in batched.values())
    _assert_same(batched, sequential)
    # The diverged client's SCAFFOLD control was rolled back in both: the stores hold the same clients.
    assert trainer_seq.federation_state.store.clients("scaffold") == trainer_batched.federation_state.store.clients(
        "scaffold"
    )


class FrozenTrunkModule(OptimizerModule):
    """The boring MLP whose first layer is a frozen base, as a pretrained trunk under adapters."""

    def __init__(self, optimizer: str = "adam") -> None:
        super().__init__(optimizer)
        self.net[0].requires_grad_(False)


@pytest.mark.parametrize(("algorithm", "optimizer"), [("fedavg", "adam"), ("scaffold", "momentum")])
def test_a_group_stacks_the_federated_part_only_on_one_frozen_base(tmp_path, monkeypatch, algorithm, optimizer):
    """Memory: base + G × federated part. The group stacks the trainable part; the frozen base stays in the module,
    one copy, passed unstacked to every client of the group; the result is the sequential one."""
    from lightning_fed.engine.batched.layout import GradientLayouts

    stacked: dict[str, tuple[int, ...]] = {}
    original_stack = GradientLayouts.stack

    def recording_stack(layouts, name, tensors):
        out = original_stack(layouts, name, tensors)
        stacked[name] = tuple(out.shape)
        return out

    results = []
    for parallelism in (1, 4):
        callbacks, aggregator = ALGORITHMS[algorithm]()
        monkeypatch.setattr(GradientLayouts, "stack", recording_stack)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="client_parallelism")
            weights, _, trainer = _fit(
                parallelism, lambda: FrozenTrunkModule(optimizer), callbacks, aggregator, default_root_dir=str(tmp_path)
            )
        monkeypatch.undo()
        results.append(weights)
    sequential, batched = results
    assert trainer.fed_runner.batched.size == 4
    _assert_same(batched, sequential)
    assert torch.equal(batched["net.0.weight"], sequential["net.0.weight"])
    # Only the federated part was stacked, one row per client of a group.
    assert stacked and not {"net.0.weight", "net.0.bias"} & set(stacked), sorted(stacked)
    assert set(stacked) == {"net.3.weight", "net.3.bias"} and all(shape[0] <= 4 for shape in stacked.values())


def test_auto_sizes_groups_by_the_federated_part():
    """A client of a group costs its federated part: the frozen base is shared, so a big frozen trunk with a small
    head gets groups as large as the head allows."""
    from helpers.boring import BigTrunkClassifier

    from lightning_fed.engine.batched.support import CPU_GROUP_BYTES, auto_group_size
    from lightning_fed.functional.federated_state import federated_keys

    module = BigTrunkClassifier()
    head = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    whole = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    cpu = torch.device("cpu")
    assert auto_group_size(module, cpu, federated_keys(module)) == CPU_GROUP_BYTES // head
    assert auto_group_size(module, cpu) == max(1, CPU_GROUP_BYTES // whole)
