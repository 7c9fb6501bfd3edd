"""Planning: from matrix.toml to the cells a sweep runs, with their ids.  Pure, but for
reading the matrix, the host preflight and the warehouse's history.

- ``params``: the host's registry of cell parameters, built from the harness's declaration
  (``runner/harness/spec.py``) with the frameworks this host can build; how values are spelled.
- ``matrix``: matrix.toml read, checked and expanded into canonical, frozen cells.
- ``overrides``: ``--set KEY=VALUE`` read (``matrix`` checks and applies the values).
- ``presets``: ``preset = "framework-default"``: each framework's own example settings.
- ``identity``: cell ids (identity parameters + environment) and ``plan_cells``.
- ``selection``: ``--where`` parsed and applied.
- ``preflight``: host checks before a sweep (data directory, datasets, CPUs, GPUs).
- ``history``: what earlier runs did, from the warehouse's views (done runs, durations).
- ``overview``: the rows of ``matrun plan`` and ``matrun status``.

Imports: ``matrun.errors``, ``matrun.frameworks``, the harness (``matrun.runner.harness``:
parameters, datasets, cpusets), ``matrun.runner.datasets`` (the data directory),
``matrun.runner.slurm.settings`` (the ``[slurm]`` section), ``matrun.warehouse.db``
(``history``) and, for ``overview`` only, ``matrun.runner.executors.registry``.
"""
