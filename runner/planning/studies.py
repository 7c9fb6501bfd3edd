"""The study catalogue (``studies/*.toml``, ``matrun studies``) and a study's record in the
warehouse: which files are studies, what each varies and needs, how many runs each profile
has and how long they may take here; ``record_study`` writes a study's declaration and its
cells before a sweep runs them, so that the ``findings`` view can judge them.

Estimates come from this warehouse: a cell that already ran takes its median wall time; one
that never ran takes the per-run overhead plus its training and test images at the median
throughput of earlier runs of the same framework, model and device (``basis`` says which, or
that nothing comparable ran yet).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from matrun.errors import MatrunError
from matrun.runner.executors.registry import get_executor
from matrun.runner.harness.datasets import GENERATED
from matrun.runner.harness.models import TRANSFORMERS
from matrun.runner.harness.text import FORTUNES, FORTUNES_BYTES
from matrun.runner.planning.identity import PlannedCell, plan_cells
from matrun.runner.planning.matrix import Matrix, load_matrix, printable
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.findings import BASE_PROFILE, register_study

#: Training and test samples of the staged datasets (docs/DATA.md).
DATASET_SAMPLES = {"mnist": (60_000, 10_000), "fashion-mnist": (60_000, 10_000), "cifar10": (50_000, 10_000)}
_ORDER = re.compile(r"^([A-Z]+)([0-9]*)(.*)\Z")


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    about: str
    cells: int
    runs: int
    estimate_s: float | None
    basis: str
    needs_gpus: int


@dataclass(frozen=True)
class StudyEntry:
    """One file of the catalogue (``error``: why it could not be read; the rest is then empty)."""

    path: Path
    id: str = ""
    title: str = ""
    seed: str = ""
    source: str = ""
    needs: str = ""
    varying: tuple[str, ...] = ()
    findings: tuple[str, ...] = ()
    profiles: tuple[ProfileInfo, ...] = field(default_factory=tuple)
    error: str | None = None


def study_files(root: Path) -> list[Path]:
    """The study files under ``root`` (``*.toml``), in catalogue order: A1, A2, … A11, B1, …"""
    if not root.is_dir():
        raise MatrunError(f"{printable(str(root), 200)}: no such studies directory")
    return sorted(root.glob("*.toml"), key=_order_key)


def _order_key(path: Path) -> tuple[Any, ...]:
    m = _ORDER.match(path.stem)
    return (m.group(1), int(m.group(2) or 0), m.group(3)) if m else ("~", 0, path.stem)


def catalogue(root: Path, *, warehouse: Path | None = None) -> list[StudyEntry]:
    """Every study file under ``root`` with its profiles; a file that fails to load is an
    entry with its error, and the others are listed all the same."""
    history = CostModel.read(warehouse) if warehouse is not None else CostModel()
    entries = []
    for path in study_files(root):
        try:
            entries.append(_entry(path, history))
        except MatrunError as exc:
            entries.append(StudyEntry(path=path, error=str(exc)))
    return entries


def _entry(path: Path, history: CostModel) -> StudyEntry:
    base = load_matrix(path)
    if base.study is None:
        raise MatrunError(f"{printable(path.name, 200)}: not a study file (no [study] table)")
    infos = []
    for name in (None, *base.profiles):
        matrix = base if name is None else load_matrix(path, name)
        runner, _ = get_executor(matrix.sweep.executor)
        cells = plan_cells(matrix, runner.env_id)
        estimate, basis = history.estimate(matrix, cells)
        gpus = max((pc.cell.values["gpus"] or 0 for pc in cells if pc.cell.values["device"] == "gpu"), default=0)
        infos.append(ProfileInfo(name=name or BASE_PROFILE, about=base.profiles.get(name, "") if name else "the paper's scale",
                                 cells=len(cells), runs=len(cells) * matrix.sweep.repeats, estimate_s=estimate,
                                 basis=basis, needs_gpus=gpus))
    study = base.study
    varying = base.cells[0].varying if base.cells else ()
    return StudyEntry(path=path, id=study.id, title=study.title, seed=study.seed, source=study.source,
                      needs=study.needs, varying=tuple(varying),
                      findings=tuple(f.id for f in study.findings), profiles=tuple(infos))


class CostModel:
    """Seconds a run may take, from the warehouse's earlier runs."""

    def __init__(self, known: Mapping[str, float] | None = None,
                 throughput: Mapping[tuple[str, str, str], float] | None = None,
                 overhead: Mapping[str, float] | None = None) -> None:
        self.known = dict(known or {})
        self.throughput = dict(throughput or {})
        self.overhead = dict(overhead or {})

    @classmethod
    def read(cls, warehouse: Path, *, exclude: Sequence[str] = ()) -> "CostModel":
        """The model from the warehouse's ok runs, leaving out the cells in ``exclude``
        (``benchmarks/study_estimates.py``: a study's estimate as it was before it ran)."""
        if not warehouse.exists():
            return cls()
        kept = "status = 'ok' AND NOT list_contains($exclude, cell_id)"
        with open_warehouse(warehouse, read_only=True, wait_s=30) as wh:
            known = dict(wh.con.execute(
                "SELECT cell_id, wall_seconds_median FROM cell_durations WHERE wall_seconds_median IS NOT NULL "
                "AND NOT list_contains($exclude, cell_id)", {"exclude": list(exclude)}).fetchall())
            rows = wh.con.execute(f"""
                SELECT framework, model, device, median(throughput)
                FROM run_overview WHERE {kept} AND throughput > 0 AND mode = 'train'
                GROUP BY ALL""", {"exclude": list(exclude)}).fetchall()
            over = wh.con.execute(f"""
                SELECT framework, median(wall_seconds - coalesce(train_seconds, 0) - coalesce(test_seconds, 0))
                FROM run_overview WHERE {kept} AND wall_seconds IS NOT NULL GROUP BY ALL""",
                {"exclude": list(exclude)}).fetchall()
        return cls(known, {(r[0], r[1], r[2]): float(r[3]) for r in rows},
                   {r[0]: max(float(r[1]), 0.0) for r in over if r[1] is not None})

    def run_seconds(self, pc: PlannedCell) -> tuple[float | None, bool]:
        """(seconds of one run of the cell, whether it ran before); None when nothing comparable ran."""
        if pc.cell_id in self.known:
            return self.known[pc.cell_id], True
        v = pc.cell.values
        rate = self.throughput.get((v["framework"], v["model"], v["device"]))
        if rate is None:
            return None, False
        train, test = _samples(v)
        overhead = self.overhead.get(v["framework"], 0.0)
        return overhead + (train + test / 4) / rate, False  # evaluation: forward only, ~4x faster

    def estimate(self, matrix: Matrix, cells: Sequence[PlannedCell]) -> tuple[float | None, str]:
        total, ran, modelled, unknown = 0.0, 0, 0, set()
        for pc in cells:
            seconds, known = self.run_seconds(pc)
            if seconds is None:
                unknown.add(f"{pc.cell.values['framework']} {pc.cell.values['model']} on {pc.cell.values['device']}")
                continue
            total += seconds * matrix.sweep.repeats
            ran += known
            modelled += not known
        if unknown:
            return None, "no earlier runs of " + ", ".join(sorted(unknown)[:3]) + ("…" if len(unknown) > 3 else "")
        if not ran and not modelled:
            return None, "no cells"
        parts = ([f"{ran} cells ran before"] if ran else []) + \
                ([f"{modelled} from the throughput of similar runs"] if modelled else [])
        return total, "; ".join(parts)


def _samples(v: Mapping[str, Any]) -> tuple[float, float]:
    """Training samples a cell processes (all epochs) and test samples it evaluates."""
    if v["dataset"] in GENERATED:
        train, test = v["synthetic_train"], v["synthetic_test"]
    elif v["dataset"] == FORTUNES:  # sequences of seq_len tokens (bytes)
        seq = v.get("seq_len") or getattr(TRANSFORMERS.get(v["model"]), "positions", 0) or 128
        train, test = (n // seq for n in FORTUNES_BYTES)
    else:
        train, test = DATASET_SAMPLES.get(v["dataset"], (60_000, 10_000))
    if v.get("train_limit"):
        train = min(train, v["train_limit"])
    if v.get("test_limit"):
        test = min(test, v["test_limit"])
    if v["mode"] == "inference":
        return 0.0, float(test)
    workers = (v.get("workers") or 1) * (v.get("nodes") or 1)
    if v.get("iterations"):
        batch = v["batch_size"] * (workers if v.get("scaling") == "weak" else 1)
        return float(v["iterations"] * batch), float(test)
    return float((v.get("epochs") or 1) * train), float(test)


def record_study(matrix: Matrix, cells: Sequence[PlannedCell]) -> None:
    """Write the matrix's study declaration and the cells of its profile to its warehouse."""
    assert matrix.study is not None
    with open_warehouse(matrix.sweep.warehouse, wait_s=30) as wh:
        register_study(wh.con, matrix.study, profile=matrix.profile, matrix=str(matrix.path),
                       cell_ids=[pc.cell_id for pc in cells])
