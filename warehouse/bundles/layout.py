"""The layout of a result bundle, shared by its writers and its reader (docs/BUNDLE.md).

A bundle is one directory per run, ``<results>/<sweep>/<cell_id>/<repeat>-<attempt>/``,
holding the files named here.  ``write`` (the host's writers) and ``read`` (the warehouse's
reader) both take the names, the schema version and the statuses from this module.  The
harness writes ``events.jsonl`` itself and, being standard library only, repeats that one
name (``runner/harness/``); everything else names the files through this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The ``schema_version`` of every bundle file; a reader refuses any other.
SCHEMA_VERSION = 1
#: How a run can end (``result.json`` ``status``).
STATUSES = ("ok", "failed", "timeout", "oom", "cancelled")

SPEC = "spec.json"  # what to run: written first, its presence makes a directory a bundle
EVENTS = "events.jsonl"  # what the harness measured
MONITOR = "monitor.jsonl"  # the host's CPU and memory samples
GPU = "gpu.jsonl"  # the host's NVML samples of the cell's GPUs (gpu cells on a host with NVML only)
STDOUT = "stdout.log"
STDERR = "stderr.log"
RESULT = "result.json"  # how the run ended: written last, its presence marks a finished run

#: The folder beside a bundle that ``matrun ingest --quarantine`` moves it into when it was
#: skipped (``quarantine``): no ingest or sweep reads it, its attempts stay taken.
QUARANTINE = ".quarantine"
#: In a quarantined bundle: why it was set aside, where it was, when.
QUARANTINE_NOTE = "quarantine.json"

_RUN_DIR = re.compile(r"^(\d+)-(\d+)\Z")

#: The repeat of a canary run (``[sweep] canary``, docs/MATRIX.md): a run of a sweep's reference
#: cell made to track the machine's drift, never one of the cell's repeats (a sweep has at most
#: 1,000, numbered from 0), so the done-ness of a (cell, repeat) and the cell's statistics never
#: see it; its attempts number the canary runs of the cell.  The views know it as
#: ``canary_repeat()`` (warehouse/views/_macros.sql).
CANARY_REPEAT = 1_000_000


def run_dir_name(repeat: int, attempt: int) -> str:
    """The name of a run's directory inside its cell's: ``<repeat>-<attempt>``."""
    return f"{repeat}-{attempt}"


def parse_run_dir_name(name: str) -> tuple[int, int] | None:
    """``(repeat, attempt)`` of a run directory's name, or None when ``name`` is not one."""
    match = _RUN_DIR.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class RunKey:
    """Where a run lives: ``<results>/<sweep>/<cell_id>/<repeat>-<attempt>/``."""

    sweep: str
    cell_id: str
    repeat: int
    attempt: int

    @property
    def run_id(self) -> str:
        return f"{self.cell_id}/{run_dir_name(self.repeat, self.attempt)}"

    def directory(self, results: Path) -> Path:
        return results / self.sweep / self.cell_id / run_dir_name(self.repeat, self.attempt)
