"""Runs that started on a busy machine (issue 27): ``[sweep] rerun_busy`` / ``busy_reruns`` and
their hostile values, the sweep's decision to run a repeat again (runner/sweep/busy.py, on fake
results), and the statistics that set a busy run aside while a clean run of its repeat exists
(views/cell_facts_live.sql, findings, compare) on bundles with hand-set throughputs: every
expected number below is worked out from them by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bundle_factory import make_bundle, read_json
from matrun.errors import MatrixError
from matrun.runner.executors.protocol import RunOutcome
from matrun.runner.planning.matrix import DEFAULT_BUSY_RERUNS, load_matrix
from matrun.runner.sweep.busy import busy_reasons, rerun_limit, run_until_clean, started_busy
from matrun.runner.sweep.progress import SweepProgress
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.warehouse.compare import compare
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.findings import parse_study, register_study
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MATRUN = str(Path(sys.executable).with_name("matrun"))
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}

MATRIX = """
[sweep]
name = "busy"
{sweep}

[fixed]
dataset = "synthetic"
iterations = 8
warmup_steps = 2

[axes]
threads = [1, 2]
"""
STUDY = """
[study]
id = "A6"
title = "threads"

[[findings]]
id = "more"
claim = "More threads are faster"
cite = "T1"
check = "trend"
x = "threads"
metric = "throughput"
expect = "increases"
"""


def write(tmp_path: Path, sweep: str, *, study: bool = False, extra: str = "") -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text((STUDY if study else "") + MATRIX.format(sweep=sweep) + extra, encoding="utf-8")
    return path


# -- [sweep] rerun_busy and busy_reruns ------------------------------------------------------

BAD = [
    ("a string", 'rerun_busy = "yes"', 'matrix.toml: [sweep -> rerun_busy] expected true or false, got "yes"'),
    ("a number", "rerun_busy = 1", "matrix.toml: [sweep -> rerun_busy] expected true or false, got 1"),
    ("a list", "rerun_busy = [true]", "matrix.toml: [sweep -> rerun_busy] expected true or false, got ["),
    ("a table", "rerun_busy = { on = true }", "matrix.toml: [sweep -> rerun_busy] expected true or false"),
    ("negative", "busy_reruns = -1",
     "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100, got -1"),
    ("a float", "busy_reruns = 1.5",
     "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100, got 1.5"),
    ("a boolean", "busy_reruns = true",
     "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100, got true"),
    ("a string", 'busy_reruns = "2"',
     'matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100, got "2"'),
    ("too many", "busy_reruns = 101",
     "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100, got 101"),
    ("huge", "busy_reruns = 99999999999999999999",
     "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100"),
    ("nan", "busy_reruns = nan", "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100"),
]


@pytest.mark.parametrize("name, line, message", BAD, ids=[f"{b[0]}: {b[1]}" for b in BAD])
def test_a_malformed_value_is_refused_naming_the_key(tmp_path: Path, name: str, line: str, message: str) -> None:
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, line))
    assert str(info.value).startswith(message), str(info.value)


def test_both_bad_values_are_reported_together_and_in_a_profile(tmp_path: Path) -> None:
    path = write(tmp_path, 'rerun_busy = "no"\nbusy_reruns = -2',
                 extra='[profiles.quick]\nsweep = { rerun_busy = "off" }\n')
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(info.value).splitlines() == [
        'matrix.toml: [profiles -> quick -> sweep -> rerun_busy] expected true or false, got "off"',
    ]  # the profiles are checked first; the base's errors come once the profiles are good
    path = write(tmp_path, 'rerun_busy = "no"\nbusy_reruns = -2')
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(info.value).splitlines() == [
        'matrix.toml: [sweep -> rerun_busy] expected true or false, got "no"',
        "matrix.toml: [sweep -> busy_reruns] expected a number of re-runs from 0 to 100, got -2",
    ]


def test_the_cli_refuses_a_malformed_value_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "rerun_busy = 2")
    for command in ("plan", "sweep"):
        proc = subprocess.run([MATRUN, command, str(path)], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, **NO_ENGINE}, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == "Error: matrix.toml: [sweep -> rerun_busy] expected true or false, got 2\n"
    assert not (tmp_path / "results").exists()


def test_off_for_a_matrix_on_for_a_study_unless_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MATRUN_RERUN_BUSY", raising=False)  # tests/conftest.py sets it
    plain = load_matrix(write(tmp_path, "")).sweep
    assert (plain.rerun_busy, plain.busy_reruns) == (False, DEFAULT_BUSY_RERUNS) == (False, 2)
    assert load_matrix(write(tmp_path, "", study=True)).sweep.rerun_busy is True
    assert load_matrix(write(tmp_path, "rerun_busy = false", study=True)).sweep.rerun_busy is False
    assert load_matrix(write(tmp_path, "rerun_busy = true\nbusy_reruns = 0")).sweep.busy_reruns == 0
    profiled = write(tmp_path, "", study=True, extra="[profiles.quick]\nsweep = { rerun_busy = false, busy_reruns = 5 }\n")
    assert load_matrix(profiled).sweep.rerun_busy is True
    quick = load_matrix(profiled, "quick").sweep
    assert (quick.rerun_busy, quick.busy_reruns) == (False, 5)


def test_the_setting_changes_no_cell_id(tmp_path: Path) -> None:
    from matrun.runner.planning.identity import plan_cells

    ids = [[pc.cell_id for pc in plan_cells(load_matrix(write(tmp_path, sweep)), lambda fw, variant: "env")]
           for sweep in ("", "rerun_busy = true\nbusy_reruns = 7", "rerun_busy = false")]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 2


def test_plan_says_the_setting(tmp_path: Path) -> None:
    for sweep, line in (("", "busy runs: not run again ([sweep] rerun_busy = false)"),
                        ("rerun_busy = true\nbusy_reruns = 3",
                         "busy runs: a repeat whose run starts on a busy machine runs again, up to 3 time(s) "
                         "([sweep] rerun_busy, busy_reruns; local and docker executors)")):
        proc = subprocess.run([MATRUN, "plan", str(write(tmp_path, sweep))], cwd=tmp_path, capture_output=True,
                              text=True, env={**os.environ, **NO_ENGINE, "COLUMNS": "200"}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[-1] == line


# -- the decision: run the repeat again? -----------------------------------------------------

def _outcome(status: str = "ok") -> RunOutcome:
    now = datetime.now(timezone.utc).isoformat()
    return RunOutcome(status=status, exit_code=0 if status == "ok" else 1, error_tail="", started_at=now,
                      ended_at=now, wall_seconds=1.0)


class FakeRuns:
    """Each call a new attempt directory with a result.json whose machine state is the next of
    ``states`` (True: busy, False: clean, None: no state recorded) and status of ``statuses``."""

    def __init__(self, root: Path, states: list[bool | None], statuses: list[str] | None = None) -> None:
        self.root, self.states, self.statuses = root, states, statuses or ["ok"] * len(states)
        self.made: list[Path] = []
        self.told: list[tuple[str, int]] = []

    def __call__(self) -> tuple[RunOutcome, Path]:
        n = len(self.made)
        run_dir = self.root / f"0-{n + 1}"
        run_dir.mkdir(parents=True)
        state = self.states[n]
        host: dict[str, Any] = {"hostname": "h"}
        if state is not None:
            host["state"] = {"busy": state, "busy_reasons": ["other processes kept 0.90 of 1 CPU(s) busy"] * state}
        outcome = _outcome(self.statuses[n])
        (run_dir / "result.json").write_text(json.dumps({"status": outcome.status, "host": host}))
        self.made.append(run_dir)
        return outcome, run_dir

    def again(self, outcome: RunOutcome, run_dir: Path, number: int) -> None:
        self.told.append((run_dir.name, number))


@pytest.mark.parametrize("states, statuses, limit, runs, told, busy", [
    ([False], None, 2, 1, [], False),                         # a clean run: nothing again
    ([None], None, 2, 1, [], False),                          # no machine state recorded: clean
    ([True, False], None, 2, 2, [("0-1", 1)], False),         # a busy run: exactly one re-run
    ([True, True, True], None, 2, 3, [("0-1", 1), ("0-2", 2)], True),  # the limit stops it
    ([True, True], None, 1, 2, [("0-1", 1)], True),
    ([True], None, 0, 1, [], True),                           # rerun_busy = false: never again
    ([True], ["failed"], 2, 1, [], False),                    # a failed run is left to the next sweep
    ([True, True], ["ok", "timeout"], 2, 2, [("0-1", 1)], False),
])
def test_a_busy_run_is_run_again_until_clean_or_the_limit(tmp_path: Path, states, statuses, limit, runs, told,
                                                          busy) -> None:
    fake = FakeRuns(tmp_path, states, statuses)
    ran = run_until_clean(fake, limit, again=fake.again)
    assert len(fake.made) == runs and fake.told == told
    assert (ran.run_dir, ran.reruns, ran.busy) == (fake.made[-1], len(told), busy)
    assert all(d.is_dir() for d in fake.made)  # every attempt kept


def test_rerun_busy_false_means_no_re_run_whatever_busy_reruns_says() -> None:
    assert rerun_limit(False, 5) == 0 and rerun_limit(True, 5) == 5 and rerun_limit(True, 0) == 0


def test_busy_is_read_from_the_bundle_as_the_warehouse_reads_it(tmp_path: Path) -> None:
    def result(host: Any) -> Path:
        run = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / "result.json").write_text(json.dumps({"host": host}))
        return run

    assert started_busy(result({"state": {"busy": True, "busy_reasons": ["x", 3]}}))
    assert busy_reasons(tmp_path / "r0") == ["x"]
    assert not started_busy(result({"state": {"busy": "true"}}))  # rows.py: not a boolean, NULL
    assert not started_busy(result({"state": {"busy": False}}))
    assert not started_busy(result({"state": None})) and not started_busy(result(None))
    missing = tmp_path / "none"
    missing.mkdir()
    assert not started_busy(missing) and busy_reasons(missing) == []
    (missing / "result.json").write_text("{not json")
    assert not started_busy(missing)


def test_a_re_run_adds_to_the_progress_and_its_estimate() -> None:
    progress = SweepProgress(total=2, expected={"a": 10.0, "b": 20.0}, estimate_s=30.0)
    progress.started("a")
    progress.ended("a", 9.0)
    progress.added("a")
    assert (progress.total, progress.done, progress.left()) == (3, 1, 30.0)


# -- the statistics: busy runs set aside while a clean run of their repeat exists ------------

A, B = "busy0000000000aa", "clean000000000bb"


def _run(results: Path, cell_id: str, repeat: int, attempt: int, throughput: float, busy: bool | None, *,
         threads: int, status: str = "ok") -> None:
    run = make_bundle(results, sweep="busy", cell_id=cell_id, repeat=repeat, attempt=attempt,
                      params={"threads": threads}, throughput=throughput, status=status,
                      exit_code=0 if status == "ok" else 1)
    result = read_json(run / "result.json")
    if busy is not None:
        result["host"]["state"] = {"busy": busy, "busy_reasons": ["other processes kept 0.90 …"] if busy else []}
    write_json_atomic(run / "result.json", result)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cell A (threads 1), per repeat its attempts as (throughput, busy):
    repeat 0: (50, busy) (100, clean)      -> the busy run set aside
    repeat 1: (110, clean)
    repeat 2: (40, busy) (45, busy)        -> no clean run: both kept
    repeat 3: (60, busy) (failed, clean)   -> a failed run is no clean ok run: kept
    repeat 4: (30, busy) (120, no state)   -> NULL counts as clean: set aside
    Kept: 40, 45, 60, 100, 110, 120 (median 80) of 8 ok runs; 2 set aside.
    Cell B (threads 2): 200, 210, 220, all clean."""
    results = tmp_path_factory.mktemp("busy") / "results"
    for repeat, attempts in enumerate([[(50, True), (100, False)], [(110, False)], [(40, True), (45, True)],
                                       [(60, True), (None, False)], [(30, True), (120, None)]]):
        for attempt, (throughput, busy) in enumerate(attempts, start=1):
            _run(results, A, repeat, attempt, throughput or 1.0, busy, threads=1,
                 status="ok" if throughput else "failed")
    for repeat, throughput in enumerate((200, 210, 220)):
        _run(results, B, repeat, 1, throughput, False, threads=2)
    path = results.parent / "w.duckdb"
    assert not ingest([results], warehouse=path).skipped
    errors: list[Any] = []
    decl = parse_study({"study": {"id": "A6", "title": "threads"}, "findings": [
        {"id": "more", "claim": "More threads are faster", "cite": "T1", "check": "trend", "x": "threads",
         "metric": "throughput", "expect": "increases"}]}, lambda where, message: errors.append((where, message)))
    assert decl is not None and not errors, errors
    with open_warehouse(path) as wh:
        register_study(wh.con, decl, profile=None, matrix="studies/A6.toml", cell_ids=[A, B])
    return path


def query(warehouse: Path, sql: str) -> list[dict[str, Any]]:
    columns, rows = run_query(sql, warehouse=warehouse)
    return [dict(zip(columns, row)) for row in rows]


def test_the_cell_statistics_set_busy_runs_aside_while_a_clean_run_of_their_repeat_exists(warehouse: Path) -> None:
    a, b = query(warehouse, "SELECT * FROM cell_stats ORDER BY threads")
    assert (a["cell_id"], a["runs"], a["failed_runs"], a["busy_set_aside"]) == (A, 8, 1, 2)
    assert a["throughput_values"] == [40.0, 45.0, 60.0, 100.0, 110.0, 120.0]
    assert (a["throughput_n"], a["throughput_median"]) == (6, 80.0)
    assert (b["runs"], b["busy_set_aside"], b["throughput_median"]) == (3, 0, 210.0)
    # the per-epoch rows count the same runs
    (epochs,) = query(warehouse, f"SELECT max(runs) AS runs FROM epoch_convergence WHERE cell_id = '{A}'")
    assert epochs["runs"] == 6
    # baseline describes every ok run of the sweep and flags the busy ones
    (base,) = query(warehouse, f"SELECT runs, busy_runs, throughput_median FROM baseline WHERE cell_id = '{A}'")
    assert base == {"runs": 8, "busy_runs": 5, "throughput_median": 55.0}


def test_the_cached_facts_are_the_computed_ones(warehouse: Path) -> None:
    cached = query(warehouse, "SELECT cell_id, busy_set_aside, throughput_values FROM cell_facts ORDER BY cell_id")
    live = query(warehouse, "SELECT cell_id, busy_set_aside, throughput_values FROM cell_facts_live ORDER BY cell_id")
    assert cached == live and [r["busy_set_aside"] for r in cached] == [2, 0]


def test_the_busy_flag_is_in_the_cells_fingerprint(tmp_path: Path) -> None:
    """A run whose busy_start changes (a bundle re-ingested after a fix) computes its cell again."""
    from matrun.warehouse import materialise

    results = tmp_path / "results"
    _run(results, A, 0, 1, 50, False, threads=1)
    _run(results, A, 0, 2, 100, False, threads=1)
    path = tmp_path / "w.duckdb"
    ingest([results], warehouse=path)
    with open_warehouse(path) as wh:
        wh.con.execute("BEGIN TRANSACTION")
        wh.con.execute(f"UPDATE runs SET busy_start = true WHERE run_id = '{A}/0-1'")
        materialise.refresh(wh.con)
        wh.con.execute("COMMIT")
        (row,) = wh.con.execute("SELECT busy_set_aside, throughput_median FROM cell_facts").fetchall()
    assert row == (1, 100.0)


def test_the_findings_verdict_says_how_many_busy_runs_were_set_aside(warehouse: Path) -> None:
    (row,) = query(warehouse, "SELECT * FROM findings WHERE study = 'A6'")
    assert (row["cell_id"], row["ref_cell_id"], row["busy_set_aside"]) == (B, A, 2)
    assert row["observed"] == "2 threads: 210 img/s vs 1 thread: 80.0 img/s (2.62× (1.75–5.25), +162.5 %); 2 busy runs set aside"
    assert (row["n"], row["ref_n"]) == (3, 6)


def test_compare_sets_busy_runs_aside_within_each_side(warehouse: Path) -> None:
    result = compare(f"sql:SELECT run_id FROM runs WHERE cell_id = '{A}'",
                     f"sql:SELECT run_id FROM runs WHERE cell_id = '{B}'", warehouse=warehouse, ignore=["threads"])
    (cell,) = result.matched
    assert (cell["a_runs"], cell["a_busy_set_aside"], cell["a_throughput"]) == (8, 2, 80.0)
    assert (cell["b_runs"], cell["b_busy_set_aside"], cell["b_throughput"]) == (3, 0, 210.0)
    # a side that selects only the busy attempt of repeat 0 keeps it: no clean run of it is selected
    only_busy = compare(f"sql:SELECT run_id FROM runs WHERE run_id = '{A}/0-1'",
                        f"sql:SELECT run_id FROM runs WHERE cell_id = '{B}'", warehouse=warehouse, ignore=["threads"])
    (cell,) = only_busy.matched
    assert (cell["a_runs"], cell["a_busy_set_aside"], cell["a_throughput"]) == (1, 0, 50.0)


def test_the_compare_command_notes_the_busy_runs_set_aside(warehouse: Path) -> None:
    proc = subprocess.run([MATRUN, "compare", f"sql:SELECT run_id FROM runs WHERE cell_id = '{A}'",
                           f"sql:SELECT run_id FROM runs WHERE cell_id = '{B}'", "--ignore", "threads",
                           "--warehouse", str(warehouse)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("note: busy runs set aside (they started on a busy machine and a clean run of the same repeat is "
            "compared instead): A 2, B 0") in proc.stdout


def test_the_sweep_display_prints_the_re_run_and_counts_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rich.console import Console

    from matrun.runner.cli.progress import SweepDisplay
    from matrun.runner.planning.identity import plan_cells
    from matrun.runner.sweep.records import SweepEvent

    pc = plan_cells(load_matrix(write(tmp_path, "rerun_busy = true")), lambda fw, variant: "env")[0]
    display = SweepDisplay(Console(stderr=True))
    assert not display.live  # captured: the plain lines
    display(SweepEvent("plan", "2 runs to do, 0 already done", total=2, expected={}))
    display(SweepEvent("run-start", cell=pc, repeat=0))
    display(SweepEvent("run-end", cell=pc, repeat=0, outcome=_outcome()))
    display(SweepEvent("run-again", f"cell {pc.cell_id} repeat 0 started on a busy machine (…): running it "
                                    "again, busy re-run 1 of 2", cell=pc, repeat=0))
    display(SweepEvent("run-start", cell=pc, repeat=0))
    display.stop()
    lines = capsys.readouterr().err.splitlines()
    assert f"cell {pc.cell_id} repeat 0 started on a busy machine (…): running it again, busy re-run 1 of 2" in lines
    assert [line.split(":")[0] for line in lines if line.startswith("run ")] == ["run 1 of 2", "run 2 of 3"]


@pytest.mark.parametrize("value, plain, study", [
    ("", False, True), ("  ", False, True), ("false", False, False), ("0", False, False), ("No", False, False),
    ("true", True, True), (" 1 ", True, True), ("YES", True, True)])
def test_matrun_rerun_busy_sets_the_default_of_a_file_that_does_not_say(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, plain: bool, study: bool) -> None:
    monkeypatch.setenv("MATRUN_RERUN_BUSY", value)
    assert load_matrix(write(tmp_path, "")).sweep.rerun_busy is plain
    assert load_matrix(write(tmp_path, "", study=True)).sweep.rerun_busy is study
    # the file's own setting wins
    assert load_matrix(write(tmp_path, "rerun_busy = true")).sweep.rerun_busy is True
    assert load_matrix(write(tmp_path, "rerun_busy = false", study=True)).sweep.rerun_busy is False


@pytest.mark.parametrize("value", ["maybe", "2", "truee", "\x1b[31mred", "t" * 500])
def test_a_malformed_matrun_rerun_busy_is_refused_naming_the_variable(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, "", study=True)
    proc = subprocess.run([MATRUN, "plan", str(path)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE, "MATRUN_RERUN_BUSY": value}, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: MATRUN_RERUN_BUSY: expected true or false, got ")
    assert "Traceback" not in proc.stderr and "\x1b" not in proc.stderr and len(proc.stderr) < 200
