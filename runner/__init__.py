"""Host side of matrun, one folder per concern (docs/ARCHITECTURE.md):

- ``cli/``: the ``matrun`` command line (the top layer; nothing imports it).
- ``planning/``: matrix.toml into cells with ids; slices, preflight, what earlier runs did.
- ``environments/``: matrun's home and the staged harness, local virtual environments, image
  build contexts, builds, probes, the Docker engine.
- ``datasets/``: real datasets staged into the data directory cells read.
- ``executors/``: the executor protocols, the local and docker executors, the monitors.
- ``slurm/``: the slurm executor, the asynchronous sweep loop, the node task, the epilog,
  the test cluster.
- ``sweep/``: the sweep over an executor, resumable, ingesting each run.
- ``harness/``: the in-cell side: standard library + framework only, imports nothing from
  here (the bottom layer, which the host may import).

The host side may import ``matrun.errors``, ``matrun.frameworks``, ``matrun.warehouse`` and
its own folders; only ``cli/`` imports ``matrun.reports``.
"""
