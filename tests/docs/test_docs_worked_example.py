"""Runs the worked extension example of the docs ("Writing an algorithm"), so the documented code cannot rot."""

import re
from pathlib import Path

import lightning.pytorch as L
import torch
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule

from lightning_fed import ClientContext, ClientStateStore, FedAvg

PAGE = Path(__file__).parents[2] / "docs" / "writing-an-algorithm.md"


def _example_namespace() -> dict:
    text = PAGE.read_text()
    block = re.search(r"<!-- worked-example -->\s*```python\n(.*?)```", text, re.S)
    assert block, "docs/writing-an-algorithm.md lost its worked example"
    namespace: dict = {}
    exec(compile(block.group(1), str(PAGE), "exec"), namespace)
    return namespace


def _fit(tmp_path, aggregator, callbacks=()):
    L.seed_everything(0)
    module = BoringClassifier()
    trainer = fast_trainer(
        tmp_path, num_rounds=3, clients_per_round=2, aggregator=aggregator, callbacks=list(callbacks)
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=3))
    return global_weights(module), trainer


def test_example_momentum_zero_is_fedavg_and_momentum_changes_the_path(tmp_path):
    example = _example_namespace()
    plain, _ = _fit(tmp_path, FedAvg())
    zero, _ = _fit(tmp_path, example["FedAvgM"](beta=0.0))
    for name, tensor in plain.items():
        torch.testing.assert_close(zero[name], tensor, rtol=0, atol=1e-6)
    heavy, trainer = _fit(tmp_path, example["FedAvgM"](beta=0.9), [example["Proximal"](0.01)])
    assert any(not torch.allclose(heavy[n], t) for n, t in plain.items())
    assert set(trainer.aggregator.state_dict()["velocity"]) >= {"net.0.weight"}
    assert trainer.federation_state.history[-1]["train/proximal"] >= 0.0


def test_example_proximal_gradient_matches_autograd():
    example = _example_namespace()
    module = BoringClassifier()
    params = dict(module.named_parameters())
    anchor = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in params.items()}
    ctx = ClientContext(0, 0, anchor, anchor, 1, ClientStateStore())
    proximal = example["Proximal"](0.5)
    closed = proximal.penalty_gradient(params, ctx)
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    grads = torch.autograd.grad(proximal.penalty(leaves, ctx), list(leaves.values()))
    for (name, _), grad in zip(leaves.items(), grads):
        torch.testing.assert_close(closed[name], grad)
        assert grad.abs().sum() > 0
