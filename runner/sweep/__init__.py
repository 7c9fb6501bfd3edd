"""The sweep: plan what is not done yet, run it through an executor, ingest each run.

Modules:

- ``records``: what both sweep loops share — a run's directory and ``spec.json``
  (``prepare_run``: attempts numbered per results directory), its ``result.json``
  (``write_result``, also used by Slurm tasks), the host (``host_info``), ingesting without
  failing the sweep (``ingest_quietly``), the sweep's lock (``sweep_lock``), the claim of one
  (cell, repeat) shared by every sweep of a results directory (``RunClaim``), the ok runs on
  disk (``ok_runs_on_disk``), ``OSError`` as a user's error (``path_error``), ``SweepEvent``,
  ``SweepSummary`` and ``SweepStopped``.  Imports ``matrun.errors``,
  ``runner.executors.protocol``, ``runner.planning``, ``matrun.warehouse`` (bundles; ``ingest``
  inside ``ingest_quietly``).
- ``run``: ``run_sweep`` and its synchronous loop; an asynchronous executor's runs go to
  ``runner/slurm/loop.py``.  Imports ``records``, ``runner.executors``, ``runner.planning``,
  ``runner.slurm.loop``, ``matrun.warehouse`` (``ingest``, ``bundles.read``).
- ``busy``: a repeat whose run started on a busy machine run again (``[sweep] rerun_busy``,
  ``run_until_clean``), ``started_busy`` read from the bundle's ``result.json``.  Imports
  ``runner.executors.protocol``, ``matrun.warehouse.bundles.layout``.

Nothing here imports the CLI.  ``records`` imports no executor implementation and nothing of
``runner.slurm`` (which imports it).
"""
