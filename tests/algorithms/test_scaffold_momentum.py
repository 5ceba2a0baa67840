"""SCAFFOLD with stateful optimizers: the correction acts on the weights after the step, never through momentum.

The example is the one that exposed the bug: four heterogeneous quadratic clients, F_i(w) = h_i/2 ||w - a_i||^2,
full participation, K = 20 local steps, SGD with momentum 0.9. With the correction in ``.grad`` the control error
grows like (A - 1)^r with A ~ 1/(1 - beta) and the run diverges; applied after the step it converges to the
minimiser of sum_i F_i.
"""

from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from lightning_fed import FederatedTrainer
from lightning_fed.aggregators import FedAvg
from lightning_fed.callbacks import Scaffold
from lightning_fed.callbacks.scaffold import _ClientControl, is_plain_sgd
from lightning_fed.datamodules import DatasetFederated, ShardPartitioner, TensorClassificationDataset
from lightning_fed.hooks import GroupStep

TARGETS = torch.tensor([[4.0, 0.0], [0.0, 3.0], [-2.0, -1.0], [1.0, -4.0]])
CURVATURES = torch.tensor([1.0, 2.0, 0.5, 1.5])
OPTIMUM = (CURVATURES[:, None] * TARGETS).sum(0) / CURVATURES.sum()


class Quadratic(L.LightningModule):
    """A batch row is ``[a_1, a_2, h]``; the loss is the batch mean of h/2 ||w - a||^2."""

    def __init__(self, make_optimizer: Any) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))
        self.make_optimizer = make_optimizer

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        rows, _ = batch
        return (0.5 * rows[:, 2] * ((self.w - rows[:, :2]) ** 2).sum(1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.parameters())


def _quadratic_clients() -> DatasetFederated:
    per_client = 10  # identical rows, so every local step sees the exact gradient
    rows = torch.cat([TARGETS, CURVATURES[:, None]], 1).repeat_interleave(per_client, 0)
    labels = torch.arange(4).repeat_interleave(per_client)
    return DatasetFederated(
        TensorClassificationDataset(rows, labels),
        None,
        4,
        ShardPartitioner(4, 1),
        batch_size=8,
        client_test_fraction=0.0,
        client_test_size=2,
    )


def _fit(tmp_path, make_optimizer, rounds: int, callbacks: list[Any]) -> FederatedTrainer:
    module = Quadratic(make_optimizer)
    trainer = FederatedTrainer(
        num_rounds=rounds,
        clients_per_round=4,
        local_steps=20,
        aggregator=FedAvg(weighting="uniform"),
        callbacks=callbacks,
        eval_every_n_rounds=0,
        client_eval="none",
        seed=0,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=_quadratic_clients())
    return trainer


def _run(tmp_path, make_optimizer, rounds: int, through_grad: bool | None = None) -> tuple[torch.Tensor, int]:
    scaffold = Scaffold()
    if through_grad is not None:
        # Reproduces the old behaviour (correction inside the optimizer step) to show the test can tell.
        original = scaffold.on_fit_start

        def forced(trainer: Any, module: Any) -> None:
            original(trainer, module)
            scaffold._through_grad = through_grad

        scaffold.on_fit_start = forced  # type: ignore[method-assign]
    trainer = _fit(tmp_path, make_optimizer, rounds, [scaffold])
    return trainer.lightning_module.w.detach().clone(), trainer.federation_state.rejected_total


def _momentum(lr: float) -> Any:
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def _fedavg(tmp_path, make_optimizer, rounds: int) -> torch.Tensor:
    return _fit(tmp_path, make_optimizer, rounds, []).lightning_module.w.detach().clone()


def test_momentum_0_9_stays_bounded_where_the_correction_through_momentum_diverges(tmp_path):
    w, rejected = _run(tmp_path / "after_step", _momentum(0.02), rounds=40)
    assert rejected == 0 and (w - OPTIMUM).norm() < 1.0
    old, old_rejected = _run(tmp_path / "through_grad", _momentum(0.02), rounds=40, through_grad=True)
    assert old_rejected > 0 or not torch.isfinite(old).all() or (old - OPTIMUM).norm() > 1e3


def test_momentum_0_9_reduces_client_drift_below_fedavg(tmp_path):
    # A fresh momentum buffer amplifies early and late steps differently, so with heterogeneous curvature the fixed
    # point carries a bias that grows with the learning rate; at a small one SCAFFOLD must still beat FedAvg.
    w, _ = _run(tmp_path / "scaffold", _momentum(0.005), rounds=40)
    drifted = _fedavg(tmp_path / "fedavg", _momentum(0.005), rounds=40)
    assert (w - OPTIMUM).norm() < 0.7 * (drifted - OPTIMUM).norm()


def test_plain_sgd_removes_client_drift_exactly(tmp_path):
    w, _ = _run(tmp_path, lambda params: torch.optim.SGD(params, lr=0.02), rounds=40)
    torch.testing.assert_close(w, OPTIMUM, rtol=0, atol=1e-4)


def test_adam_is_accepted_and_heads_for_the_optimum(tmp_path):
    w, rejected = _run(tmp_path, lambda params: torch.optim.Adam(params, lr=0.01), rounds=20)
    # Adam moves about lr per step whatever the gradient: the run must only head for the optimum, finitely.
    assert rejected == 0 and torch.isfinite(w).all()
    assert (w - OPTIMUM).norm() < 0.95 * OPTIMUM.norm()


def test_after_step_correction_is_minus_lr_times_c_minus_c_i(tmp_path):
    """One step of Adam on a client with non-zero controls: y = adam_step(x) - lr (c - c_i), exactly."""
    scaffold = Scaffold()
    module = Quadratic(lambda params: torch.optim.Adam(params, lr=0.1))
    optimizer = module.configure_optimizers()
    scaffold._through_grad = False
    ctx = SimpleNamespace(extras={"scaffold": _ClientControl({}, {"w": torch.tensor([0.5, -2.0])})})
    reference = torch.nn.Parameter(module.w.detach().clone())
    reference_opt = torch.optim.Adam([reference], lr=0.1)
    for param, opt in ((module.w, optimizer), (reference, reference_opt)):
        param.grad = torch.tensor([1.0, 1.0])
        opt.step()
    scaffold.on_client_after_optimizer_step(None, module, GroupStep.for_client(module, ctx, optimizer))
    torch.testing.assert_close(module.w.detach(), reference.detach() - 0.1 * torch.tensor([0.5, -2.0]), rtol=0, atol=0)
    # The optimizer's state saw the raw gradient only.
    torch.testing.assert_close(optimizer.state[module.w]["exp_avg"], reference_opt.state[reference]["exp_avg"])


@pytest.mark.parametrize(
    ("make", "plain"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), True),
        (lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=1e-4), True),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), False),
        (lambda p: torch.optim.Adam(p, lr=0.1), False),
    ],
)
def test_only_plain_sgd_takes_the_gradient_path(make, plain):
    assert is_plain_sgd(make([torch.nn.Parameter(torch.zeros(1))])) is plain
