import math

import pytest
import torch

from lightning_fed.checks import InvalidArgumentError, check_bool, check_choice, check_instance, check_int, check_real
from lightning_fed.functional.gradients import add_to_grad_
from lightning_fed.utilities.schedule import is_due


@pytest.mark.parametrize("value", [True, 1.5, "3", None, 0, 11])
def test_check_int_rejects_with_name_value_and_range(value):
    with pytest.raises(InvalidArgumentError, match=r"`num_rounds` must be an integer >= 1 and <= 10; got") as info:
        check_int("num_rounds", value, minimum=1, maximum=10)
    assert info.value.argument == "num_rounds"
    assert repr(value) in str(info.value)


def test_check_int_accepts_and_returns_int():
    assert check_int("n", 3, minimum=1) == 3
    assert check_int("n", None, allow_none=True) is None
    assert type(check_int("n", torch.tensor(2).item())) is int


@pytest.mark.parametrize("value", [math.nan, math.inf, False, "0.1", -0.1, 0.0])
def test_check_real_rejects(value):
    with pytest.raises(InvalidArgumentError, match=r"`lr` must be a finite number > 0"):
        check_real("lr", value, minimum=0, exclusive_minimum=True)


def test_check_real_bounds_and_infinity():
    assert check_real("beta", 1, minimum=0, maximum=1) == 1.0
    with pytest.raises(InvalidArgumentError, match=r"< 1"):
        check_real("beta", 1.0, minimum=0, maximum=1, exclusive_maximum=True)
    assert check_real("tau", math.inf, minimum=0, allow_inf=True) == math.inf
    assert check_real("tau", None, allow_none=True) is None


def test_errors_are_value_and_type_errors():
    with pytest.raises(ValueError):
        check_int("n", -1, minimum=0)
    with pytest.raises(TypeError):
        check_int("n", "x")


def test_check_choice_lists_choices():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(InvalidArgumentError, match=r"`mode` must be one of 'a', 'b'; got 'c'"):
        check_choice("mode", "c", ("a", "b"))
    with pytest.raises(InvalidArgumentError):
        check_choice("mode", ["a"], {"a", "b"})


def test_check_bool_and_instance():
    assert check_bool("flag", False) is False
    with pytest.raises(InvalidArgumentError, match="true or false"):
        check_bool("flag", 1)
    with pytest.raises(InvalidArgumentError, match="a torch optimizer"):
        check_instance("optimizer", 3, torch.optim.Optimizer, "a torch optimizer")


@pytest.mark.parametrize(
    ("round_number", "every", "num_rounds", "expected"),
    [(2, 2, 5, True), (3, 2, 5, False), (5, 2, 5, True), (5, 0, 5, False), (5, None, 5, False), (1, 1, 5, True)],
)
def test_is_due(round_number, every, num_rounds, expected):
    assert is_due(round_number, every, num_rounds) is expected


def test_add_to_grad_creates_then_accumulates_in_grad_dtype():
    param = torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)
    add_to_grad_(param, torch.ones(3, dtype=torch.float64))
    assert param.grad.dtype == torch.bfloat16
    add_to_grad_(param, torch.full((3,), 2.0))
    assert torch.equal(param.grad, torch.full((3,), 3.0, dtype=torch.bfloat16))
