"""Slurm: the slurm executor, the sweep's asynchronous loop, the node task, the epilog, a test cluster.

Modules (each imports only those above it in this list, plus what is named):

- ``settings``: the ``[slurm]`` section and the ``matrun sweep`` flags over it
  (``SlurmSettings``, ``check_setting``, ``parse_slurm_section``, ``time_limit_minutes``).
- ``state``: Slurm's record of tasks (``TaskState``; squeue / jobcomp / sacct parsers,
  ``query_states``), the Slurm commands (``run_slurm``, ``scancel``, ``cluster_config``,
  ``node_address``) and ``SlurmUnavailable``.
- ``epilog``: the nodes' Epilog (console script ``matrun-slurm-epilog``): removes the containers
  of a task Slurm SIGKILLed, by the label names it defines.  Imports
  ``runner.environments.engine``.
- ``jobs``: what a sweep submitted and what became of it (``Submission``, ``SweepJobs``,
  ``write_result_from_slurm``; ``reconcile`` for ``matrun ingest``, ``cell_progress`` for
  ``matrun status``).  Imports ``runner.executors`` (protocol, the docker executor's
  ``container.json`` name, ``workers``' ``nodes/``) and ``runner.sweep.records``.
- ``executor``: ``SlurmExecutor`` (an ``AsyncExecutor``: job arrays, ``submit``) and the pure
  sbatch arguments (``sbatch_resources``, ``BATCH_SCRIPT``).  Imports ``runner.executors``
  (the local and docker executors a task runs its cell with).
- ``loop``: the sweep's asynchronous loop (``run_async``) and ``matrun cancel``
  (``cancel_sweep``).  Imports ``runner.sweep.records``, ``runner.planning``, the warehouse's
  ``ingest``.
- ``task``: one task of a job array on its node (``python -m matrun.runner.slurm.task``).
- ``cluster``: a local test cluster (``start_cluster`` / ``stop_cluster``) for the tests and
  ``matrun slurm start|stop|status``.

All may import ``matrun.errors`` and ``matrun.warehouse.bundles`` (file names, writers).
Nothing here imports the CLI or ``runner.sweep.run`` (which imports ``loop``).
"""
