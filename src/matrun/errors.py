"""The error hierarchy.  Library code raises these; only the CLI prints them.

``exit_code`` is what the CLI exits with: 2 for bad input (nothing was run or written),
1 for a failure while doing the work.
"""

from __future__ import annotations


class MatrunError(Exception):
    """Base class: a message a user can act on."""

    exit_code = 1


class InputError(MatrunError):
    """Bad user input: a flag, a file, a query.  Nothing was run."""

    exit_code = 2


class MatrixError(InputError):
    """matrix.toml is malformed or describes something impossible."""


class QueryError(InputError):
    """A SQL query given by the user failed."""


class DataError(MatrunError):
    """A dataset is missing or malformed."""


class EnvironmentBuildError(MatrunError):
    """A framework environment (virtual env or image) could not be built."""


class WarehouseError(MatrunError):
    """The DuckDB warehouse could not be opened or written."""


class WarehouseLocked(WarehouseError):
    """Another process holds the warehouse for writing."""


class NotAWarehouse(InputError, WarehouseError):
    """The warehouse path names something that is not a matrun warehouse (a file of another
    kind, a directory without a DuckLake catalog, a path that does not exist for a command
    that only reads): bad input, exit 2; found without writing anything."""


class BundleError(MatrunError):
    """A result bundle on disk is corrupt, half-written or of an unknown schema."""


class SweepLocked(MatrunError):
    """Another sweep is running on the same results directory."""
