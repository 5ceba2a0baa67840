"""The pieces of multi-process rounds that run in one process: sharding, store exchange, and setup errors."""

from __future__ import annotations

import pytest
import torch
from helpers.boring import BoringClassifier
from torch import nn

from lightning_fed import FederatedTrainer
from lightning_fed.client_store import ClientStateStore
from lightning_fed.parallel import distributed
from lightning_fed.run.setup_checks import check_no_sync_batchnorm, check_process_group


def test_shards_cover_the_round_once_in_round_order_and_balance_samples():
    client_ids = [1, 3, 4, 7, 8, 9]
    sizes = {1: 100, 3: 10, 4: 60, 7: 50, 8: 40, 9: 5}
    shards = distributed.shard_clients(client_ids, sizes, 2)
    assert sorted(cid for shard in shards for cid in shard) == client_ids
    assert all(shard == sorted(shard, key=client_ids.index) for shard in shards)
    loads = [sum(sizes[cid] for cid in shard) for shard in shards]
    round_robin = max(sum(sizes[cid] for cid in client_ids[r::2]) for r in range(2))
    # Greedy largest-first is within 4/3 of a perfect split, and here far better than every other client.
    assert max(loads) <= 4 / 3 * sum(sizes.values()) / 2 < round_robin
    assert distributed.shard_clients(client_ids, sizes, 2) == shards


def test_every_rank_gets_a_client_even_with_empty_clients():
    shards = distributed.shard_clients([0, 1, 2], {0: 0, 1: 0, 2: 0}, 3)
    assert sorted(map(len, shards)) == [1, 1, 1]
    assert distributed.shard_clients([5, 6], {5: 1, 6: 1}, 1) == [[5, 6]]


def test_collectives_are_the_identity_in_one_process():
    assert distributed.world_size() == 1 and distributed.rank() == 0
    tensor = torch.tensor([1.5, 2.0])
    distributed.all_reduce_sum_([tensor])
    assert tensor.tolist() == [1.5, 2.0]
    assert distributed.all_gather_object({"a": 1}) == [{"a": 1}]
    assert distributed.latest(-1, "mine") == "mine"


def test_store_changes_carry_writes_and_removals_to_another_store():
    writer, reader = ClientStateStore(), ClientStateStore()
    reader.put("ns", 2, {"x": torch.ones(1)})
    reader.take_changes()
    writer.put("ns", 1, {"x": torch.zeros(2)})
    writer.put("ns", 2, {"x": torch.ones(1)})
    writer.pop("ns", 2)
    changes = writer.take_changes()
    assert writer.take_changes() == {"put": {}, "pop": []}
    reader.apply_changes(changes)
    assert torch.equal(reader.get("ns", 1)["x"], torch.zeros(2))
    assert not reader.has("ns", 2)
    # What a store received is not sent on again.
    assert reader.take_changes() == {"put": {}, "pop": []}


def test_more_ranks_than_clients_per_round_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"2 processes.*only 1 clients.*clients_per_round"):
        FederatedTrainer(
            clients_per_round=1, strategy="ddp", devices=2, accelerator="cpu", default_root_dir=str(tmp_path)
        )
    with pytest.raises(ValueError, match="clients_per_round"):
        distributed.check_world_size(4, 3)
    distributed.check_world_size(3, 3)


def test_a_foreign_process_group_is_refused():
    with pytest.raises(ValueError, match="default process group has 2 processes but the trainer runs on 1"):
        check_process_group(1, 2)
    check_process_group(2, 2)


def test_sync_batchnorm_is_refused_with_several_processes():
    module = BoringClassifier(batch_norm=True)
    module.net[1] = nn.SyncBatchNorm(16)
    check_no_sync_batchnorm(module, 1)  # one process: SyncBatchNorm acts as a plain BatchNorm
    check_no_sync_batchnorm(BoringClassifier(batch_norm=True), 2)
    with pytest.raises(ValueError, match=r"SyncBatchNorm layers \['net.1'\].*sync_batchnorm=True"):
        check_no_sync_batchnorm(module, 2)
