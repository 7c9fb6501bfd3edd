"""``matrun doctor``: the host checked against what a matrix needs, each problem with what to do.

Modules:

- ``checks``: one check each (``Check``: name, ok / warn / fail, what was found, what to do):
  the Docker engine, the NVIDIA container runtime, GPUs and the CUDA each variant's image needs
  against the driver, the cgroup controllers the docker monitor reads, the Slurm client and
  controller, datasets, environments, images, free disk space and the machine's noise.  Each
  reuses the function the sweep itself relies on (the preflight, the executors' image lookup,
  ``venvs.built_env``, ``gpu.gpu_inventory``, ``machine.noise_warnings``).
- ``report``: ``doctor`` — the matrix loaded and its cells selected as ``matrun sweep`` does,
  the executor picked, and the checks that executor and those cells need, in one
  ``DoctorReport`` (ok when no check failed).

Imports: ``matrun.errors``, ``matrun.frameworks``, ``runner.planning``, ``runner.environments``,
``runner.executors``, ``runner.slurm`` (settings and commands), ``runner.sweep.machine`` and the
harness's dataset names.  Nothing imports it but the CLI.
"""
