"""matrun's home (``$MATRUN_HOME``, default ``~/.cache/matrun``) and the harness staged in it.

Every cell runs the same in-cell harness, ``matrun.runner.harness``, from a copy staged under
``$MATRUN_HOME/harness/<hash>/``: the local executor puts it on the cell's PYTHONPATH, the
docker executor and the image probe mount it read-only at ``HARNESS_MOUNT``.  The copy
holds the harness and two import-free packages above it (``matrun``, ``matrun.runner``), so a
cell never sees matrun's host dependencies.

``HARNESS_PROTOCOL`` versions the spec / events contract between host and harness; it is part
of every local environment's ``env_id`` (``venvs.EnvSpec``), hence of cell ids.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from importlib import resources
from pathlib import Path

# Bump when the spec/events contract between host and harness changes incompatibly.
HARNESS_PROTOCOL = 1
# Where a container (a cell, an image probe) sees the staged harness, read-only.
HARNESS_MOUNT = "/opt/matrun-harness"


def matrun_home() -> Path:
    """The folder matrun keeps its state in: environments, staged harness, engine, Slurm."""
    return Path(os.environ.get("MATRUN_HOME") or Path.home() / ".cache" / "matrun")


def stage_harness() -> Path:
    """A directory to put on the cell's PYTHONPATH holding only ``matrun.runner.harness``.

    The harness must not see matrun's host dependencies, so it is copied into a tree with
    import-free ``matrun`` and ``matrun.runner`` packages.  Content-addressed: staged once.
    """
    src = resources.files("matrun.runner.harness")
    files = sorted(p for p in Path(str(src)).rglob("*.py"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(Path(str(src)))).encode() + b"\0" + f.read_bytes())
    stage = matrun_home() / "harness" / digest.hexdigest()[:16]
    if (stage / "matrun" / "runner" / "harness" / "__main__.py").is_file():
        return stage
    tmp = stage.with_name(f"{stage.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    pkg = tmp / "matrun" / "runner"
    pkg.mkdir(parents=True)
    (tmp / "matrun" / "__init__.py").write_text('"""Staged for the in-cell harness."""\n')
    (pkg / "__init__.py").write_text("")
    for f in files:
        dest = pkg / "harness" / f.relative_to(Path(str(src)))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    try:
        os.replace(tmp, stage)
    except OSError:  # another process staged it first
        shutil.rmtree(tmp, ignore_errors=True)
    return stage
