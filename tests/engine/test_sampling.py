import pytest

from lightning_fed.engine.sampling import UniformClientSampler


def test_same_seed_same_round_same_clients_regardless_of_history():
    a, b = UniformClientSampler(5, seed=3), UniformClientSampler(5, seed=3)
    for r in range(4):
        a.sample(r, 50)
    assert a.sample(7, 50) == b.sample(7, 50)


def test_rounds_and_seeds_differ_and_samples_are_distinct_sorted_ids():
    sampler = UniformClientSampler(10, seed=0)
    draws = [sampler.sample(r, 100) for r in range(5)]
    assert all(len(set(d)) == 10 and d == sorted(d) and all(0 <= c < 100 for c in d) for d in draws)
    assert len({tuple(d) for d in draws}) > 1
    assert UniformClientSampler(10, seed=1).sample(0, 100) != draws[0]


def test_fraction_rounds_up_and_all_clients_when_count_equals_population():
    assert len(UniformClientSampler(0.25).sample(0, 10)) == 3
    assert UniformClientSampler(10).sample(3, 10) == list(range(10))


def test_state_dict_restores_the_seed():
    source = UniformClientSampler(3, seed=11)
    target = UniformClientSampler(3, seed=0)
    target.load_state_dict(source.state_dict())
    assert target.sample(2, 20) == source.sample(2, 20)


@pytest.mark.parametrize("value", [0, -1, 1.5, 0.0, True, "3"])
def test_bad_clients_per_round_is_rejected(value):
    with pytest.raises((ValueError, TypeError), match="clients_per_round"):
        UniformClientSampler(value)


def test_more_clients_per_round_than_clients_names_the_argument():
    with pytest.raises(ValueError, match="clients_per_round=12.*10 registered"):
        UniformClientSampler(12).sample(0, 10)


def test_bad_seed_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        UniformClientSampler(3, seed=1.5)
