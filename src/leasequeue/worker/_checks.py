"""The worker's argument checks (a bad option is a ``TypeError`` or
``ValueError`` naming it, raised before anything changes) and the one-line
name of an error used in logs and bury reasons."""

from __future__ import annotations

import math
from typing import Any, Tuple, Type

__all__ = ["check_exceptions", "check_int", "check_number", "check_positive", "error_name"]


def check_number(value: Any, name: str, *, minimum: float = 0.0, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, not {value!r}")
    if finite and math.isinf(value):
        raise ValueError(f"{name} must be finite, not {value!r}")
    return value


def check_positive(value: Any, name: str) -> float:
    """A finite number > 0 (one message for 0, a negative number, NaN and inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if not (0.0 < value < math.inf):
        raise ValueError(f"{name} must be > 0 and finite, not {value!r}")
    return value


def check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    return value


def check_exceptions(value: Any, name: str) -> Tuple[Type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    try:
        types = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be an exception class or a tuple of them, not {value!r}") from None
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"{name} must hold exception classes, not {t!r}")
    return types


def error_name(error: BaseException) -> str:
    """``ValueError: the message`` (or the class name alone when the message is empty)."""
    text = str(error)
    name = type(error).__qualname__
    return f"{name}: {text}" if text else name
