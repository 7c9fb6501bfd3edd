"""The harness's exceptions: what ``__main__`` turns into an exit code and a one-line message."""

from __future__ import annotations


class HarnessError(Exception):
    """A failure the user can act on (missing data, unusable device); exit code 1."""


class SpecError(HarnessError):
    """``spec.json`` is unreadable, of an unknown version, or asks for something unknown; exit code 2."""


class DataError(HarnessError):
    """A dataset is missing or its files are not what they claim to be."""
