"""What a sweep killed outright left behind: cell containers nobody watches, stopped and recorded.

A sweep (or a Slurm task) killed with SIGKILL cannot remove its cell's container.  Two things
keep such an orphan from training beside the cells measured next:

- **The lease** (runner/harness/lease.py, ``docker.StdinLease``): the container's stdin is attached
  to the sweep for the run; when the sweep dies the engine closes it and the harness stops the
  cell within a second or so (exit 137, "[matrun harness] the process that started this cell
  … is gone" on its stderr).  The container stays, exited, with the bundle's last output.
- **The reaper** (``reap_orphans``), which every local or docker sweep calls before it catches
  up and runs anything: it lists the engine's cell containers (label ``matrun.role=cell``) and
  judges each by its ``matrun.owner`` label (``docker.Owner``: host, boot id, PID and its start
  time).  A dead owner's container — still running (an older matrun without the lease, or the
  second before the lease acts) or exited — is killed, its logs copied into its bundle
  (``matrun.run_dir``), its run recorded ``cancelled`` (``result.json``, only where none exists:
  whoever reaps first writes it), the container removed, and a line says so in the sweep's
  output; the sweep's catch-up ingests the record, so the warehouse keeps it beside the run
  that replaces it.  Containers of a live owner (another sweep running now), of another host,
  or without an owner label (a warning names them) are left alone; a Slurm task's container is
  removed and its run left to the Slurm tracker, which records it from Slurm's state.

A local sweep reaps too when a local engine answers: an orphan trains beside any cell.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from matrun.errors import MatrunError
from matrun.runner.environments.contexts import LABEL as IMAGE_LABEL
from matrun.runner.environments.engine import find_engine
from matrun.runner.executors.docker import (
    OWNER_LABEL, ROLE_LABEL, RUN_DIR_LABEL, DockerExecutor, Owner, give_back, no_answer, remove_container, save_logs,
)
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.protocol import Executor
from matrun.runner.harness.lease import LEASE_LOST_MARK
from matrun.runner.slurm.epilog import JOB_LABEL as SLURM_JOB_LABEL
from matrun.warehouse.bundles.layout import RESULT, SCHEMA_VERSION, SPEC, STDERR
from matrun.warehouse.bundles.write import fsync_dir, tail_text

_ENGINE_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)\Z")


def reap_orphans(runner: Executor, *, log: Callable[[str], None]) -> list[Path]:
    """Before a sweep catches up and runs anything: stop, record and remove the cell containers
    of dead owners on the engine the cells run beside — the docker executor's, or for a local
    sweep the local engine when one answers (none, or the Docker SDK missing: nothing to do).
    Slurm's nodes are the Slurm epilog's.  The run directories recorded."""
    if isinstance(runner, DockerExecutor):
        return reap_containers(runner, log=log)
    if isinstance(runner, LocalExecutor):
        try:
            client = find_engine()
        except MatrunError:  # DOCKER_HOST names an engine matrun may not use: a local sweep needs none
            return []
        return reap_containers(DockerExecutor(client), log=log) if client is not None else []
    return []


def reap_containers(executor: DockerExecutor, *, log: Callable[[str], None]) -> list[Path]:
    """Stop and remove every cell container whose owner (``matrun.owner``) is dead and record
    its run ``cancelled`` (module docstring).  Returns the run directories recorded.  No engine
    answering: nothing runs there, nothing to do."""
    try:
        found = executor.client.api.containers(all=True, filters={"label": f"{ROLE_LABEL}=cell"})
    except MatrunError:  # no engine (or none matrun may use): prepare() says so if cells need one
        return []
    except Exception as exc:  # the engine went away or refused: nothing reaped now, the next sweep tries
        if not no_answer(exc):
            log(f"warning: the Docker engine at {executor.url} did not list its containers: {exc}")
        return []
    recorded = []
    for entry in found:
        labels = entry.get("Labels") or {}
        owner = Owner.parse(labels.get(OWNER_LABEL))
        if owner is None:
            log(f"warning: container {entry['Id'][:12]} of sweep {labels.get('matrun.sweep', '?')!r} has no "
                f"{OWNER_LABEL} label (started by an older matrun): left alone; `docker rm -f "
                f"{entry['Id'][:12]}` removes it if no sweep runs it")
            continue
        if owner.alive() is not False:
            continue
        try:
            run_dir = _reap(executor, entry["Id"], labels, owner, log)
        except Exception as exc:  # one container that cannot be reaped does not stop the others
            log(f"warning: could not remove container {entry['Id'][:12]} of a sweep that died "
                f"({owner.describe()}): {exc}")
            continue
        if run_dir is not None:
            recorded.append(run_dir)
    return recorded


def _reap(executor: DockerExecutor, container_id: str, labels: Mapping[str, str], owner: Owner,
          log: Callable[[str], None]) -> Path | None:
    import docker

    try:
        container = executor.client.containers.get(container_id)
    except docker.errors.NotFound:  # removed in between (another sweep reaping it too)
        return None
    state = dict(container.attrs.get("State") or {})
    running = bool(state.get("Running") or state.get("Paused") or state.get("Restarting"))
    if running:
        try:
            container.kill()
            container.wait(timeout=30)
        except Exception:  # exited in between, or cannot be waited for: remove(force) kills it
            pass
    what = (f"container {container.short_id} (sweep {labels.get('matrun.sweep', '?')!r}, cell "
            f"{labels.get('matrun.cell', '?')}, run {labels.get('matrun.run', '?')}) of a sweep that died "
            f"({owner.describe()})")
    run_dir = Path(labels.get(RUN_DIR_LABEL) or "")
    recorded = None
    if SLURM_JOB_LABEL not in labels and run_dir.is_absolute():
        recorded = _record(executor, container, state, running, owner, labels, run_dir)
    remove_container(container)
    if recorded:
        log(f"stopped {what}: {'it was still running; ' if running else ''}removed, its run recorded "
            f"cancelled in {run_dir}")
        return run_dir
    log(f"removed {what}" + ("" if running else " (it had exited)"))
    return None


def _record(executor: DockerExecutor, container: Any, state: Mapping[str, Any], running: bool, owner: Owner,
            labels: Mapping[str, str], run_dir: Path) -> bool:
    """Write the orphan's ``result.json`` (cancelled) and its logs; False when the directory
    is not the run the labels name, or the run was already recorded."""
    try:
        spec = json.loads((run_dir / SPEC).read_text())
        if (spec["sweep"], spec["cell_id"], f"{spec['repeat']}-{spec['attempt']}") != (
                labels.get("matrun.sweep"), labels.get("matrun.cell"), labels.get("matrun.run")):
            return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if (run_dir / RESULT).exists():
        return False
    save_logs(container, run_dir)
    give_back(run_dir, run_dir.parent.stat())
    started = _engine_time(state.get("StartedAt")) or datetime.fromtimestamp(
        (run_dir / SPEC).stat().st_mtime, timezone.utc)
    ended = (_engine_time(state.get("FinishedAt")) if not running else None) or datetime.now(timezone.utc)
    exit_code = None if running else state.get("ExitCode")
    stderr = tail_text(run_dir / STDERR)
    if running:
        how = "it was still running: stopped and removed"
    elif LEASE_LOST_MARK in stderr:
        how = f"it had stopped itself (exit code {exit_code}) when its sweep's lease ended: removed"
    else:
        how = f"it had exited (exit code {exit_code}) with no sweep to watch or record it: removed"
    note = (f"[matrun] container of a sweep that died ({owner.describe()}): {how} by the sweep of pid "
            f"{os.getpid()} before it ran anything; the run does not count (nothing monitored or "
            "recorded its end), the cell is run again")
    record = {
        "schema_version": SCHEMA_VERSION, "sweep": spec["sweep"], "cell_id": spec["cell_id"],
        "repeat": spec["repeat"], "attempt": spec["attempt"], "env_id": spec.get("env_id", ""),
        "executor": executor.name, "status": "cancelled", "exit_code": exit_code,
        "error_tail": f"{stderr}\n{note}".lstrip("\n"),
        "started_at": started.isoformat(), "ended_at": ended.isoformat(),
        "wall_seconds": round(max(0.0, (ended - started).total_seconds()), 3),
        "host": {"hostname": owner.host}, "monitor": {}, "image": _image_record(executor, container),
    }
    return _write_json_new(run_dir / RESULT, record)


def _image_record(executor: DockerExecutor, container: Any) -> dict[str, Any]:
    image_id = str(container.attrs.get("Image") or "")
    try:
        found = executor.client.images.get(image_id)
    except Exception:  # the image is gone: its ID is all there is
        return {"tag": image_id, "id": image_id, "repo_digests": [], "content_hash": ""}
    labels = (found.attrs.get("Config") or {}).get("Labels") or {}
    return {"tag": found.tags[0] if found.tags else image_id, "id": found.id,
            "repo_digests": list(found.attrs.get("RepoDigests") or ()),
            "content_hash": labels.get(f"{IMAGE_LABEL}.content-hash", "")}


def _engine_time(text: str | None) -> datetime | None:
    """A time as the engine gives it (RFC 3339 with nanoseconds); None for its zero time or junk."""
    match = _ENGINE_TIME.match(text or "")
    if match is None or match[1].startswith("0001-"):
        return None
    zone = "+00:00" if match[3] == "Z" else match[3]
    return datetime.fromisoformat(f"{match[1]}.{(match[2] or '0')[:6]:0<6}{zone}").astimezone(timezone.utc)


def _write_json_new(path: Path, payload: Mapping[str, Any]) -> bool:
    """Write JSON atomically, but only where no file of that name exists (two sweeps reaping
    the same orphan write its record once); False when one did."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    fsync_dir(path.parent)
    return True
