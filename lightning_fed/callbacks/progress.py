"""A round-level progress bar."""

from __future__ import annotations

import sys
import time
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar
from tqdm.auto import tqdm
from typing_extensions import override

from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.engine import headline
from lightning_fed.hooks import FedCallback
from lightning_fed.parallel import distributed


class RoundProgressBar(FedCallback, ProgressBar):
    """Shows ``round k/R``, the clients done in the current round, and the last global accuracy.

    It replaces Lightning's per-batch bar, which would redraw for every client step. The trainer adds it when
    ``enable_progress_bar`` is true and no other progress bar is given.
    """

    # Counting finished clients is the same whether they train alone or side by side.
    supports_batched_clients = True

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._bar: tqdm | None = None
        self._clients_total = 0
        self._clients_done = 0
        self._shown: dict[str, str] = {}
        self._last_draw = 0.0

    @override
    def disable(self) -> None:
        self._enabled = False

    @override
    def enable(self) -> None:
        self._enabled = True

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        self._bar = tqdm(
            total=trainer.max_epochs,
            initial=trainer.current_epoch,
            desc="round",
            unit="round",
            dynamic_ncols=True,
            file=sys.stdout,
            leave=True,
        )

    @override
    def on_round_start(self, trainer: Any, pl_module: LightningModule, round_ctx: RoundContext) -> None:
        # With several processes the bar (rank 0's) counts the clients this rank trains, so it reaches its total.
        shares = distributed.shard_clients(round_ctx.client_ids, round_ctx.num_samples, distributed.world_size())
        self._clients_total, self._clients_done = len(shares[distributed.rank()]), 0
        self._refresh()

    @override
    def on_client_end(
        self, trainer: Any, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        self._clients_done += 1
        self._refresh()

    @override
    def on_round_end(
        self, trainer: Any, pl_module: LightningModule, round_ctx: RoundContext, metrics: dict[str, float]
    ) -> None:
        if distributed.world_size() == 1 and "clients/sampled" in metrics:
            # The round's accepted clients, however they trained: in a deployment they train at their sites, where
            # this process sees no on_client_end.
            self._clients_done = int(metrics["clients/sampled"] - metrics.get("clients/rejected", 0.0))
        shown = headline(metrics)
        self._shown = {key.split("/")[-1].replace("_mean", "(clients)"): f"{value:.4f}" for key, value in shown.items()}
        self._refresh()
        if self._bar is not None:
            self._bar.update(1)

    def _refresh(self) -> None:
        if self._bar is None:
            return
        self._bar.set_postfix({"clients": f"{self._clients_done}/{self._clients_total}", **self._shown}, refresh=False)
        # Redrawing after every client would flood logs of fast runs; tqdm's own rate limit only covers update().
        now = time.monotonic()
        if now - self._last_draw >= self._bar.mininterval:
            self._bar.refresh()
            self._last_draw = now

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
