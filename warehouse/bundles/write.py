"""Writing result bundles on the host (the layout is ``layout``, the format docs/BUNDLE.md).

Reading and validating bundles is ``read``'s job.  Everything here writes so that a crash at
any point leaves either no file or a whole file: JSON files go through a temporary file,
fsync and rename; ``result.json`` is written last, so its presence is what marks a finished
run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from matrun.warehouse.bundles.layout import QUARANTINE, SCHEMA_VERSION, parse_run_dir_name

#: How much of a log's end ``tail_text`` returns (a result's ``error_tail``).
ERROR_TAIL_BYTES = 4096


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON so that readers see the old file, no file, or the whole new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk, an interrupt: no half-written temporary file stays
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write names no file; say which one it was
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_jsonl(path: Path, header: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> None:
    """Write a JSON-lines file whose first line is the versioned header."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "header", "schema_version": SCHEMA_VERSION, **header}) + "\n")
        for record in records:
            fh.write(json.dumps(record) + "\n")


def next_attempt(results: Path, cell_id: str, repeat: int) -> int:
    """One more than the highest attempt of this (cell, repeat) on disk, in any state and in
    any sweep's folder of the results directory ``results`` (``<results>/<sweep>/<cell_id>/``):
    attempts are numbered per results directory, so a run id (``<cell_id>/<repeat>-<attempt>``)
    names one run whichever sweep made it.  Folders whose names start with a dot (the claims,
    locks) are not sweeps.  Quarantined attempts (``<cell_id>/.quarantine/<repeat>-<attempt>``,
    with a ``.N`` suffix after a name clash there) count: their run ids stay taken."""
    highest = 0
    try:
        sweeps = [entry for entry in results.iterdir() if not entry.name.startswith(".")]
    except FileNotFoundError:
        return 1
    for sweep_dir in sweeps:
        cell_dir = sweep_dir / cell_id
        for folder in (cell_dir, cell_dir / QUARANTINE):
            try:
                names = [entry.name for entry in folder.iterdir()]
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                parsed = parse_run_dir_name(name.split(".")[0] if folder.name == QUARANTINE else name)
                if parsed and parsed[0] == repeat:
                    highest = max(highest, parsed[1])
    return highest + 1


def tail_text(path: Path, limit: int = ERROR_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a log file, decoded leniently ('' when absent)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
