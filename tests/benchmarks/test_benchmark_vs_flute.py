"""benchmarks/vs_flute.py: FLUTE's CNN_FEMNIST client sizes, its model's size, a tiny run's steps and evaluations."""

import math

import pytest
import torch

from benchmarks.vs_flute import ConsecutiveRows, client_sizes, main
from lightning_fed.engine.sampling import UniformClientSampler
from lightning_fed.models import PflCifarCNN


def test_sizes_are_tffs_totals_with_leafs_spread() -> None:
    sizes = client_sizes(3400, 671_585, seed=0)
    assert sizes.dtype == torch.int64 and sizes.shape == (3400,)
    assert int(sizes.sum()) == 671_585  # TFF's Federated EMNIST training images
    assert int(sizes.min()) >= 1
    spread = float(sizes.double().std() / sizes.double().mean())
    assert spread == pytest.approx(88.94 / 226.83, rel=0.1)  # LEAF's FEMNIST writers
    # Long-tailed: the largest writer is several times the mean, and the mean lies above the median.
    assert float(sizes.max()) > 2.5 * float(sizes.double().mean()) > float(sizes.double().median())
    assert torch.equal(sizes, client_sizes(3400, 671_585, seed=0))
    assert not torch.equal(sizes, client_sizes(3400, 671_585, seed=1))


def test_sizes_need_an_image_per_client() -> None:
    with pytest.raises(ValueError, match="one"):
        client_sizes(10, 9)


def test_clients_own_consecutive_rows_of_their_sizes() -> None:
    parts = ConsecutiveRows(torch.tensor([2, 1, 3])).partition(torch.zeros(6, dtype=torch.int64))
    assert [p.tolist() for p in parts] == [[0, 1], [2], [3, 4, 5]]


def test_model_has_flutes_parameter_count() -> None:
    # FLUTE's CNN_DropOut docstring sums 320 + 18 496 + 1 179 776 + 1 290 = 1 199 882 with 10 outputs; FEMNIST's
    # 62 outputs make the last layer 128 x 62 + 62.
    flute = 320 + 18_496 + 1_179_776 + 128 * 62 + 62
    assert sum(p.numel() for p in PflCifarCNN(in_channels=1, num_classes=62, image_size=28).parameters()) == flute


def test_a_tiny_run_takes_the_configurations_steps_and_evaluations(capsys: pytest.CaptureFixture[str]) -> None:
    clients, cohort, rounds, batch = 50, 3, 2, 20
    results = main(
        ["--rounds", str(rounds), "--clients", str(clients), "--cohort", str(cohort), "--test-examples", "30"]
        + ["--eval-every", "1", "--parallelism", "1", "auto"]
    )
    sizes = client_sizes(clients, round(671_585 * clients / 3400), seed=0)
    sampler = UniformClientSampler(cohort, seed=0)
    steps = sum(math.ceil(int(sizes[c]) / batch) for r in range(rounds) for c in sampler.sample(r, clients))
    assert [r.name for r in results] == [
        "lightning_fed, client_parallelism=1",
        "lightning_fed, client_parallelism=auto",
    ]
    for result in results:
        assert result.steps == steps
        assert result.rounds == rounds
        assert (result.evaluations, result.eval_examples) == (2, 2 * 30)
        assert 0 < result.eval_s < result.rounds_s < result.end_to_end_s
    table = capsys.readouterr().out
    assert "| FLUTE (NCCL), published |" in table and "| 0:08:22 |" in table
    assert "| FedML 0.7.303 (MPI), published |" in table and "| 5:49:52 |" in table
