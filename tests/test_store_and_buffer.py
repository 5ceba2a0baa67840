import io

import torch
from torchmetrics.classification import MulticlassAccuracy

from lightning_fed import ClientStateStore
from lightning_fed.log_buffer import LogBuffer


def test_store_copies_to_cpu_and_round_trips_through_a_weights_only_checkpoint():
    store = ClientStateStore()
    original = torch.ones(3)
    store.put("scaffold", 4, {"c": original, "steps": 7})
    original.add_(1)  # the store holds a copy, not a view of live state
    assert torch.equal(store.get("scaffold", 4)["c"], torch.ones(3))
    buffer = io.BytesIO()
    torch.save(store.state_dict(), buffer)
    buffer.seek(0)
    restored = ClientStateStore()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.clients("scaffold") == [4]
    assert restored.get("scaffold", 4)["steps"] == 7
    assert restored.nbytes() == 3 * 4
    assert restored.get("fedcurv", 4) is None


def test_log_buffer_means_are_weighted_by_batch_size():
    buffer = LogBuffer()
    buffer.current_batch_size = 10
    buffer.log("loss", torch.tensor(1.0))
    buffer.current_batch_size = 30
    buffer.log("loss", torch.tensor(3.0))
    buffer.log("other", 5.0, batch_size=2)
    result = buffer.compute()
    assert result["loss"] == (10 * 1.0 + 30 * 3.0) / 40
    assert result["other"] == 5.0
    assert buffer.compute() == {}


def test_log_buffer_computes_and_resets_torchmetrics():
    metric = MulticlassAccuracy(num_classes=3, average="micro")
    buffer = LogBuffer()
    metric.update(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))
    buffer.log_dict({"acc": metric})
    assert buffer.compute()["acc"] == 0.75
    assert metric.update_count == 0


def test_buffered_logging_nests_and_restores_lightning_log():
    from lightning.pytorch import LightningModule

    from lightning_fed.log_buffer import buffered_logging

    module = LightningModule()
    outer, inner = LogBuffer(), LogBuffer()
    with buffered_logging(module, outer):
        with buffered_logging(module, inner):
            module.log("x", 1.0)
        module.log("y", 2.0)
    assert inner.compute() == {"x": 1.0} and outer.compute() == {"y": 2.0}
    assert "log" not in module.__dict__ and module.log.__func__ is LightningModule.log
