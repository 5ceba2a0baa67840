"""benchmarks/batched_ceiling.py: every stacked layout computes the clients' own steps, and a tiny run reports."""

import pytest
import torch

from benchmarks.batched import make_backbone
from benchmarks.batched_ceiling import (
    LAYOUTS,
    Stacked,
    alone_step,
    check_layout,
    layers_of,
    main,
    step_sizes,
    training_examples,
)


def test_an_epoch_is_full_batches_and_a_smaller_last_one() -> None:
    assert step_sizes(60, 16) == [16, 16, 16, 12]
    assert step_sizes(32, 16) == [16, 16]


def test_clients_train_on_what_the_framework_benchmark_trains_them_on() -> None:
    assert training_examples(60, 16) == 48  # benchmarks/batched.py's clients hold 20 % out for testing


@pytest.mark.parametrize(("name", "layout"), [(n, layout) for n, layouts in LAYOUTS.items() for layout in layouts])
def test_a_stacked_step_is_every_clients_own_sgd_step(name: str, layout: str) -> None:
    torch.manual_seed(0)
    models = [make_backbone(name) for _ in range(3)]
    stacked = Stacked(models, layout)
    x, y = torch.randn(3, 5, 1, 28, 28), torch.randint(0, 10, (3, 5))
    stacked.step(x, y)
    for i, model in enumerate(models):
        alone_step(model, torch.optim.SGD(model.parameters(), lr=0.05), x[i], y[i])
        own = [p for layer in layers_of(model) for p in layer.parameters(recurse=False)]
        assert len(own) == len(stacked.params)
        for got, expected in zip(stacked.params, own):
            torch.testing.assert_close(got[i], expected, rtol=1e-4, atol=1e-6)


def test_the_check_refuses_a_layout_that_computes_something_else(monkeypatch: pytest.MonkeyPatch) -> None:
    data = (torch.randn(2, 8, 1, 28, 28), torch.randint(0, 10, (2, 8)))
    check_layout("2nn", "bmm", data)  # the real layout passes
    forward = Stacked.forward
    monkeypatch.setattr(Stacked, "forward", lambda self, x: 1.01 * forward(self, x))
    with pytest.raises(AssertionError):
        check_layout("2nn", "bmm", data)


def test_a_tiny_run_prints_each_way_and_the_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--models", "lenet5", "--groups", "2", "--clients-timed", "4", "--samples-per-client", "6"]
         + ["--batch-size", "4", "--repeats", "1", "--no-framework"])  # fmt: skip
    out = capsys.readouterr().out
    for way in ("| alone |", "| grouped, G = 2 |", "| im2col, G = 2 |", "lenet5: arithmetic ceiling", "float64 sum"):
        assert way in out, out
