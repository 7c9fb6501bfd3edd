"""Where cells run: matrun's home and the staged harness, local virtual environments, and
framework images (recipes, builds, probes) on a local Docker engine.

Modules (each imports only those above it in this list, plus what is named):

- ``home``: ``$MATRUN_HOME`` (``matrun_home``), the harness staged there for cells
  (``stage_harness``), where containers mount it (``HARNESS_MOUNT``) and the host / harness
  protocol version (``HARNESS_PROTOCOL``, part of local env ids).  Standard library only.
- ``venvs``: the local executor's virtual environments, one per framework variant
  (``EnvSpec`` and its ``env_id``, ``ensure_env``, ``list_envs``).  Imports ``matrun.frameworks``.
- ``system``: the site's own Python (``variant = "system"``): its probe and cache, the
  ``system_env_id`` hashed from what the probe found, and the refusals.  Imports
  ``matrun.frameworks`` and the harness's ``spec`` (the variant's name).
- ``contexts``: image recipes and build contexts, no engine: a variant's Dockerfile and pins,
  ``recipe_hash`` (the docker executor's env id), wheel selection, ``prepare_context``, the
  tag repository and the ``org.matrun`` labels.  Imports ``matrun.frameworks``.
- ``probes``: the harness probe run inside an image, its summary and the variant's promises.
  Imports ``matrun.frameworks`` and ``matrun.runner.planning.params`` (the default cell).
- ``builds``: ``build_images``: base image, context, ``docker build``, probe, promise check.
  Imports ``matrun.runner.planning.identity`` (``host_gpus``).
- ``engine``: find, start and stop a local Docker engine; make the debootstrapped base image.
  Standard library only.

All may import ``matrun.errors``; the Docker SDK is imported inside the functions that talk to
an engine (it is an optional dependency).  Nothing here imports executors, the sweep, the CLI,
the warehouse or reports; the harness is only copied (``home``) or run in a container
(``probes``), never imported.
"""
