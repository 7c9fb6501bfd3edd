"""The local executor: the harness as a subprocess in the framework's virtual environment, or
in the site's own Python for a ``variant = "system"`` cell (``runner/environments/system.py``).

This is the embedded default, used where no Docker engine answers.  Where a cell's
timeout is enforced: ``_wait`` below kills the cell's whole process group.  The cell gets
its own session (process group) so it can be killed as a tree, ``PR_SET_PDEATHSIG`` so it
dies with the host even on SIGKILL of the sweep, and a lease on its stdin (``LEASE_FD``,
runner/harness/lease.py) so that its whole group dies with the host too: no orphaned training
keeps a core busy.
Matrix values reach the cell only through spec.json and environment variables, never a shell.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from matrun.errors import InputError
from matrun.frameworks import get_framework, host_env_prefixes
from matrun.runner.environments.home import stage_harness
from matrun.runner.environments.releases import check_releases, env_variant, split_variant
from matrun.runner.environments.system import system_env_id, system_refusal
from matrun.runner.environments.venvs import ensure_env, env_spec
from matrun.runner.executors.energy import EnergyMonitor, MonitorPair
from matrun.runner.executors.monitor import Monitor
from matrun.runner.executors.outcomes import error_tail, refused_outcome, run_status
from matrun.runner.executors.protocol import RunOutcome, RunRequest, SyncExecutor
from matrun.runner.executors.workers import host_refusal, write_plan
from matrun.runner.harness.distributed import MATRUN_ENV
from matrun.runner.harness.launch import child_setup
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.harness.cpusets import parse_cpuset as cpuset_cpus
from matrun.warehouse.bundles.layout import GPU, MONITOR, SPEC, STDERR, STDOUT

# Host variables that would change what runs in the cell; the cell gets only what we set.  The
# frameworks' own prefixes are data: framework.toml [env] host_prefixes.
_DROP_PREFIXES = ("PYTHON", "VIRTUAL_ENV", "CONDA", "KMP_", "GOMP_", "MKL_", "DNNL_", "ONEDNN_",
                  "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", *host_env_prefixes())
# ... and the rendezvous of distributed training (a multi-worker cell's launcher sets its own)
_DROP_NAMES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
               "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PORT",
               *MATRUN_ENV)
_POLL_S = 0.05
#: The cell's lease (runner/harness/lease.py) is its stdin: the read end of a pipe the executor
#: holds the write end of for the run (docker: the container's stdin, attached).
LEASE_FD = 0


def cell_environment(params: Mapping[str, Any], pythonpath: Path,
                     base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables the cell starts with (exactly; tested)."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(_DROP_PREFIXES) and k not in _DROP_NAMES}
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONHASHSEED"] = str(params["seed"])
    framework = get_framework(params["framework"])
    for key, value in framework.fixed_env.items():
        env.setdefault(key, value)  # a host that sets it knows its CPU better
    env.update(framework.environment(params))
    if params["device"] == "gpu":  # the first N GPUs; the host's own setting was dropped above
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(params["gpus"]))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA counts GPUs as NVML does (the GPU monitor)
    return env


def harness_command(python: Path, run_dir: Path, plan: Path | None = None, *,
                    lease_fd: int | None = None) -> list[str]:
    """The harness's command line; with a launch ``plan`` (a multi-worker cell) the harness is
    the launcher of the cell's processes (runner/executors/workers.py); with ``lease_fd`` (the
    executors: ``LEASE_FD``, stdin) it stops itself once that descriptor reaches end-of-file,
    when the process that started it is gone (runner/harness/lease.py)."""
    run_dir = run_dir.absolute()
    command = [str(python), "-m", "matrun.runner.harness", "--spec", str(run_dir / SPEC), "--out", str(run_dir)]
    if lease_fd is not None:
        command += ["--lease-fd", str(lease_fd)]
    if plan is not None:
        command += ["--launch", str(plan.absolute())]
    return command


class LocalExecutor(SyncExecutor):
    name = "local"
    enforces = frozenset({"cpuset"})  # the cell's processes are pinned (child_setup); no memory limit

    def env_id(self, framework: str, variant: str) -> str:
        return env_spec(framework, variant).env_id

    def prepare(self, envs: set[tuple[str, str]], *, log: Callable[[str], None]) -> None:
        # every release's lock first (quick): a release pip cannot install stops the sweep
        # before any environment is built
        check_releases(({"framework": fw, "variant": split_variant(v)[0], "version": split_variant(v)[1]}
                        for fw, v in envs), log=log)
        for framework, variant in sorted(envs):
            if variant != SYSTEM_VARIANT:  # the site's own Python is there already, probed by the plan
                ensure_env(framework, variant, log=log)
        stage_harness()

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """Why this executor cannot run the cell (``nodes`` > 1; the site's own Python too old
        or without the framework), or None; the sweep asks before anything runs."""
        reason = host_refusal(params, self.name)
        if reason is None and params.get("variant") == SYSTEM_VARIANT:
            reason = system_refusal(params["framework"], params["python"])
        return reason

    def run(self, request: RunRequest) -> RunOutcome:
        params = request.params
        run_dir = request.run_dir
        started = datetime.now(timezone.utc)
        try:
            refused = self.refusal(params) if request.plan is None else None
            if not refused and params.get("variant") == SYSTEM_VARIANT:
                refused = _install_changed(params, request.env_id)
        except InputError as exc:  # the site's Python is gone since the plan, or no longer answers
            refused = str(exc)
        if refused:
            return refused_outcome(run_dir, refused, started)
        if params.get("variant") == SYSTEM_VARIANT:
            python = Path(params["python"])
        else:
            python = ensure_env(params["framework"], env_variant(params)).python
        # A multi-worker cell: the harness launches its workers, all in one private network
        # namespace with only loopback (launch.py), as a container with no network would.  A
        # node of a multi-node cell comes with the plan its Slurm task wrote (the host's network).
        plan = request.plan if request.plan is not None else write_plan(run_dir, params, network="private")
        out_dir = request.log_dir or run_dir
        t0 = time.monotonic()
        cell_env = cell_environment(params, stage_harness())
        # The lease: the cell's stdin is a pipe whose write end only this process holds (not
        # inheritable); it closes when this process dies, however, and the cell stops itself.
        lease, held = os.pipe()
        try:
            with open(out_dir / STDOUT, "wb") as out, open(out_dir / STDERR, "wb") as err:
                try:
                    proc = subprocess.Popen(
                        harness_command(python, run_dir, plan, lease_fd=LEASE_FD),
                        stdin=lease, stdout=out, stderr=err, cwd=run_dir,
                        env=cell_env,
                        start_new_session=True, preexec_fn=child_setup(cpuset_cpus(params["cpuset"])),
                    )
                finally:
                    os.close(lease)
                monitor = MonitorPair(Monitor(proc.pid, out_dir / MONITOR),
                                      EnergyMonitor(out_dir / GPU, params, cell_env)).start()
                try:
                    exit_code, timed_out = _wait(proc, request.timeout)
                except BaseException:  # Ctrl-C, SIGTERM turned into SystemExit: stop the cell first
                    _kill_group(proc)
                    monitor.stop()
                    raise
                aggregates = monitor.stop()
        finally:
            os.close(held)
        wall = time.monotonic() - t0
        # node k > 0 of a multi-node cell has no summary of its own: rank 0 writes the cell's
        status = run_status(exit_code, timed_out, run_dir, out_dir, summary=out_dir == run_dir)
        return RunOutcome(
            status=status,
            exit_code=exit_code,
            error_tail="" if status == "ok" else error_tail(out_dir, timed_out, request.timeout, exit_code),
            started_at=started.isoformat(),
            ended_at=datetime.now(timezone.utc).isoformat(),
            wall_seconds=round(wall, 3),
            monitor=aggregates,
        )


def _install_changed(params: Mapping[str, Any], planned: str) -> str | None:
    """Why a system cell does not run: the site's Python is no longer the install the sweep
    planned it with (a package installed or removed since; on a Slurm node, another install at
    the same path), or None."""
    now = system_env_id(params["framework"], params["python"])
    if now == planned:
        return None
    return (f"python = \"{params['python']}\" is no longer the install this cell was planned with "
            f"(environment {planned}, now {now}: a package was installed or removed); plan the sweep again")


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int | None, bool]:
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            return code, False
        if time.monotonic() >= deadline:
            _kill_group(proc)
            return proc.returncode, True
        time.sleep(_POLL_S)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
