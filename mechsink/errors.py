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
