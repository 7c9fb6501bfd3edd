"""Executors: where a cell's harness runs, how it is watched, and how its run ended.

Modules:

- ``protocol``: the two executor protocols the sweep picks its loop by — ``SyncExecutor``
  (``run`` one cell) and ``AsyncExecutor`` (``submit`` every run, then wait on ``jobs``) — both
  ``Executor``s (``name``, ``env_id``, ``enforces``, ``refusal``, ``prepare``); ``RunRequest``,
  ``RunOutcome`` (the image a cell ran in included), ``PreparedRun``.
- ``outcomes``: how a run ended, one set of rules for every executor: ``run_status``,
  ``error_tail``, ``refused_outcome``, ``cancelled_outcome``; ``RunAborted`` (a run recorded,
  then the sweep stopped: the Docker engine lost mid-cell).
- ``monitor``: the process-tree monitor (``Monitor``) and the sums both monitors keep
  (``Totals``, ``iowait_percent``); ``monitor_cgroup``: the container's cgroup monitor.
- ``workers``: the launch plan of a multi-worker / multi-node cell (``write_plan``,
  ``exchange_peers``) and the refusal of what one host cannot run (``host_refusal``).
- ``local``: the local executor (a subprocess in the variant's virtual environment; the cell's
  environment, ``cell_environment``, and command line, ``harness_command``).
- ``docker``: the docker executor (a container of the variant's image; ``container_kwargs``;
  the cell's lease on its stdin, ``StdinLease``).
- ``orphans``: ``reap_orphans``, the containers of a sweep that died, stopped, recorded and
  removed before the next local or docker sweep runs anything.
- ``registry``: executors by name (``get_executor``, ``auto``).

Imports: ``matrun.errors``, ``matrun.frameworks``, ``matrun.warehouse.bundles`` (file names,
writers), ``matrun.runner.harness`` (its standard-library launch, distributed-training and
cpuset helpers, the lease's words), ``matrun.runner.environments``.  Three edges go to
``matrun.runner.slurm``: ``docker`` and ``orphans`` take the Slurm label names from
``slurm.epilog`` (the epilog finds a killed task's containers by them) and ``registry`` names
``SlurmExecutor``.
Nothing here imports the sweep or the CLI; the Docker SDK is imported inside the functions
that talk to an engine (an optional dependency).
"""
