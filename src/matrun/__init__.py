"""matrun: a containerized matrix runner with a DuckDB result warehouse.

This package is the import root.  The top-level folders of the repository are mapped
into it by setuptools (``runner/`` -> ``matrun.runner``, ``warehouse/`` ->
``matrun.warehouse``, ``reports/`` -> ``matrun.reports``, ``images/`` -> ``matrun.images``).

Keep this module free of imports: the in-cell harness (``matrun.runner.harness``) is
imported through it inside framework environments that have nothing but the standard
library and the framework.
"""

__version__ = "0.1.0"
