"""Argument checks shared by every constructor, with one message format.

Every check raises :class:`InvalidArgumentError` with a message of the form::

    `name` must be <what is allowed>; got <value>.

so that a user reading one line knows which argument to change, what they gave and what is accepted. The error is
both a ``ValueError`` and a ``TypeError``: a wrong type and a wrong value are the same mistake to the user, and
code that catches either keeps working.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any, TypeVar

T = TypeVar("T")


class InvalidArgumentError(ValueError, TypeError):
    """An argument that is out of range, of the wrong type, or not among the allowed choices."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        self.argument = name
        self.value = value
        self.allowed = allowed
        super().__init__(f"`{name}` must be {allowed}; got {value!r}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _bounds(minimum: float | None, maximum: float | None, exclusive_minimum: bool, exclusive_maximum: bool) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if exclusive_minimum else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"{'<' if exclusive_maximum else '<='} {maximum}")
    return " and ".join(parts)


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None, allow_none: bool = False
) -> Any:
    """Checks that ``value`` is an integer (not a bool) within ``[minimum, maximum]``; returns it as ``int``.

    Raises:
        InvalidArgumentError: Naming ``name``, the value and the allowed range.
    """
    if value is None and allow_none:
        return None
    bounds = _bounds(minimum, maximum, False, False)
    allowed = "an integer" + (f" {bounds}" if bounds else "") + (" or None" if allow_none else "")
    if not _is_int(value):
        raise InvalidArgumentError(name, value, allowed)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise InvalidArgumentError(name, value, allowed)
    return int(value)


def check_real(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    allow_inf: bool = False,
    allow_none: bool = False,
) -> Any:
    """Checks that ``value`` is a real number (not a bool, not NaN) within the bounds; returns it as ``float``.

    Args:
        name: The argument's name, as the user spells it.
        value: What was given.
        minimum: Lower bound, inclusive unless ``exclusive_minimum``.
        maximum: Upper bound, inclusive unless ``exclusive_maximum``.
        exclusive_minimum: Whether ``minimum`` itself is excluded.
        exclusive_maximum: Whether ``maximum`` itself is excluded.
        allow_inf: Whether infinities are accepted (they still must satisfy the bounds).
        allow_none: Whether ``None`` is accepted (returned as is).

    Raises:
        InvalidArgumentError: Naming ``name``, the value and the allowed range.
    """
    if value is None and allow_none:
        return None
    bounds = _bounds(minimum, maximum, exclusive_minimum, exclusive_maximum)
    kind = "a number" if allow_inf else "a finite number"
    allowed = kind + (f" {bounds}" if bounds else "") + (" or None" if allow_none else "")
    if not _is_real(value) or math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise InvalidArgumentError(name, value, allowed)
    too_low = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
    too_high = maximum is not None and (value >= maximum if exclusive_maximum else value > maximum)
    if too_low or too_high:
        raise InvalidArgumentError(name, value, allowed)
    return float(value)


def check_choice(name: str, value: T, choices: Collection[Any]) -> T:
    """Checks that ``value`` is one of ``choices``; returns it.

    Raises:
        InvalidArgumentError: Naming ``name``, the value and every allowed choice.
    """
    try:
        allowed = value in choices
    except TypeError:  # an unhashable value looked up in a set
        allowed = False
    if not allowed:
        listed = ", ".join(repr(choice) for choice in choices)
        raise InvalidArgumentError(name, value, f"one of {listed}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Checks that ``value`` is ``True`` or ``False`` (not 0/1, not a string); returns it.

    Raises:
        InvalidArgumentError: Naming ``name`` and the value.
    """
    if not isinstance(value, bool):
        raise InvalidArgumentError(name, value, "true or false")
    return value


def check_instance(name: str, value: Any, types: type | tuple[type, ...], description: str) -> Any:
    """Checks that ``value`` is an instance of ``types``; ``description`` says what is allowed in words.

    Raises:
        InvalidArgumentError: Naming ``name``, the value and ``description``.
    """
    if not isinstance(value, types):
        raise InvalidArgumentError(name, value, description)
    return value


__all__ = ["InvalidArgumentError", "check_bool", "check_choice", "check_instance", "check_int", "check_real"]
