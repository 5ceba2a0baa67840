"""The stacked optimizer step equals torch.optim's own, client by client, and refuses what it does not reproduce."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from lightning_fed.functional.stacked_optim import hyperparameters, stacked_step_, unsupported_optimizer

CLIENTS = 3
SHAPES = [(4, 3), (3,)]

OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd_dampening": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.3),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_decay": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_client_follows_its_own_torch_optimizer(name):
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(CLIENTS, *shape, generator=generator) for shape in SHAPES]
    grads = [[torch.randn(CLIENTS, *shape, generator=generator) for shape in SHAPES] for _ in range(5)]
    # Reference: one torch optimizer per client, on that client's slices.
    references = []
    for client in range(CLIENTS):
        params = [torch.nn.Parameter(s[client].clone()) for s in start]
        optimizer = OPTIMIZERS[name](params)
        for step_grads in grads:
            for param, grad in zip(params, step_grads):
                param.grad = grad[client].clone()
            optimizer.step()
        references.append([p.detach() for p in params])
    # Stacked: every client at once.
    template = OPTIMIZERS[name]([torch.nn.Parameter(torch.zeros(1))])
    assert unsupported_optimizer(template) is None
    hp = hyperparameters(template.param_groups[0], template)
    stacked = [s.clone() for s in start]
    state: list[dict[str, torch.Tensor]] = [{} for _ in stacked]
    for step, step_grads in enumerate(grads):
        stacked_step_(stacked, step_grads, state, step, hp)
    for client in range(CLIENTS):
        for got, expected in zip(stacked, references[client]):
            torch.testing.assert_close(got[client], expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: torch.optim.RMSprop(p, lr=0.1), "RMSprop"),
        (lambda p: torch.optim.Adam(p, lr=0.1, amsgrad=True), "amsgrad"),
        (lambda p: torch.optim.SGD(p, lr=0.1, maximize=True), "maximize"),
        (lambda p: torch.optim.Adam(p, lr=torch.tensor(0.1)), "tensor learning rate"),
    ],
)
def test_what_it_does_not_reproduce_is_named(make, reason):
    assert reason in unsupported_optimizer(make([torch.nn.Parameter(torch.zeros(1))]))
