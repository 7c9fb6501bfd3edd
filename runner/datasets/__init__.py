"""Datasets on the host: ``matrun data import`` / ``matrun data list`` stage real datasets
into the data directory as the IDX files cells read.

- ``staging``: import (IDX copied, pickles converted), validation as a cell will read the
  files, the listing, and the default data directory.
- ``safe_pickle``: an unpickler of numpy arrays that needs no numpy and runs nothing.

Dataset names, shapes and the IDX reader belong to the harness
(``runner/harness/datasets.py``); this package derives its list from there.

Imports: ``matrun.errors``, the harness (``datasets``, ``errors``) and
``matrun.warehouse.bundles.write`` (``fsync_dir``).
"""
