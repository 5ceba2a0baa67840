"""Where a run's artefacts go: run directory, partition plot, round metrics, per-client tables, summary JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_fed.engine import accuracy_key, headline
from lightning_fed.functional.partition_stats import mean_emd
from lightning_fed.hooks import FedCallback
from lightning_fed.loggers.wandb import define_round_axis, log_image, log_table, wandb_loggers
from lightning_fed.run.identity import new_run_dir
from lightning_fed.utilities.atomic import write_text_atomic
from lightning_fed.utilities.schedule import is_due

if TYPE_CHECKING:
    from lightning_fed.context import RoundResult
    from lightning_fed.trainer import FederatedTrainer


def resolve_run_dir(trainer: FederatedTrainer) -> Path:
    """The run directory: ``trainer.run_dir`` if set, else ``<default_root_dir>/runs/<run id>`` (see
    :mod:`lightning_fed.run.identity`).

    The answer is kept in the trainer's run session (``fit`` decides it when it starts, a resumed run's own directory
    included), so the config saved at setup, the checkpoints and the summary written later land in the same directory.
    """
    session = trainer.session
    if session.run_dir is None:
        session.run_dir = new_run_dir(trainer)
    return session.run_dir


def publish_figure(
    trainer: FederatedTrainer, figure: Any, relative_path: str, key: str, caption: str | None = None
) -> Path:
    """Saves ``figure`` as ``<run dir>/<relative_path>`` (atomically) and logs it to every W&B logger under ``key``.

    Call it on global rank zero only, like any other write to the run directory.
    """
    from lightning_fed.plots import save_figure

    path = save_figure(figure, resolve_run_dir(trainer) / relative_path)
    for logger in wandb_loggers(trainer.loggers):
        log_image(logger, key, str(path), caption=caption)
    return path


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(payload, indent=2, allow_nan=True))


class RunReporter:
    """Sends a run's round-level information to every logger and to files in the run directory.

    Only rank 0 logs and writes: every rank holds the same combined round metrics, so one copy is the run's.
    """

    def __init__(self, trainer: FederatedTrainer) -> None:
        self.trainer = trainer
        self.run_dir = resolve_run_dir(trainer)
        # The partition never changes during a fit: its statistics are computed once, not in every summary.
        datamodule = trainer.datamodule
        self.histogram = datamodule.label_histogram()
        self.emd = datamodule.client_emd()
        self.mean_emd = mean_emd(self.histogram)
        # Metric groups already put on W&B's round axis; every group a round logs joins it on first sight.
        self._round_axis: set[str] = set()
        # The latest per-client evaluation, for rounds that evaluate no client (tables and the summary).
        self.client_results: dict[int, dict[str, float]] = {}
        self.client_prefix = "client/"

    def on_fit_start(self) -> None:
        """Creates the run directory, sets up W&B's round axis and logs the partition."""
        if not self.trainer.is_global_zero:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._log_partition()

    def _log_partition(self) -> None:
        from lightning_fed.plots import plot_label_histogram

        figure = plot_label_histogram(self.histogram, self.emd)
        stats = {"partition/mean_emd": self.mean_emd, "partition/num_clients": float(len(self.histogram))}
        for logger in self.trainer.loggers:
            logger.log_metrics(stats, step=0)
        publish_figure(
            self.trainer, figure, "partition.png", "partition/label_histogram", f"mean EMD {self.mean_emd:.3f}"
        )

    def report_round(self, result: RoundResult) -> Path | None:
        """Logs a finished round, its per-client table when due, and rewrites ``summary.json`` (rank 0 only).

        Returns:
            The summary's path on rank 0, ``None`` on other ranks.
        """
        if result.client_results:
            self.client_results, self.client_prefix = result.client_results, result.client_prefix
        self.log_round(result.metrics)
        round_number = result.round_idx + 1
        if is_due(round_number, self.trainer.client_table_every_n_rounds, self.trainer.num_rounds):
            self.log_client_table(round_number, self.client_results, self.client_prefix)
        if not self.trainer.is_global_zero:
            return None
        return self.write_summary(self.client_results, self.client_prefix)

    def log_round(self, metrics: dict[str, float]) -> None:
        """Logs a round's metrics at the current global step (rank 0 only).

        Every metric of the round, whoever added it (the round, a callback's ``on_round_end``), is plotted on W&B
        against ``round``: its group (the part before the first ``/``) is declared on the round axis the first time
        it appears, so no list of algorithm prefixes has to be kept in step with the algorithms.
        """
        if not self.trainer.is_global_zero:
            return
        self._declare_round_axis(metrics)
        finite = {key: value for key, value in metrics.items() if not math.isnan(value)}
        for logger in self.trainer.loggers:
            logger.log_metrics(finite, step=self.trainer.global_step)

    def _declare_round_axis(self, metrics: dict[str, float]) -> None:
        groups = {key.split("/", 1)[0] + "/*" if "/" in key else key for key in metrics if key != "round"}
        new = sorted(groups - self._round_axis)
        if not new:
            return
        for logger in wandb_loggers(self.trainer.loggers):
            define_round_axis(logger, new)
        self._round_axis.update(new)

    def log_client_table(
        self, round_number: int, per_client: dict[int, dict[str, float]], prefix: str = "client/"
    ) -> None:
        """A per-client results table (W&B) and the accuracy distribution plot (``client_accuracy.png``)."""
        if not per_client or not self.trainer.is_global_zero:
            return
        self._log_accuracy_distribution(round_number, per_client, prefix)
        keys = sorted({key for metrics in per_client.values() for key in metrics})
        datamodule = self.trainer.datamodule
        columns: list[str | int] = ["client", "num_train_samples", *keys]
        rows = [
            [cid, datamodule.client_num_samples(cid), *(m.get(k, float("nan")) for k in keys)]
            for cid, m in sorted(per_client.items())
        ]
        for logger in wandb_loggers(self.trainer.loggers):
            log_table(logger, f"{prefix}results", columns, rows, round_number)

    def _log_accuracy_distribution(
        self, round_number: int, per_client: dict[int, dict[str, float]], prefix: str
    ) -> None:
        from lightning_fed.plots import plot_client_accuracy

        key = accuracy_key(next(iter(per_client.values())))
        values = [m[key] for m in per_client.values() if key is not None and key in m and math.isfinite(m[key])]
        if not values:
            return
        which = "personalised models" if prefix == "personal/" else "global model"
        figure = plot_client_accuracy({f"round {round_number}": values}, title=f"{key} per client, {which}")
        publish_figure(
            self.trainer, figure, "client_accuracy.png", f"{prefix}accuracy_distribution", f"round {round_number}"
        )

    def print_final(self, summary_path: Path | None) -> None:
        """Prints the final headline figures, the run directory and the summary's path."""

        history = self.trainer.federation_state.history
        if not history:
            return
        shown = headline(history[-1])
        text = ", ".join(f"{key}={value:.4f}" for key, value in shown.items()) or "no accuracy logged"
        self.trainer.print(f"[lightning_fed] final after {len(history)} rounds: {text}")
        self.trainer.print(f"[lightning_fed] run directory: {self.run_dir}")
        self.trainer.print(f"[lightning_fed] summary: {summary_path}")

    def write_summary(self, per_client: dict[int, dict[str, float]], prefix: str = "client/") -> Path:
        """Writes ``summary.json``: final metrics, per-round history, wall time, bytes, and what the federated
        callbacks add (``FedCallback.summary_entries``, e.g. attack simulation's malicious clients)."""
        state = self.trainer.federation_state
        datamodule = self.trainer.datamodule
        payload = {
            "num_rounds": self.trainer.num_rounds,
            "completed_rounds": state.completed_rounds,
            "seed": state.seed,
            "final": state.history[-1] if state.history else {},
            "history": state.history,
            "wall_time_s": state.wall_time_s,
            "bytes_up": state.bytes_up,
            "bytes_down": state.bytes_down,
            "rejected_clients_total": state.rejected_total,
            "num_clients": datamodule.num_clients,
            "mean_emd": self.mean_emd,
            "final_client_metrics": {str(cid): metrics for cid, metrics in sorted(per_client.items())},
            # "personal/" when those are the clients' personalised models, "client/" when the global model.
            "final_client_metrics_kind": prefix,
            "run_dir": str(self.run_dir),
            "run_id": self.run_dir.name,
            # What defines the experiment (model and data arguments, algorithm, seed, ...), for comparing runs.
            "fingerprint": self.trainer.fed_fingerprint,
        }
        for callback in self.trainer.callbacks:
            if isinstance(callback, FedCallback):
                payload.update(callback.summary_entries(self.trainer))
        path = self.run_dir / "summary.json"
        _write_json_atomic(path, payload)
        return path


__all__ = ["RunReporter", "publish_figure", "resolve_run_dir"]
