"""The errors mechsink raises for people: each says what was wrong and what to do next."""

from __future__ import annotations


class MechsinkError(Exception):
    """Base class: every error mechsink raises on purpose derives from this."""


class UnknownModelError(MechsinkError, KeyError):
    """A model name that the zoo does not know."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class AssetError(MechsinkError):
    """A file could not be taken out of a registry package, or failed its hash check."""


class BadInputError(MechsinkError, ValueError):
    """An argument has the wrong shape, range or kind."""


class MissingDependencyError(MechsinkError, ImportError):
    """An optional dependency is needed for this feature and is not installed."""


class MechsinkWarning(UserWarning):
    """Base class: every warning mechsink gives on purpose derives from this (the test suite
    turns them into errors, so a test that expects one says so)."""


def warn(message: str, category: type[Warning] = MechsinkWarning) -> None:
    """``warnings.warn`` attributed to the first caller outside mechsink, so the warning names
    the user's line (a script's, a notebook cell's) and not a line of mechsink's source."""
    import os
    import sys
    import warnings

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def ours(filename: str) -> bool:  # mechsink, or the type checkers' wrappers around it
        return (os.path.abspath(filename).startswith(here) or filename.startswith("<@beartype")
                or f"{os.sep}jaxtyping{os.sep}" in filename)

    level, frame = 2, sys._getframe(1)  # 2: the caller of this function
    while frame is not None and ours(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
