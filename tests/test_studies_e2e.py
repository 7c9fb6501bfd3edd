"""Three quick studies of the catalogue end to end: `matrun sweep studies/<id>.toml --profile
quick` through the local executor (real harness processes, real PyTorch), into the warehouse's
`findings` view — each finding judged, its numbers recomputed here from the runs — and into the
report's study pages.  Sliced to PyTorch (and, for A6, to 1 and 8 threads) and run at test scale
(TEST_SCALE: less work per run, the same cells and repeats) to keep CI short."""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lake_client import plain_connect

ROOT = Path(__file__).resolve().parents[1]
MATRUN = [str(Path(sys.executable).with_name("matrun"))]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}
VERDICTS = {"reproduced", "contradicted", "not significant", "not enough data"}
STUDIES = {  # file: the slice of its quick profile run here
    "E-layout.toml": ["--where", "framework=torch"],
    "D-layers.toml": ["--where", "framework=torch"],
    "A6-threads.toml": ["--where", "framework=torch", "--where", "threads=1,8"],
}
# The copies run a test-scale quick profile: the quick profile's own cells (axes, zips, slices,
# repeats: 4 against 4 for E-layout's Mann-Whitney, 3 per cell for D-layers' layer shares) with
# less work per run, since training and the layer profiles took most of the time (AlexNet 3x64x64
# is its smallest input).  The cell ids differ from the catalogue's quick ones; the checks below
# read the warehouse the copies were swept into and recompute every number from their runs.
TEST_SCALE = {  # file: the values replaced in its [profiles.quick] fixed
    "E-layout.toml": {"synthetic_shape": [3, 64, 64], "synthetic_train": 32, "synthetic_test": 16,
                      "batch_size": 4, "iterations": 6},
    "D-layers.toml": {"synthetic_shape": [3, 64, 64], "synthetic_train": 32, "synthetic_test": 16,
                      "batch_size": 4, "iterations": 4},
    "A6-threads.toml": {"train_limit": 600, "test_limit": 500},
}

pytestmark = pytest.mark.slow


def matrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE}, timeout=1800)
    assert proc.returncode == 0, f"matrun {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def rows(db: Path, query: str, params: list | None = None) -> list[dict]:
    con = plain_connect(db)
    try:
        cur = con.execute(query, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()


def scaled_copy(name: str) -> str:
    """The catalogue's study file with TEST_SCALE's values in its quick profile's fixed table."""
    text = (ROOT / "studies" / name).read_text(encoding="utf-8")
    quick = tomllib.loads(text)["profiles"]["quick"]["fixed"]
    (line,) = [line for line in text.splitlines() if line.startswith("fixed = {") and all(
        re.search(rf"\b{key} = ", line) for key in TEST_SCALE[name])]
    scaled = line
    for key, value in TEST_SCALE[name].items():
        scaled, n = re.subn(rf"\b{key} = (\[[^\]]*\]|[^,}}]+)", f"{key} = {json.dumps(value)}", scaled)
        assert n == 1, (name, key)
    copy = text.replace(line, scaled)
    # only those values changed, and only there
    assert tomllib.loads(copy)["profiles"]["quick"]["fixed"] == {**quick, **TEST_SCALE[name]}
    assert tomllib.loads(copy) | {"profiles": None} == tomllib.loads(text) | {"profiles": None}
    return copy


def mann_whitney_exact_p(x: list[float], y: list[float]) -> float:
    """Two-sided exact p of the Mann-Whitney U test by enumerating every split (no ties)."""
    pooled = sorted(x + y)
    rank = {v: i + 1 for i, v in enumerate(pooled)}
    m, n = len(x), len(y)
    u = sum(rank[v] for v in x) - m * (m + 1) / 2
    dist = [sum(c) - m * (m + 1) / 2 for c in itertools.combinations(range(1, m + n + 1), m)]
    extreme = abs(u - m * n / 2)
    return sum(1 for d in dist if abs(d - m * n / 2) >= extreme - 1e-9) / len(dist)


@pytest.fixture(scope="module")
def catalogue_run(tmp_path_factory, torch_env, fashion_mnist_root) -> Path:
    """The three quick studies swept into one warehouse (the catalogue's own files, copied at
    test scale (TEST_SCALE) so that their results and warehouse land in a temporary directory)."""
    root = tmp_path_factory.mktemp("catalogue")
    (root / "studies").mkdir()
    for name, where in STUDIES.items():
        (root / "studies" / name).write_text(scaled_copy(name), encoding="utf-8")
        # --no-rerun-busy: a study re-runs busy runs by default, and under the suite's two workers
        # most runs start busy; the checks below count each cell's runs (tests/test_busy_reruns.py
        # tests the re-runs and the verdicts' rule)
        matrun("sweep", f"studies/{name}", "--profile", "quick", "--executor", "local", "--no-rerun-busy", *where,
               cwd=root)
    return root


def test_each_study_is_recorded_with_its_findings_and_cells(catalogue_run: Path) -> None:
    db = catalogue_run / "matrun.duckdb"
    studies = {r["study"]: r for r in rows(db, "SELECT * FROM studies")}
    assert set(studies) == {"E-layout", "D-layers", "A6"}
    assert studies["A6"]["seed"] == "000_55992cd604dc8adf.txt" and studies["A6"]["source"]
    cells = rows(db, "SELECT study, profile, count(*) AS n FROM study_cells GROUP BY ALL ORDER BY study")
    # the whole quick profile is the study's, not only the slice run here
    assert {(r["study"], r["profile"]): r["n"] for r in cells} == {("A6", "quick"): 8, ("D-layers", "quick"): 4,
                                                                  ("E-layout", "quick"): 4}


def test_every_finding_has_a_verdict_row_with_its_numbers(catalogue_run: Path) -> None:
    db = catalogue_run / "matrun.duckdb"
    declared = rows(db, "SELECT study, finding FROM study_findings")
    found = rows(db, "SELECT * FROM findings")
    assert {(r["study"], r["finding"]) for r in found} == {(r["study"], r["finding"]) for r in declared}
    assert all(r["verdict"] in VERDICTS for r in found)
    judged = [r for r in found if r["config"] is not None and r["verdict"] != "not enough data"]
    assert judged, found
    for r in judged:
        assert r["observed"] and r["claim"] and r["cite"], r


def test_the_layout_verdict_is_what_the_runs_say(catalogue_run: Path) -> None:
    """E-layout's option check recomputed from the runs: the ratio of median throughputs of
    NHWC against NCHW, the exact Mann-Whitney p of 4 against 4 runs, and the verdict rule."""
    db = catalogue_run / "matrun.duckdb"
    (row,) = rows(db, "SELECT * FROM findings WHERE study = 'E-layout' AND framework = 'torch' "
                      "AND check_kind = 'option'")
    runs = rows(db, "SELECT cell_id, throughput FROM runs WHERE status = 'ok' AND cell_id IN (?, ?)",
                [row["cell_id"], row["ref_cell_id"]])
    a = [r["throughput"] for r in runs if r["cell_id"] == row["cell_id"]]
    b = [r["throughput"] for r in runs if r["cell_id"] == row["ref_cell_id"]]
    assert len(a) == len(b) == 4
    ratio = statistics.median(a) / statistics.median(b)
    assert row["effect"] == pytest.approx(ratio, rel=1e-9)
    p = mann_whitney_exact_p(a, b)
    assert row["p_value"] == pytest.approx(p, rel=1e-9)
    options = json.loads(rows(db, "SELECT options FROM study_findings WHERE study = 'E-layout'")[0]["options"])
    if p >= 0.05:
        assert row["verdict"] == "not significant"
    else:
        size_ok = abs(abs(ratio - 1) - options["about"]) <= options["tolerance"]
        assert row["verdict"] == ("reproduced" if size_ok else "contradicted")


def test_oversubscription_compares_8_threads_with_the_best_within_the_cores(catalogue_run: Path) -> None:
    db = catalogue_run / "matrun.duckdb"
    (row,) = rows(db, "SELECT * FROM findings WHERE study = 'A6' AND check_kind = 'oversubscription'")
    cpus = rows(db, "SELECT max(TRY_CAST(host ->> 'cpu_count' AS INTEGER)) AS n FROM runs")[0]["n"]
    assert cpus is not None and cpus < 8
    tested = rows(db, "SELECT threads FROM cell_stats WHERE cell_id = ?", [row["cell_id"]])[0]["threads"]
    ref = rows(db, "SELECT threads FROM cell_stats WHERE cell_id = ?", [row["ref_cell_id"]])[0]["threads"]
    assert (str(tested), str(ref)) == ("8", "1")
    assert row["verdict"] in VERDICTS - {"not enough data"} and "8" in row["observed"]


def test_the_report_has_a_page_per_study_and_the_verdicts_on_its_index(catalogue_run: Path) -> None:
    matrun("report", "--warehouse", "matrun.duckdb", "--out", "site", cwd=catalogue_run)
    index = (catalogue_run / "site" / "index.html").read_text()
    for study in ("E-layout", "D-layers", "A6"):
        assert study in index
    pages = sorted(p.name for p in (catalogue_run / "site").glob("study-*.html"))
    assert len(pages) == 3, pages
    layout = next((catalogue_run / "site").glob("study-E-layout*.html")).read_text()
    assert "NHWC" in layout or "nhwc" in layout
    assert "hardware" in layout.lower()
