"""What ``fedunlearn-run`` shows of the stream ``flwr run --stream`` prints.

The stream mixes our progress lines (``[fedunlearn] ...`` and the tables after them) with lines of
Flower (its CLI's chatter and its logger's ``INFO :`` lines, half the output of a run) and of Ray
(warnings its worker prints when the simulation starts). By default only ours are shown;
``--verbose`` shows everything. A line nobody recognises is always shown: an error or a traceback
must never be hidden. One exception: once the app printed ``[fedunlearn] error: MESSAGE`` (a
refusal, already said in one line), what Flower prints after it is held back, and dropped at the
end only if it is the traceback of that same error (its last exception line holds MESSAGE): any
other error still reaches the user. Flower colours its levels with ANSI escape codes; they are removed unless
the output is a terminal and ``NO_COLOR`` (https://no-color.org) is unset.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TextIO

#: An ANSI escape sequence (colour, cursor): CSI ... final byte.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

#: Lines of Flower and Ray that a user of fedunlearn does not need (after ANSI codes are removed).
THIRD_PARTY_LINES = tuple(
    re.compile(pattern)
    for pattern in (
        r"^(DEBUG|INFO)\s*:",  # Flower's logger; its warnings and errors are kept, but for ...
        # ... two known ones: the SuperNode default (the runner sizes the federation itself) and
        # the evaluation fraction (evaluation is the server's, on its test set)
        r"^WARNING\s*:\s+Since flwr \S+, default simulated SuperNodes changed",
        r"^WARNING\s*:\s+fraction_evaluate is set to 0\.0\.",
        # Ray ending the client actors once the run is over: the normal end, not a problem
        r"^\(ClientAppActor pid=\d+\) WARNING\s*:\s+Manually terminating ClientAppActor",
        r"^Flower configuration not found",
        r"^Starting local SuperLink",
        r"^Using SuperLink",
        r"^Successfully (started run|installed) ",
        r"^Loading project configuration",
        r"/site-packages/ray/.*Warning: ",  # Ray's warnings at start-up (warnings.warn format) ...
        r"^\s*$",  # the CLI's blank separator lines
    )
)
#: ... and the source line Python prints under such a warning.
_WARNING_SOURCE = re.compile(r"^\s+warnings\.warn\(")
#: The app's own one-line refusal (server.server_app logs every FedUnlearnError so).
OUR_ERROR = re.compile(r"^\[fedunlearn\] error: (.+)$")
#: The last line of a Python traceback: ``package.module.ErrorName: message``.
_EXCEPTION_LINE = re.compile(r"^(?:\w+\.)*[A-Z]\w*: (.+)$")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return ANSI_ESCAPE.sub("", text)


def use_color(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether colour codes may reach ``stream``: it is a terminal and ``NO_COLOR`` is unset or
    empty."""
    environ = os.environ if environ is None else environ
    if environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ConsoleFilter:
    """Decides, line by line, what of ``flwr run --stream``'s output reaches the user.

    Parameters
    ----------
    verbose : bool
        Show Flower's and Ray's lines too.
    color : bool
        Keep ANSI colour codes (see :func:`use_color`).
    """

    def __init__(self, *, verbose: bool = False, color: bool = False) -> None:
        self.verbose, self.color = verbose, color
        self._after_warning = False
        #: The message of the app's ``[fedunlearn] error:`` line, once one was printed.
        self.error: str | None = None
        self._held: list[str] = []

    def is_third_party(self, line: str) -> bool:
        """Whether ``line`` (one line, ANSI codes allowed) is Flower's or Ray's."""
        plain = strip_ansi(line)
        after_warning, self._after_warning = self._after_warning, False
        if after_warning and _WARNING_SOURCE.match(plain):
            return True
        if any(pattern.search(plain) for pattern in THIRD_PARTY_LINES):
            self._after_warning = "Warning: " in plain
            return True
        return False

    def __call__(self, line: str) -> str | None:
        """The text to print for ``line``, or None to print nothing (or nothing yet: see
        :meth:`finish`)."""
        plain = strip_ansi(line).rstrip()
        found = OUR_ERROR.match(plain)
        if found and self.error is None:
            self.error = found.group(1)
        elif self.error is not None and not self.verbose and not plain.startswith("[fedunlearn]"):
            self._held.append(line)
            return None
        hidden = self.is_third_party(line)
        if hidden and not self.verbose:
            return None
        return line if self.color else strip_ansi(line)

    def finish(self) -> str:
        """What is left to print once the stream ended: the lines held back after the app's
        error line, unless they only repeat that error as a traceback."""
        held, self._held = self._held, []
        plain = [strip_ansi(line).rstrip() for line in held]
        raised = [m.group(1) for m in map(_EXCEPTION_LINE.match, plain) if m]
        if raised and self.error is not None and all(self.error in r for r in raised):
            return ""
        kept = [line for line in held if not self.is_third_party(line)]
        return "".join(line if self.color else strip_ansi(line) for line in kept)
