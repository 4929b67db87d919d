"""Errors raised by fedunlearn, each carrying what was expected, what was found and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedUnlearnError(Exception):
    """Base class of every error this package raises on purpose."""


class RunStopped(FedUnlearnError):
    """The run was asked to stop (Ctrl-C on ``fedunlearn-run``) and stopped after a completed round."""


class ConfigError(FedUnlearnError, ValueError):
    """A parameter has a value outside what is allowed.

    The message always names the parameter, the value found and what is allowed.
    """

    def __init__(self, parameter: str, value: object, allowed: str) -> None:
        self.parameter = parameter
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {parameter}={value!r}: {allowed}")


class DatasetNotFoundError(FedUnlearnError, FileNotFoundError):
    """A dataset's files are missing or unreadable at the path where they were expected."""

    def __init__(self, dataset: str, expected_path: object, hint: str = "") -> None:
        self.dataset = dataset
        self.expected_path = str(expected_path)
        message = f"dataset {dataset!r} not found or unreadable: expected {self.expected_path}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class TooFewReplies(FedUnlearnError, RuntimeError):
    """Too few usable replies came back for a phase to go on (a round under ``min-reply-fraction``,
    a calibration that no client answered). In training it stops the run; in an unlearning
    request it refuses the method that raised it, and the request goes on with the others."""


class StoreCorruptionError(FedUnlearnError, IOError):
    """A retained blob on disk does not match the checksum recorded for it."""


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the choice closest to ``word`` (a misspelling, Python's
    underscores for hyphens, another case), or ``""`` when none is close."""
    text = str(word).strip().lower().replace("_", "-")
    options = list(choices)
    if text in options:
        return f"; did you mean {text}?"
    close = difflib.get_close_matches(text, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
