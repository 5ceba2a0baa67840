"""The round's result object and the round-axis declaration of whatever a round logs."""

from typing import Any

from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from lightning_fed import FedCallback
from lightning_fed.client_store import ClientStateStore
from lightning_fed.context import RoundContext, RoundResult
from lightning_fed.run.reporting import RunReporter


class _Reports(FedCallback):
    """Adds a metric of its own from a round-level hook, as an algorithm does."""

    def on_round_end(self, trainer: Any, pl_module: Any, round_ctx: Any, metrics: dict[str, float]) -> None:
        metrics["myalgo/server_norm"] = 1.0


def test_round_result_properties():
    ctx = RoundContext(round_idx=2, client_ids=[4, 1, 3], global_params={}, num_samples={}, store=ClientStateStore())
    ctx.rejected.append(1)
    result = RoundResult(ctx, {"round": 3.0})
    assert result.round_idx == 2
    assert result.sampled == [4, 1, 3]
    assert result.accepted == [4, 3]
    assert result.rejected == [1]
    assert result.client_results == {} and result.client_prefix == "client/"


def test_fit_exposes_the_last_round_result(tmp_path):
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=[_Reports()])
    trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=4))
    result = trainer.last_round_result
    assert result is not None and result.round_idx == 1
    assert len(result.sampled) == 2 and result.accepted == result.sampled
    # finish_round adds on_round_end's entries to the very dict the history keeps.
    assert result.metrics is trainer.federation_state.history[-1]
    assert result.metrics["myalgo/server_norm"] == 1.0
    assert sorted(result.client_results) == [0, 1, 2, 3]
    assert result.client_prefix == "client/"


class _FakeExperiment:
    def __init__(self) -> None:
        self.defined: list[tuple[str, str | None]] = []

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.defined.append((name, step_metric))


def test_every_logged_group_goes_on_the_round_axis_once(tmp_path, monkeypatch):
    from lightning_fed.run import reporting

    experiment = _FakeExperiment()
    fake_logger = type("L", (), {"experiment": experiment, "log_metrics": lambda self, metrics, step: None})()
    monkeypatch.setattr(reporting, "wandb_loggers", lambda loggers: [fake_logger])
    trainer = fast_trainer(tmp_path, num_rounds=1)
    reporter = RunReporter.__new__(RunReporter)
    reporter.trainer = trainer
    reporter._round_axis = set()
    reporter.log_round({"round": 1.0, "scaffold/server_control_norm": 0.5, "qfedavg/loss": 0.2, "val_loss": 0.3})
    reporter.log_round({"round": 2.0, "scaffold/server_control_norm": 0.4, "newalgo/x": 1.0})
    on_round_axis = [name for name, step in experiment.defined if step == "round"]
    assert sorted(on_round_axis) == ["newalgo/*", "qfedavg/*", "scaffold/*", "val_loss"]
