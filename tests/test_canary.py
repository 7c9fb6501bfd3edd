"""The drift canary ([sweep] canary, runner/sweep/canary.py): malformed values, the schedule,
a real local sweep whose canary runs are interleaved, marked and kept out of the reference
cell's repeats, and the views canary_drift / run_drift on bundles with hand-set throughputs
and start times (every expected number below is worked out from them by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bundle_factory import make_bundle, read_json
from matrun.errors import InputError, MatrixError
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import CanarySettings, load_matrix
from matrun.runner.sweep.canary import Canary, reference_cell, schedule
from matrun.warehouse.bundles.layout import CANARY_REPEAT
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.warehouse.compare import compare, fmt_noisy
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MATRUN = str(Path(sys.executable).with_name("matrun"))
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}

MATRIX = """
[sweep]
name = "canary"
repeats = 2
timeout = 300
{canary}

[fixed]
dataset = "synthetic"
synthetic_train = 256
synthetic_test = 64
iterations = 12
batch_size = 32
warmup_steps = 2
onednn_check = false

[axes]
threads = [1, 2]
"""


def write(tmp_path: Path, canary: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX.format(canary=canary), encoding="utf-8")
    return path


def matrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([MATRUN, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE}, timeout=900)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def query(warehouse: Path, sql: str) -> list[dict[str, Any]]:
    columns, rows = run_query(sql, warehouse=warehouse)
    return [dict(zip(columns, row)) for row in rows]


# -- [sweep] canary: what a matrix may say ---------------------------------------------------

BAD = [
    ("a number", "canary = 1",
     'matrix.toml: [sweep -> canary] expected true, false or a table of every and where (e.g. '
     '{ every = 10, where = ["threads=1"] }), got 1'),
    ("a string", 'canary = "yes"',
     'matrix.toml: [sweep -> canary] expected true, false or a table of every and where'),
    ("every zero", "canary = { every = 0 }",
     "matrix.toml: [sweep -> canary -> every] expected a number of runs from 1 to 100,000, got 0"),
    ("every negative", "canary = { every = -3 }",
     "matrix.toml: [sweep -> canary -> every] expected a number of runs from 1 to 100,000, got -3"),
    ("every a boolean", "canary = { every = true }",
     "matrix.toml: [sweep -> canary -> every] expected a number of runs from 1 to 100,000, got true"),
    ("every huge", "canary = { every = 99999999999999999 }",
     "matrix.toml: [sweep -> canary -> every] expected a number of runs from 1 to 100,000, got 99999999999999999"),
    ("every nan", "canary = { every = nan }",
     "matrix.toml: [sweep -> canary -> every] expected a number of runs from 1 to 100,000, got nan"),
    ("unknown key", "canary = { evry = 3 }",
     "matrix.toml: [sweep -> canary -> evry] unknown key; expected every or where"),
    ("where without '='", 'canary = { where = "threads" }',
     'matrix.toml: [sweep -> canary -> where] expected KEY=VALUE[,VALUE…] (e.g. "threads=1"), got "threads"'),
    ("where an unknown key", 'canary = { where = ["threads=1", "colour=red"] }',
     'matrix.toml: [sweep -> canary -> where -> 1] unknown parameter "colour"; expected cell or a parameter'),
    ("where an empty value", 'canary = { where = ["threads="] }',
     'matrix.toml: [sweep -> canary -> where -> 0] expected KEY=VALUE[,VALUE…] (e.g. "threads=1"), got "threads="'),
    ("where a number", "canary = { where = 3 }",
     "matrix.toml: [sweep -> canary -> where] expected KEY=VALUE[,VALUE…] or a list of 1 to 32 of them, got 3"),
    ("where an empty list", "canary = { where = [] }",
     "matrix.toml: [sweep -> canary -> where] expected KEY=VALUE[,VALUE…] or a list of 1 to 32 of them, got []"),
    ("where a list of numbers", "canary = { where = [1] }",
     "matrix.toml: [sweep -> canary -> where -> 0] expected KEY=VALUE[,VALUE…] (e.g. \"threads=1\"), got 1"),
    ("where a control character", 'canary = { where = "threads=1\\u0000" }',
     'matrix.toml: [sweep -> canary -> where] expected KEY=VALUE[,VALUE…] (e.g. "threads=1"), got "threads=1\\x00"'),
    ("where too long", f'canary = {{ where = "threads={"1," * 600}1" }}',
     'matrix.toml: [sweep -> canary -> where] expected KEY=VALUE[,VALUE…] (e.g. "threads=1"), got "threads=1,1,'),
]


@pytest.mark.parametrize("name, line, message", BAD, ids=[b[0] for b in BAD])
def test_malformed_canary_is_refused_naming_the_key(tmp_path: Path, name: str, line: str, message: str) -> None:
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, line))
    assert str(info.value).startswith(message), str(info.value)


def test_the_unknown_key_message_lists_canary(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, "canry = true"))
    assert str(info.value) == ("matrix.toml: [sweep -> canry] unknown key; expected one of name, results, "
                               "warehouse, data_dir, repeats, timeout, executor, max_cells, canary, rerun_busy, "
                               "busy_reruns")


def test_canary_values_that_are_fine(tmp_path: Path) -> None:
    assert load_matrix(write(tmp_path, "canary = false")).sweep.canary is None
    assert load_matrix(write(tmp_path, "")).sweep.canary is None
    assert load_matrix(write(tmp_path, "canary = true")).sweep.canary == CanarySettings()
    table = load_matrix(write(tmp_path, 'canary = { every = 5, where = "threads=2" }')).sweep.canary
    assert table == CanarySettings(every=5, where=("threads=2",))
    listed = load_matrix(write(tmp_path, 'canary = { where = ["threads=1,2", "cell=ab"] }')).sweep.canary
    assert listed == CanarySettings(every=None, where=("threads=1,2", "cell=ab"))


def test_the_cli_refuses_a_malformed_canary_with_exit_2(tmp_path: Path) -> None:
    write(tmp_path, "canary = { every = 0 }")
    proc = matrun("sweep", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: matrix.toml: [sweep -> canary -> every] expected a number of runs")
    assert not (tmp_path / "results").exists()


def test_the_slurm_executor_refuses_a_canary_before_anything_runs(tmp_path: Path) -> None:
    write(tmp_path, "canary = true")
    proc = matrun("sweep", "--executor", "slurm", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith(
        "Error: [sweep -> canary] is for the local and docker executors: the slurm executor starts runs on "
        "several nodes in any order"), proc.stderr
    assert not (tmp_path / "results").exists()


def test_a_canary_where_that_matches_no_cell_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, 'canary = { where = "threads=3" }')
    proc = matrun("sweep", "--executor", "local", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("Error: matrix.toml: [sweep -> canary -> where] threads=3 matches "
                                            "no cell of the matrix"), proc.stderr
    assert not (tmp_path / "results").exists()


# -- which cell, and when -------------------------------------------------------------------


def test_the_reference_cell_is_the_first_cell_run_or_the_first_match(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, "canary = true"))
    cells = plan_cells(matrix, lambda framework, variant: "env")
    threads = [pc.params["threads"] for pc in cells]
    assert threads == [1, 2]
    assert reference_cell(CanarySettings(), matrix.path, cells, cells[1:]) is cells[1]
    assert reference_cell(CanarySettings(where=("threads=2",)), matrix.path, cells, cells[:1]) is cells[1]
    by_id = CanarySettings(where=(f"cell={cells[0].cell_id[:6]}",))
    assert reference_cell(by_id, matrix.path, cells, cells[1:]) is cells[0]
    with pytest.raises(InputError, match=r"\[sweep -> canary -> where\] threads=4 matches no cell"):
        reference_cell(CanarySettings(where=("threads=4",)), matrix.path, cells, cells)


def test_the_schedule_has_a_canary_at_the_start_every_n_runs_and_at_the_end(tmp_path: Path) -> None:
    pc = plan_cells(load_matrix(write(tmp_path, "")), lambda framework, variant: "env")[0]
    default = schedule(CanarySettings(), pc, 100)  # about eight intervals
    assert isinstance(default, Canary) and (default.every, default.count) == (12, 10)
    assert [i for i in range(100) if default.due(i)] == [0, 12, 24, 36, 48, 60, 72, 84, 96]
    every_2 = schedule(CanarySettings(every=2), pc, 4)
    assert every_2 is not None and every_2.count == 3 and [i for i in range(4) if every_2.due(i)] == [0, 2]
    one = schedule(CanarySettings(), pc, 1)
    assert one is not None and (one.every, one.count) == (1, 2)  # before and after the one run
    assert schedule(CanarySettings(), pc, 0) is None  # nothing to do: nothing to compare
    assert schedule(None, pc, 10) is None
    assert [one.next(), one.next()] == [1, 2]


# -- a real sweep -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_interleaves_marked_canary_runs_that_are_no_repeats(tmp_path: Path, torch_env) -> None:
    """Two cells × two repeats, the canary the second cell's, every two runs: seven real runs."""
    write(tmp_path, 'canary = { every = 2, where = "threads=2" }')
    db = tmp_path / "matrun.duckdb"
    cells = {pc.params["threads"]: pc.cell_id for pc in plan_cells(
        load_matrix(tmp_path / "matrix.toml"), LocalExecutor().env_id)}
    ref, other = cells[2], cells[1]

    first = matrun("sweep", "--executor", "local", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (f"4 runs to do, 0 already done; 3 canary runs of cell {ref}: at the start, after every 2 runs "
            "and at the end") in first.stderr
    assert [line for line in first.stderr.splitlines() if line.startswith("canary run")] == [
        f"canary run {i} of 3: cell {ref} (threads=2)" for i in (1, 2, 3)]
    assert "sweep canary: 7 runs (7 ok); 0 already done" in first.stdout
    ended = [line.split() for line in first.stderr.splitlines() if line.lstrip().startswith("ok ")]
    assert sorted(fields[2] for fields in ended) == ["canary"] * 3 + ["repeat"] * 4, first.stderr

    order = query(db, "SELECT cell_id, \"repeat\", attempt, status FROM runs ORDER BY started_at")
    assert [(r["cell_id"], r["repeat"], r["attempt"]) for r in order] == [
        (ref, CANARY_REPEAT, 1), (other, 0, 1), (ref, 0, 1), (ref, CANARY_REPEAT, 2), (other, 1, 1),
        (ref, 1, 1), (ref, CANARY_REPEAT, 3)]
    assert {r["status"] for r in order} == {"ok"}
    for number in (1, 2, 3):  # marked: the repeat no sweep plans, and its number in spec.json
        spec = read_json(tmp_path / "results" / "canary" / ref / f"{CANARY_REPEAT}-{number}" / "spec.json")
        assert (spec["repeat"], spec["canary"], spec["params"]["threads"]) == (CANARY_REPEAT, number, 2)
    assert "canary" not in read_json(tmp_path / "results" / "canary" / ref / "0-1" / "spec.json")

    # the reference cell has its two repeats, not five runs, and the sweep is complete
    stats = {r["cell_id"]: r for r in query(db, "SELECT cell_id, runs, throughput_n FROM cell_stats")}
    assert (stats[ref]["runs"], stats[ref]["throughput_n"], stats[other]["runs"]) == (2, 2, 2)
    assert query(db, "SELECT count(*) AS n FROM run_overview") == [{"n": 4}]
    status = query(db, "SELECT cell_id, \"repeat\", ok FROM cell_status WHERE \"repeat\" < 1000 ORDER BY ALL")
    assert [(r["cell_id"], r["repeat"], r["ok"]) for r in status] == sorted(
        [(c, r, True) for c in cells.values() for r in (0, 1)])
    again = matrun("sweep", "--executor", "local", cwd=tmp_path)
    assert "sweep canary: 0 runs (nothing to run); 4 already done" in again.stdout  # and no canary run
    assert "canary run" not in again.stderr
    assert query(db, "SELECT count(*) AS n FROM runs") == [{"n": 7}]

    drift = query(db, "SELECT * FROM canary_drift")
    assert [(d["canary"], d["run_id"]) for d in drift] == [(i, f"{ref}/{CANARY_REPEAT}-{i}") for i in (1, 2, 3)]
    assert [d["runs_before"] for d in drift] == [0, 2, 2]
    assert drift[0]["ratio_to_first"] == 1.0 and all(d["throughput"] > 0 for d in drift)
    assert all(d["band_low"] < d["canary_median"] < d["band_high"] for d in drift)  # three ok canaries
    assert all(isinstance(d["outside"], bool) for d in drift)
    flags = query(db, "SELECT * FROM run_drift ORDER BY started_at")
    c1, c2, c3 = (f"{ref}/{CANARY_REPEAT}-{i}" for i in (1, 2, 3))
    assert [(f["run_id"], f["canary_before"], f["canary_after"]) for f in flags] == [
        (f"{other}/0-1", c1, c2), (f"{ref}/0-1", c1, c2), (f"{other}/1-1", c2, c3), (f"{ref}/1-1", c2, c3)]
    outside = {d["run_id"]: d["outside"] for d in drift}
    assert [f["drift_flagged"] for f in flags] == [outside[f["canary_before"]] and outside[f["canary_after"]]
                                                   for f in flags]


# -- the views, on hand-made bundles ---------------------------------------------------------

REF, X, Y = "aaaa000000000001", "bbbb000000000001", "cccc000000000001"
START = datetime(2026, 11, 22, 1, 0, tzinfo=timezone.utc)


def bundle(results: Path, cell: str, repeat: int, attempt: int, throughput: float, minute: int,
           sweep: str = "s", status: str = "ok") -> Path:
    """A bundle started ``minute`` minutes after 01:00 UTC (canary runs: ``repeat`` CANARY_REPEAT)."""
    run_dir = make_bundle(results, sweep=sweep, cell_id=cell, repeat=repeat, attempt=attempt,
                          throughput=throughput, status=status, exit_code=0 if status == "ok" else 1)
    result = read_json(run_dir / "result.json")
    start = START + timedelta(minutes=minute)
    result["started_at"] = start.isoformat()
    result["ended_at"] = (start + timedelta(seconds=30)).isoformat()
    write_json_atomic(run_dir / "result.json", result)
    if repeat == CANARY_REPEAT:
        spec = read_json(run_dir / "spec.json")
        spec["canary"] = attempt
        write_json_atomic(run_dir / "spec.json", spec)
    return run_dir


@pytest.fixture(scope="module")
def drifted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sweep s: canaries at minutes 0, 10, …, 60 with throughputs 100, 101, 99, 80, 79, 78,
    100 (a failed one at minute 45), and runs of X and Y between them.  Sweep t: two canaries
    only (no band).  Sweep u: no canary."""
    root = tmp_path_factory.mktemp("drift")
    results = root / "results"
    for attempt, (tp, minute) in enumerate([(100, 0), (101, 10), (99, 20), (80, 30), (79, 40), (78, 50),
                                            (100, 60)], start=1):
        bundle(results, REF, CANARY_REPEAT, attempt, tp, minute)
    bundle(results, REF, CANARY_REPEAT, 8, 0, 45, status="failed")
    for repeat, minute in enumerate([5, 15, 25, 35, 55]):
        bundle(results, X, repeat, 1, 1000 + repeat, minute)
    bundle(results, Y, 0, 1, 500, 42)
    bundle(results, Y, 1, 1, 500, 65)  # after the last canary
    bundle(results, REF, 0, 1, 95, 12)  # the reference cell's own repeat
    bundle(results, REF, CANARY_REPEAT, 9, 100, 0, sweep="t")
    bundle(results, REF, CANARY_REPEAT, 10, 50, 30, sweep="t")
    bundle(results, X, 7, 1, 1000, 15, sweep="t")
    bundle(results, Y, 7, 1, 500, 15, sweep="u")
    report = ingest([results], warehouse=root / "w")
    assert len(report.ingested) == 20 and not report.skipped
    return root / "w"


CANARY_DRIFT = ("sweep, cell_id, canary, run_id, status, started_at, ended_at, wall_seconds, train_seconds, "
                "throughput, ratio_to_first, ratio_to_median, ok_canaries, canary_median, noise, band_low, "
                "band_high, outside, runs_before")
RUN_DRIFT = ("run_id, sweep, cell_id, repeat, attempt, status, started_at, throughput, canary_before, "
             "before_ratio, before_outside, canary_after, after_ratio, after_outside, drift_flagged")


def test_the_drift_views_have_their_columns_even_when_empty(tmp_path: Path) -> None:
    ingest([], warehouse=tmp_path / "empty")
    for view, contract in (("canary_drift", CANARY_DRIFT), ("run_drift", RUN_DRIFT)):
        columns, rows = run_query(f"SELECT * FROM {view}", warehouse=tmp_path / "empty")
        assert (columns, rows) == (contract.split(", "), [])


def test_canary_drift_gives_each_canary_its_ratios_and_the_band(drifted: Path) -> None:
    rows = query(drifted, "SELECT * FROM canary_drift WHERE sweep = 's'")
    assert [r["canary"] for r in rows] == list(range(1, 9))
    assert [r["throughput"] for r in rows] == [100, 101, 99, 80, 79, None, 78, 100]  # the failed one has none
    assert [r["status"] for r in rows][5] == "failed"
    # ok canaries 100 101 99 80 79 78 100: median 99; consecutive differences 1 2 19 1 1 22,
    # their median 1.5, noise 1.5 × 1.0484; half width max(3 × 1.5726, 2 % of 99 = 1.98) = 4.7178
    first = rows[0]
    assert (first["ok_canaries"], first["canary_median"]) == (7, 99)
    assert first["noise"] == pytest.approx(1.5 * 1.0484)
    assert (first["band_low"], first["band_high"]) == (pytest.approx(99 - 4.7178), pytest.approx(99 + 4.7178))
    assert [r["outside"] for r in rows] == [False, False, False, True, True, None, True, False]
    assert [r["ratio_to_first"] for r in rows][:4] == [1.0, 1.01, 0.99, 0.8]
    assert rows[3]["ratio_to_median"] == pytest.approx(80 / 99)
    # runs of the sweep since the canary before (a failed one too): X at 5, 15, 25, 35, 55; REF's
    # repeat at 12; Y at 42 (before the failed canary at 45); Y at 65 comes after the last
    assert [r["runs_before"] for r in rows] == [0, 1, 2, 1, 1, 1, 0, 1]
    assert rows[0]["cell_id"] == REF


def test_two_canaries_give_no_band_and_flag_nothing(drifted: Path) -> None:
    rows = query(drifted, "SELECT canary, ratio_to_first, band_low, outside FROM canary_drift WHERE sweep = 't'")
    assert rows == [{"canary": 1, "ratio_to_first": 1.0, "band_low": None, "outside": None},
                    {"canary": 2, "ratio_to_first": 0.5, "band_low": None, "outside": None}]
    assert query(drifted, "SELECT run_id, drift_flagged FROM run_drift WHERE sweep = 't'") == [
        {"run_id": f"{X}/7-1", "drift_flagged": False}]


def test_run_drift_flags_the_runs_between_two_canaries_outside_the_band(drifted: Path) -> None:
    rows = query(drifted, "SELECT * FROM run_drift WHERE sweep = 's' ORDER BY started_at")
    got = [(r["run_id"], r["canary_before"], r["canary_after"], r["drift_flagged"]) for r in rows]
    c = [f"{REF}/{CANARY_REPEAT}-{i}" for i in range(1, 8)]
    assert got == [
        (f"{X}/0-1", c[0], c[1], False),
        (f"{REF}/0-1", c[1], c[2], False),
        (f"{X}/1-1", c[1], c[2], False),
        (f"{X}/2-1", c[2], c[3], False),   # from inside the band to outside: not flagged
        (f"{X}/3-1", c[3], c[4], True),    # 80 and 79: both outside
        (f"{Y}/0-1", c[4], c[5], True),    # 79 and 78 (the failed canary at 45 is skipped)
        (f"{X}/4-1", c[5], c[6], False),   # 78, then back to 100
        (f"{Y}/1-1", c[6], None, False),   # after the last canary: one side only
    ]
    assert rows[4]["before_ratio"] == pytest.approx(80 / 99) and rows[4]["after_ratio"] == pytest.approx(79 / 99)
    assert (rows[4]["before_outside"], rows[4]["after_outside"], rows[4]["repeat"]) == (True, True, 3)
    assert query(drifted, "SELECT count(*) AS n FROM run_drift WHERE sweep = 'u'") == [{"n": 0}]  # no canary


def test_canary_runs_stay_out_of_the_views_of_cells_and_runs(drifted: Path) -> None:
    assert query(drifted, f"SELECT cell_id, runs FROM cell_stats WHERE cell_id = '{REF}'") == [
        {"cell_id": REF, "runs": 1}]
    assert query(drifted, f"SELECT count(*) AS n FROM run_overview WHERE cell_id = '{REF}'") == [{"n": 1}]
    assert query(drifted, f"SELECT runs FROM baseline WHERE cell_id = '{REF}'") == [{"runs": 1}]
    assert query(drifted, "SELECT count(*) AS n FROM runs") == [{"n": 20}]
    # the runs table keeps them, with their number in spec.json
    spec = json.loads((drifted.parent / "results" / "s" / REF / f"{CANARY_REPEAT}-4" / "spec.json").read_text())
    assert spec["canary"] == 4


def test_matrun_compare_counts_the_drifted_runs_and_never_selects_a_canary(drifted: Path) -> None:
    result = compare("s", "t", warehouse=drifted)
    [cell] = result.cells  # every bundle has the same parameters: one matched cell
    assert (len(result.a.run_ids), cell["a_runs"], cell["b_runs"]) == (8, 8, 1)
    assert (cell["a_drifted_runs"], cell["b_drifted_runs"]) == (2, 0)  # X 3-1 and Y 0-1
    assert fmt_noisy(cell) == "A drift"


def test_the_report_flags_the_drifted_runs(drifted: Path, tmp_path: Path) -> None:
    from matrun.reports.build import build_report  # Polars and Plotly load slowly

    index = build_report(warehouse=drifted, out_dir=tmp_path / "report", sweep="s")
    html = (index.parent / "baseline.html").read_text(encoding="utf-8")
    assert html.count("⚠ drift in 1 run(s)</span>") == 2  # cells X (run 3-1) and Y (run 0-1)
    assert "drift in" not in html.replace("⚠ drift in 1 run(s)</span>", "")
