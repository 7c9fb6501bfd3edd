"""``matrun slurm start|stop|status``: a local one-node Slurm cluster to try the slurm executor.

Thin wrappers over ``runner/slurm/cluster.py`` (docs/SLURM.md).  On a real cluster none of
this is needed: matrun uses whatever ``sbatch`` / ``squeue`` reach.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer

from matrun.runner.cli.common import command, group
from matrun.runner.environments.home import matrun_home
from matrun.runner.slurm import cluster as slurm

slurm_app = group(
    "slurm", help="Start, stop or check a local one-node Slurm cluster (munged, slurmctld, slurmd; for trying "
                  "the slurm executor on one machine).")

StateDirOpt = Annotated[Optional[Path], typer.Option(
    "--state-dir", metavar="DIR", help="Where the cluster keeps its configuration, state, logs and PIDs "
    "(default: $MATRUN_HOME/slurm).")]


def _state_dir(explicit: Optional[Path]) -> Path:
    if explicit is not None:
        return explicit
    return matrun_home() / "slurm"


@command(slurm_app, "start")
def slurm_start(state_dir: StateDirOpt = None) -> None:
    """Start munged, slurmctld -D and slurmd -D in their own sessions (needs root); PIDs recorded."""
    cluster = slurm.start_cluster(_state_dir(state_dir))
    typer.echo(f"started a Slurm test cluster in {cluster.seconds:.1f} s "
               f"({', '.join(f'{d} {p}' for d, p in cluster.pids.items())}): node node0 (2 fake GPUs) in "
               "partition matrun; nodes n1 and n2 (1 CPU each, this host) in partition multi")
    typer.echo("use it with:")
    typer.echo(f"  export SLURM_CONF={cluster.conf}")


@command(slurm_app, "stop")
def slurm_stop(state_dir: StateDirOpt = None) -> None:
    """Cancel the cluster's jobs, then stop the daemons `matrun slurm start` started (those PIDs only)."""
    stopped = slurm.stop_cluster(_state_dir(state_dir))
    if stopped:
        typer.echo(f"stopped {', '.join(stopped)}")
    else:
        typer.echo("no Slurm daemon started by matrun is running; nothing stopped")


@command(slurm_app, "status")
def slurm_status(state_dir: StateDirOpt = None) -> None:
    """Say which daemons of the local cluster run, and what sinfo shows; exit 1 when none runs."""
    directory = _state_dir(state_dir)
    running = slurm.cluster_running(directory)
    if not running:
        typer.echo(f"no Slurm cluster started by matrun runs from {directory}")
        raise typer.Exit(1)
    typer.echo(f"running from {directory}: {', '.join(f'{d} {p}' for d, p in running.items())}")
    typer.echo(f"  export SLURM_CONF={directory.absolute() / 'slurm.conf'}")
    env = {**os.environ, "SLURM_CONF": str(directory.absolute() / "slurm.conf")}
    proc = subprocess.run(["sinfo"], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=30)
    typer.echo((proc.stdout or proc.stderr).rstrip())
