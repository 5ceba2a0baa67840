"""Updates held back by a hook reach the aggregator after the rank's other clients, out of round order."""

from __future__ import annotations

import torch

from lightning_fed import ClientStateStore
from lightning_fed.aggregators import FedAvg
from lightning_fed.context import ClientUpdate, RoundContext


def _update(client_id: int, weight: float, steps: int) -> ClientUpdate:
    params = {"w": torch.full((2,), weight), "bn.num_batches_tracked": torch.tensor(steps)}
    return ClientUpdate(client_id, 10, steps, params)


def test_integer_buffers_come_from_the_last_client_in_round_order_whatever_the_arrival_order():
    global_params = {"w": torch.zeros(2), "bn.num_batches_tracked": torch.tensor(0)}
    round_ctx = RoundContext(0, [4, 1, 7], global_params, {4: 10, 1: 10, 7: 10}, ClientStateStore())
    results = []
    for order in ([4, 1, 7], [4, 7, 1], [7, 1, 4]):
        aggregator = FedAvg()
        aggregator.reset(global_params, round_ctx)
        for cid in order:
            aggregator.update(_update(cid, float(cid), steps=100 + cid))
        results.append(aggregator.compute(global_params))
    for new in results:
        assert new["bn.num_batches_tracked"].item() == 107  # client 7 is the round's last
        torch.testing.assert_close(new["w"], torch.full((2,), 4.0))
