"""What one key allows, checked by one validator (scikit-learn's ``_parameter_constraints``).

Each constraint checks a value already converted to its key's type (:func:`coerce`) and raises
:class:`~fedunlearn.errors.ConfigError` naming the key, the value and :attr:`Constraint.allowed`,
the same text the configuration page shows. Rules across keys are run by
:mod:`fedunlearn.config.rules` (the rules themselves in :mod:`fedunlearn.config.training_rules` and
:mod:`fedunlearn.config.request_rules`).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedunlearn.config.paths import RUN_NAME_ALLOWED, check_path_text, check_run_name
from fedunlearn.errors import ConfigError, did_you_mean

Choices = Sequence[str] | Callable[[], Sequence[str]]
#: Flower's run config holds 64-bit integers; a larger one fails when the run is submitted.
INT64 = (-(2**63), 2**63 - 1)


class Constraint:
    """What a key allows. :meth:`check` raises ``ConfigError(key, value, allowed)``."""

    @property
    def allowed(self) -> str:
        raise NotImplementedError

    def check(self, key: str, value: Any) -> None:
        raise NotImplementedError

    def _refuse(self, key: str, value: Any) -> None:
        raise ConfigError(key, value, self.allowed)


class Flag(Constraint):
    """``true`` or ``false`` (the type conversion already refused anything else)."""

    allowed = "true or false"

    def check(self, key: str, value: Any) -> None:
        return None


class ByRule(Constraint):
    """A value only a rule across keys can judge (e.g. partition ids need ``num-clients``)."""

    def __init__(self, allowed: str) -> None:
        self._allowed = allowed

    @property
    def allowed(self) -> str:
        return self._allowed

    def check(self, key: str, value: Any) -> None:
        return None


class Options(Constraint):
    """One of a list of names; ``choices`` may be a callable, read at each check."""

    def __init__(self, choices: Choices) -> None:
        self._choices = choices

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._choices() if callable(self._choices) else self._choices)

    @property
    def allowed(self) -> str:
        return f"one of {', '.join(self.choices)}"

    def check(self, key: str, value: Any) -> None:
        if value not in self.choices:
            raise ConfigError(key, value, self.allowed + did_you_mean(value, self.choices))


class NameOrImport(Options):
    """A registered name (``choices``, read at each check) or a user's own ``module:function``
    (imported and checked at launch, by a rule); ``allowed`` says both."""

    def __init__(self, choices: Choices, allowed: Callable[[], str]) -> None:
        super().__init__(choices)
        self._allowed = allowed

    @property
    def allowed(self) -> str:
        return self._allowed()

    def check(self, key: str, value: Any) -> None:
        from fedunlearn.dataset_spec import is_import_reference

        if value in self.choices or is_import_reference(value):
            return
        raise ConfigError(key, value, self.allowed + did_you_mean(value, self.choices))


def _bound(value: float) -> str:
    if not isinstance(value, float):
        return str(value)
    if value.is_integer() and abs(value) < 1e5:
        return repr(value)  # 0.0, 1.0: a float key shows a float bound
    return f"{value:g}"


class Interval(Constraint):
    """A whole number (``kind=int``) or a number (``kind=float``) between ``low`` and ``high``
    (``None``: unbounded), each end ``closed`` ("both", "left", "right", "neither") or open;
    ``off``, a value outside them, that turns the setting off (``max-update-ratio = 0``)."""

    def __init__(
        self,
        kind: type,
        low: float | None = None,
        high: float | None = None,
        *,
        closed: str = "both",
        note: str = "",
        off: float | None = None,
    ) -> None:
        self.kind, self.low, self.high, self.note, self.off = kind, low, high, note, off
        self.closed_low = closed in ("both", "left")
        self.closed_high = closed in ("both", "right")

    @property
    def allowed(self) -> str:
        noun = "a whole number" if self.kind is int else "a number"
        if self.high is None:
            text = f"{noun} {'>=' if self.closed_low else '>'} {_bound(self.low)}"
        elif self.low is None:
            text = f"{noun} {'<=' if self.closed_high else '<'} {_bound(self.high)}"
        else:
            left, right = "[" if self.closed_low else "(", "]" if self.closed_high else ")"
            text = f"{noun} in {left}{_bound(self.low)}, {_bound(self.high)}{right}"
        text = text if self.off is None else f"{_bound(self.off)} (off) or {text}"
        return f"{text} ({self.note})" if self.note else text

    def check(self, key: str, value: Any) -> None:
        if self.off is not None and value == self.off:
            return
        low_ok = self.low is None or (value >= self.low if self.closed_low else value > self.low)
        high = self.high
        high_ok = high is None or (value <= high if self.closed_high else value < high)
        if not (low_ok and high_ok):
            self._refuse(key, value)


class FolderPath(Constraint):
    """A folder path without control characters or emoji that fits in ``PATH_MAX``; empty only
    where ``required`` is false."""

    def __init__(self, *, required: bool, example: str = "") -> None:
        self.required, self.example = required, example

    @property
    def allowed(self) -> str:
        what = "a folder path without control characters or emoji, at most 3072 bytes"
        return f"{what}, e.g. {self.example}" if self.required else f"empty or {what}"

    def check(self, key: str, value: str) -> None:
        if not self.required and not value:
            return
        check_path_text(key, value)
        if self.required and not value.strip():
            raise ConfigError(key, value, f"a folder path, e.g. {self.example}")


class Text(Constraint):
    """A non-empty name of printable characters (a column's name), at most 200 of them."""

    allowed = "a non-empty name of printable characters, at most 200, e.g. label"

    def check(self, key: str, value: str) -> None:
        if not isinstance(value, str) or not value or len(value) > 200 or not value.isprintable():
            raise ConfigError(key, value, self.allowed)


class RunName(Constraint):
    """A portable folder name, or empty."""

    allowed = RUN_NAME_ALLOWED

    def check(self, key: str, value: str) -> None:
        check_run_name(key, value)


class NameList(Constraint):
    """Comma-separated names from ``choices`` (case and spaces ignored); empty only if
    ``required`` is false. :meth:`parse` returns them in the order given, once each."""

    def __init__(self, choices: Choices, *, required: bool) -> None:
        self.options, self.required = Options(choices), required

    @property
    def allowed(self) -> str:
        return f"a comma-separated subset of {', '.join(self.options.choices)}"

    def parse(self, key: str, value: str) -> list[str]:
        names = [m for m in value.replace(" ", "").lower().split(",") if m]
        wrong = [m for m in names if m not in self.options.choices]
        if wrong or (self.required and not names):
            hint = did_you_mean(wrong[0], self.options.choices) if wrong else ""
            raise ConfigError(key, value, self.allowed + hint)
        return list(dict.fromkeys(names))

    def check(self, key: str, value: str) -> None:
        self.parse(key, value)


class PositiveNumbers(Constraint):
    """Comma-separated finite numbers > 0; :meth:`parse` returns them sorted, once each."""

    allowed = "comma-separated numbers > 0, e.g. '0.01,0.1,1,10,100'"

    def parse(self, key: str, value: str) -> list[float]:
        try:
            numbers_ = [float(f) for f in value.replace(" ", "").split(",") if f]
        except ValueError:
            raise ConfigError(key, value, self.allowed) from None
        if any(not (f > 0 and math.isfinite(f)) for f in numbers_):
            self._refuse(key, value)
        return sorted(set(numbers_))

    def check(self, key: str, value: str) -> None:
        self.parse(key, value)


def validate_parameter_constraints(
    values: Mapping[str, Any], constraints: Mapping[str, Constraint]
) -> None:
    """Check each key of ``values`` that ``constraints`` names, in the constraints' order."""
    for key, constraint in constraints.items():
        if key in values:
            constraint.check(key, values[key])


# ------------------------------------------------------------------ type conversion
def coerce(key: str, value: Any, kind: type) -> Any:
    """Convert a run-config value to ``kind`` (bool, int, float or str), or say what was expected.

    Integer keys take integers (or their decimal text from a command line), never a float: TOML
    reads ``1e9`` and ``5.0`` as floats, and rounding them silently would hide a typo.
    """
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(key, value, "true or false")
    if kind is int:
        return _coerce_int(key, value)
    if kind is float:
        return _coerce_float(key, value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. unlearn-clients=3 from the command line, read as a TOML integer
    if not isinstance(value, str):
        raise ConfigError(key, value, "a string")
    return value


def _coerce_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ConfigError(key, value, "a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(key, value, "a number") from None
    except OverflowError:
        raise ConfigError(key, value, "a finite number") from None
    if not math.isfinite(number):
        raise ConfigError(key, value, "a finite number")
    return number


def _coerce_int(key: str, value: Any) -> int:
    allowed = "a whole number written as one, e.g. 100 (not 100.0, 1e2 or true)"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        number = int(value.strip())
    else:
        raise ConfigError(key, value, allowed)
    if not INT64[0] <= number <= INT64[1]:
        raise ConfigError(key, value, f"{allowed} between -2^63 and 2^63-1 (a 64-bit integer)")
    return number


class TrackingUri(Constraint):
    """Empty, ``run`` or a URI with its scheme (``log-mlflow``: :mod:`fedunlearn.tracking`)."""

    allowed = (
        "empty (off), run (an SQLite store in the run directory, RUN/mlflow.db) or an MLflow "
        "tracking URI with its scheme, e.g. http://localhost:5000 or sqlite:///mlflow.db"
    )

    def check(self, key: str, value: str) -> None:
        if value in ("", "run"):
            return
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:\S+", value):
            self._refuse(key, value)


class NeedsExtra(Constraint):
    """What ``inner`` allows; a value that turns the key on (true, a non-empty text) also needs
    the key's optional package, installed by the extra ``extra``
    (:func:`fedunlearn.tracking.missing_module`): a run asking for a missing one is refused
    before it starts."""

    def __init__(self, inner: Constraint, extra: str) -> None:
        self.inner, self.extra = inner, extra

    @property
    def allowed(self) -> str:
        return f"{self.inner.allowed}; on, it needs pip install 'fedunlearn[{self.extra}]'"

    def check(self, key: str, value: Any) -> None:
        self.inner.check(key, value)
        if value:
            from fedunlearn.tracking import missing_module

            missing = missing_module(key)
            if missing is not None:
                raise ConfigError(key, value, missing)
