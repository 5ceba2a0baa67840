import lightning.pytorch as L
import torch
from helpers.boring import NUM_CLASSES, BoringClassifier, fast_trainer, global_weights, make_datamodule, make_tensors

from lightning_fed.callbacks import Separate
from lightning_fed.datamodules import DatasetFederated, IidPartitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.utilities.seeding import derive_seed

NUM_CLIENTS = 3


def _datamodule(noisy_client: int | None = None) -> DatasetFederated:
    """The boring data; ``noisy_client``'s inputs (not its labels, so the split stays the same) replaced by noise."""
    inputs, labels = make_tensors(400, seed=0)
    partitioner = IidPartitioner(num_partitions=NUM_CLIENTS, seed=0)
    if noisy_client is not None:
        indices = partitioner.partition(labels)[noisy_client]
        inputs = inputs.clone()
        inputs[indices] = torch.randn(len(indices), inputs.shape[1], generator=torch.Generator().manual_seed(7))
    train = TensorClassificationDataset(inputs, labels)
    test = TensorClassificationDataset(*make_tensors(200, seed=1))
    return DatasetFederated(train, test, NUM_CLASSES, partitioner, batch_size=16)


def _fit(tmp_path, datamodule, **kwargs):
    L.seed_everything(0)
    module = BoringClassifier(lr=0.1, batch_norm=True, momentum=0.9)
    initial = global_weights(module)
    settings = dict(num_rounds=2, clients_per_round=NUM_CLIENTS, local_epochs=1, callbacks=[Separate()])
    trainer = fast_trainer(tmp_path, **{**settings, **kwargs})
    trainer.fit(module, datamodule=datamodule)
    return trainer, module, initial


def test_a_clients_model_does_not_depend_on_another_clients_data(tmp_path):
    clean, _, _ = _fit(tmp_path / "clean", _datamodule())
    noisy, _, _ = _fit(tmp_path / "noisy", _datamodule(noisy_client=1))

    def personal(trainer, cid):
        return trainer.federation_state.store.get("separate", cid)["params"]

    for cid in (0, 2):
        for name, tensor in personal(clean, cid).items():
            assert torch.equal(personal(noisy, cid)[name], tensor), (cid, name)
    assert any(not torch.equal(personal(noisy, 1)[n], t) for n, t in personal(clean, 1).items())
    clean_metrics, noisy_metrics = clean.last_round_result.client_results, noisy.last_round_result.client_results
    assert clean_metrics[0] == noisy_metrics[0] and clean_metrics[2] == noisy_metrics[2]


def test_global_model_is_never_changed_and_nothing_is_communicated(tmp_path):
    trainer, module, initial = _fit(tmp_path, _datamodule())
    for name, tensor in initial.items():
        assert torch.equal(global_weights(module)[name], tensor), name
    for metrics in trainer.federation_state.history:
        assert metrics["comm/bytes_up"] == 0.0 and metrics["comm/bytes_down"] == 0.0
        assert "personal/test_acc_mean" in metrics and "client/test_acc_mean" not in metrics


def test_one_client_equals_centralised_training_on_its_data(tmp_path):
    datamodule = make_datamodule(num_clients=1)
    trainer, _, initial = _fit(
        tmp_path, datamodule, num_rounds=3, clients_per_round=1, keep_optimizer_state=True, seed=3
    )
    centralised = BoringClassifier(lr=0.1, batch_norm=True, momentum=0.9)
    centralised.load_state_dict(initial)
    optimizer = centralised.configure_optimizers()
    centralised.train()
    with buffered_logging(centralised, LogBuffer()):
        for round_idx in range(3):
            loader = datamodule.client_dataloader(0, seed=derive_seed(3, "data", round_idx, 0))
            for batch_idx, batch in enumerate(loader):
                centralised.training_step(batch, batch_idx).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    personal = trainer.federation_state.store.get("separate", 0)["params"]
    for name, tensor in centralised.state_dict().items():
        assert torch.equal(personal[name], tensor), name
