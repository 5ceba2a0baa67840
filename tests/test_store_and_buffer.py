import io

import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy

from lightning_fed import ClientStateStore
from lightning_fed.engine.log_buffer import LogBuffer


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


def test_log_buffer_keeps_graph_outputs_for_the_end_and_reduces_other_tensors_when_logged():
    weight = torch.tensor(2.0, requires_grad=True)
    buffer = LogBuffer()
    losses = [weight * 1.0, weight * 3.0, (weight * torch.tensor([1.0, 2.0])).sum() / 2]
    for loss, size in zip(losses, (10, 30, 20)):
        buffer.log("loss", loss, batch_size=size)
    running = torch.tensor(4.0)
    buffer.log("running", running, batch_size=1)
    buffer.log("running", torch.tensor(6.0), batch_size=1)
    running.add_(100.0)  # a buffer changed in place after it was logged: the logged value counts
    # The loss is kept as the step's tensor (no kernel per step), the buffer reduced at once.
    assert len(buffer._kept["loss"]) == 3 and "running" not in buffer._kept
    result = buffer.compute()
    assert result["loss"] == pytest.approx((10 * 2.0 + 30 * 6.0 + 20 * 3.0) / 60, rel=1e-12)
    assert result["running"] == 5.0
    assert buffer.compute() == {}


def test_log_buffer_measures_a_batch_only_when_a_value_is_logged_without_its_size():
    buffer = LogBuffer()
    buffer.start_batch((torch.zeros(7, 3), torch.zeros(7)))
    buffer.log("a", 1.0, batch_size=2)
    assert buffer._batch is not None and buffer._size == 1  # not measured: every value named its size
    buffer.log("b", 1.0)
    assert buffer.current_batch_size == 7
    buffer.start_batch({"x": torch.zeros(3, 1)})
    buffer.log("b", 4.0)
    assert buffer.compute() == {"a": 1.0, "b": (7 * 1.0 + 3 * 4.0) / 10}


def test_log_buffer_computes_and_resets_torchmetrics():
    metric = MulticlassAccuracy(num_classes=3, average="micro")
    buffer = LogBuffer()
    metric.update(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))
    buffer.log_dict({"acc": metric})
    assert buffer.compute()["acc"] == 0.75
    assert metric.update_count == 0


def test_buffered_logging_nests_and_restores_lightning_log():
    from lightning.pytorch import LightningModule

    from lightning_fed.engine.log_buffer import buffered_logging

    module = LightningModule()
    outer, inner = LogBuffer(), LogBuffer()
    with buffered_logging(module, outer):
        with buffered_logging(module, inner):
            module.log("x", 1.0)
        module.log("y", 2.0)
    assert inner.compute() == {"x": 1.0} and outer.compute() == {"y": 2.0}
    assert "log" not in module.__dict__ and module.log.__func__ is LightningModule.log


def test_store_rollback_undoes_writes_and_removals_since_begin():
    store = ClientStateStore()
    store.put("scaffold", 1, {"c": torch.ones(2)})
    store.put("scaffold", 2, {"c": torch.zeros(2)})
    store.take_changes()
    store.begin()
    store.put("scaffold", 1, {"c": torch.full((2,), float("nan"))})
    store.pop("scaffold", 2)
    store.put("apfl", 1, {"v": torch.ones(1)})
    assert store.get("scaffold", 2) is None and store.has("apfl", 1)  # reads see the transaction's writes
    store.rollback()
    assert torch.equal(store.get("scaffold", 1)["c"], torch.ones(2))
    assert torch.equal(store.get("scaffold", 2)["c"], torch.zeros(2))
    assert store.namespaces() == ["scaffold"] and not store.in_transaction
    # Nothing is left for the other ranks to apply either.
    assert store.take_changes() == {"put": {}, "pop": []}


def test_store_commit_keeps_writes_and_reports_them_as_changes():
    store = ClientStateStore()
    store.begin()
    store.put("fedamp", 3, {"params": torch.ones(1)})
    store.commit()
    store.rollback()  # no transaction open: nothing to undo
    assert store.clients("fedamp") == [3]
    assert list(store.take_changes()["put"]["fedamp"]) == [3]
    store.begin()
    with pytest.raises(RuntimeError, match="already open"):
        store.begin()
