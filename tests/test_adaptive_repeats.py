"""Adaptive repeats (issue 27): ``[sweep] repeats = { min, max, max_time }`` and ``--repeats
MIN..MAX``, their hostile values, and a real sweep (the warehouse, its findings view and the
sweep loop; only the cell's training is faked: an executor that writes each run's records
with a throughput chosen per (cell, repeat)) that adds repeats only while its verdict is
undecided, records the design's level in every run, and is judged at that level."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bundle_factory import make_bundle
from matrun.errors import InputError, MatrixError
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.protocol import RunOutcome, RunRequest
from matrun.runner.planning.matrix import load_matrix, repeats_option
from matrun.runner.planning.sequential import design
from matrun.runner.sweep import run as sweep_run
from matrun.warehouse.bundles.layout import EVENTS, MONITOR, STDERR, STDOUT
from matrun.warehouse.query import run_query

MATRUN = str(Path(sys.executable).with_name("matrun"))
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}

MATRIX = """
[study]
id = "adaptive"
title = "threads, adaptively"

[[findings]]
id = "more"
claim = "More threads are faster"
cite = "T1"
check = "trend"
x = "threads"
metric = "throughput"
expect = "increases"

[sweep]
name = "adaptive"
executor = "local"
{repeats}

[fixed]
dataset = "synthetic"
iterations = 8
warmup_steps = 2

[axes]
threads = [1, 2]
"""


def write(tmp_path: Path, repeats: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX.format(repeats=repeats), encoding="utf-8")
    return path


# -- [sweep] repeats = { ... } and --repeats -------------------------------------------------

BAD = [
    ("min above max", "repeats = { min = 8, max = 4 }", "[sweep -> repeats] min (8) is more than max (4)"),
    ("no max", "repeats = { min = 4 }", "[sweep -> repeats] adaptive repeats need max"),
    ("no min", "repeats = { max = 4 }", "[sweep -> repeats] adaptive repeats need min"),
    ("zero budget", "repeats = { min = 4, max = 8, max_time = 0 }",
     "[sweep -> repeats -> max_time] expected a positive time budget"),
    ("negative budget", "repeats = { min = 4, max = 8, max_time = -60 }",
     "[sweep -> repeats -> max_time] expected a positive time budget"),
    ("text budget", 'repeats = { min = 4, max = 8, max_time = "soon" }',
     "[sweep -> repeats -> max_time] expected a positive time budget"),
    ("unknown key", "repeats = { min = 4, max = 8, step = 2 }", "[sweep -> repeats -> step] unknown key"),
    ("boolean min", "repeats = { min = true, max = 8 }", "[sweep -> repeats -> min] expected a repeat count"),
    ("max too large", "repeats = { min = 4, max = 101 }",
     "[sweep -> repeats -> max] expected a repeat count from 1 to 100, got 101"),
    ("a string", 'repeats = "4..8"', "[sweep -> repeats] expected a repeat count from 1 to 1000, or a table"),
]


@pytest.mark.parametrize("what,line,message", BAD, ids=[b[0] for b in BAD])
def test_a_malformed_adaptive_design_is_refused_naming_the_key(tmp_path: Path, what: str, line: str,
                                                               message: str) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, line))
    assert message in str(err.value)


def test_plan_refuses_a_malformed_adaptive_design_with_an_error_line(tmp_path: Path) -> None:
    for _, line, message in BAD[:2]:
        done = subprocess.run([MATRUN, "plan", str(write(tmp_path, line))], capture_output=True, text=True,
                              env={**os.environ, **NO_ENGINE}, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith("Error: ") and "Traceback" not in done.stderr
        assert message in done.stderr


def test_an_adaptive_design_parses_into_its_fields(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, "repeats = { min = 4, max = 12, max_time = 3600 }"))
    assert (m.sweep.repeats, m.sweep.repeats_max, m.sweep.max_time) == (4, 12, 3600.0)
    same = load_matrix(write(tmp_path, "repeats = { min = 5, max = 5 }"))  # one look: a fixed design
    assert (same.sweep.repeats, same.sweep.repeats_max, same.sweep.max_time) == (5, None, None)


@pytest.mark.parametrize("text,max_time,message", [
    ("12..4", None, "--repeats: min (12) is more than max (4)"),
    ("0", None, "--repeats: expected a repeat count from 1 to 1000, got 0"),
    ("4..200", None, "--repeats: adaptive repeats go from 1 to 100, got 4..200"),
    ("four", None, '--repeats: expected N or MIN..MAX (e.g. 4..12), got "four"'),
    ("4..8; rm -rf /", None, "--repeats: expected N or MIN..MAX"),
    (None, 0.0, "--max-time: expected a positive time budget"),
    (None, float("nan"), "--max-time: expected a positive time budget"),
    (None, -5.0, "--max-time: expected a positive time budget"),
])
def test_a_bad_repeats_flag_is_an_input_error(text: str | None, max_time: float | None, message: str) -> None:
    with pytest.raises(InputError) as err:
        repeats_option(text, max_time)
    assert message in str(err.value)


def test_the_sweep_command_refuses_a_bad_repeats_flag_before_anything_runs(tmp_path: Path) -> None:
    path = write(tmp_path, "repeats = 2")
    for args in (["--repeats", "9..3"], ["--max-time", "-1"], ["--repeats", "x"]):
        done = subprocess.run([MATRUN, "sweep", str(path), *args], capture_output=True, text=True,
                              env={**os.environ, **NO_ENGINE}, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("Error: --") and "Traceback" not in done.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "matrun.duckdb").exists()


def test_slurm_refuses_adaptive_repeats(tmp_path: Path) -> None:
    path = write(tmp_path, "repeats = { min = 4, max = 8 }")
    with pytest.raises(InputError) as err:
        sweep_run.run_sweep(matrix_path=path, executor="slurm")
    assert "adaptive repeats need the local or docker executor" in str(err.value)


# -- a sweep that adds repeats while its verdict is undecided ----------------------------------

# Per threads value, the throughput of repeat 0, 1, ...: 2 threads is about 1.25x faster, but
# repeat 3 of 1 thread is an outlier above every 2-thread run, so U = k(k-1) of k*k: 4 against
# 4 p = 0.343, 5 against 5 p = 0.151, 6 against 6 p = 0.065, 7 against 7 p = 0.0262 (exact).
SERIES = {
    "1": [100.0, 101.0, 99.0, 130.0, 100.5, 102.0, 98.0, 101.5, 99.5, 100.2, 100.8, 99.8],
    "2": [125.0, 124.0, 126.0, 123.0, 127.0, 125.5, 124.5, 126.5, 125.2, 124.8, 125.8, 124.2],
}


class FakeTraining(LocalExecutor):
    """The local executor, its cell's training replaced by records with a set throughput."""

    name = "local"

    def prepare(self, envs: Any, *, log: Any) -> None:  # nothing to build
        return None

    def run(self, request: RunRequest) -> RunOutcome:
        spec = json.loads((request.run_dir / "spec.json").read_text(encoding="utf-8"))
        value = sys.modules[__name__].SERIES[str(spec["params"]["threads"])][spec["repeat"]]
        scratch = request.run_dir.parent / f".scratch-{spec['repeat']}-{spec['attempt']}"
        made = make_bundle(scratch, sweep="s", cell_id=spec["cell_id"], params=dict(spec["params"]),
                           throughput=value, with_result=False)
        for name in (EVENTS, MONITOR, STDOUT, STDERR):
            shutil.copy(made / name, request.run_dir / name)
        shutil.rmtree(scratch)
        now = datetime.now(timezone.utc).isoformat()
        return RunOutcome(status="ok", exit_code=0, error_tail="", started_at=now, ended_at=now, wall_seconds=0.1)


def _sweep(monkeypatch: pytest.MonkeyPatch, path: Path, **kw: Any) -> tuple[Any, list[str]]:
    monkeypatch.setattr(sweep_run, "get_executor", lambda name, **_: (FakeTraining(), "executor: local (fake)"))
    events: list[str] = []
    summary = sweep_run.run_sweep(matrix_path=path, on_event=lambda e: events.append(f"{e.kind}: {e.text}"), **kw)
    return summary, events


def _runs(path: Path) -> list[tuple[str, int, float | None]]:
    _, rows = run_query('SELECT params ->> \'threads\', "repeat", design_level FROM runs ORDER BY 1, 2',
                        warehouse=path.parent / "matrun.duckdb")
    return [tuple(r) for r in rows]


def _finding(path: Path) -> dict[str, Any]:
    columns, rows = run_query("SELECT verdict, test, p_value, n, ref_n FROM findings WHERE study = 'adaptive'",
                              warehouse=path.parent / "matrun.duckdb")
    return dict(zip(columns, rows[0]))


def test_an_adaptive_sweep_adds_repeats_until_the_verdict_is_decided(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    d = design(4, 8)
    assert abs(d.level - 0.026224) < 1e-6  # 7 against 7 with U = 42 (p 0.0262) is decided; 6 against 6 is not
    path = write(tmp_path, "repeats = { min = 4, max = 8 }")
    summary, events = _sweep(monkeypatch, path)
    runs = _runs(path)
    # 4 + 3 rounds for both cells, never the 8th
    assert [(t, r) for t, r, _ in runs] == [(t, r) for t in ("1", "2") for r in range(7)]
    assert {lvl for _, _, lvl in runs} == {d.level}  # every run records its design's level
    assert summary.adaptive_rounds == 3 and summary.adaptive_runs == 6 and summary.undecided == 0
    row = _finding(path)
    assert row["verdict"] == "reproduced" and (row["n"], row["ref_n"]) == (7, 7)
    assert row["test"] == f"mann-whitney exact at p <= {d.level:.4f} (adaptive repeats)"
    assert any(e.startswith("adaptive: adaptive repeats: repeat 5 of at most 8 for 2 cell(s) of 1 undecided")
               for e in events)
    assert any("every verdict is decided after 7 repeats" in e for e in events)
    # run again: nothing to do, nothing added (the verdict is decided)
    again, _ = _sweep(monkeypatch, path)
    assert again.ran == 0 and again.adaptive_rounds == 0 and len(_runs(path)) == 14


def test_max_stops_an_undecided_sweep_and_the_verdict_stays_at_the_designs_level(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "repeats = { min = 4, max = 5 }")
    d = design(4, 5)
    summary, events = _sweep(monkeypatch, path)
    assert len(_runs(path)) == 10 and summary.adaptive_rounds == 1 and summary.undecided == 1
    assert any("max (5) reached; still undecided: finding more 1.2" in e for e in events)
    assert _finding(path)["verdict"] == "not significant"
    assert d.level < 0.05


def test_a_fixed_sweep_of_the_same_runs_is_judged_at_005(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same 7 against 7 values from a fixed design: p = 0.0262 < 0.05, no level recorded;
    and 6 against 6 (p 0.065) is not significant at 0.05 either."""
    path = write(tmp_path, "repeats = 7")
    summary, _ = _sweep(monkeypatch, path)
    assert {lvl for _, _, lvl in _runs(path)} == {None} and summary.adaptive_rounds == 0
    row = _finding(path)
    assert row["verdict"] == "reproduced" and row["test"] == "mann-whitney exact"


def test_max_time_stops_adding_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "repeats = { min = 4, max = 8, max_time = 0.001 }")
    summary, events = _sweep(monkeypatch, path)
    assert len(_runs(path)) == 8 and summary.adaptive_rounds == 0 and summary.undecided == 1
    assert any("max_time (0.001 s) reached" in e for e in events)


def test_the_command_line_design_overrides_the_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "repeats = 2")
    summary, _ = _sweep(monkeypatch, path, repeats=repeats_option("4..5"))
    assert len(_runs(path)) == 10 and summary.adaptive_rounds == 1
    assert {lvl for _, _, lvl in _runs(path)} == {design(4, 5).level}


def test_a_hostile_level_in_a_bundle_cannot_make_a_comparison_easier(tmp_path: Path) -> None:
    from matrun.warehouse.rows import _design_level

    assert _design_level({"level": 0.0179}) == 0.0179
    for bad in ({"level": 0.9}, {"level": 0}, {"level": -1}, {"level": "0.01"}, {"level": True},
                {"level": float("nan")}, {"level": None}, [], "0.01", None, {}):
        assert _design_level(bad) is None, bad


# -- matrun plan: the range, the estimate, --detect -------------------------------------------


def _plan(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MATRUN, "plan", str(path), *args], capture_output=True, text=True,
                          env={**os.environ, **NO_ENGINE, "COLUMNS": "200"}, timeout=120)


def test_plan_says_an_adaptive_designs_range_and_level(tmp_path: Path) -> None:
    done = _plan(write(tmp_path, "repeats = 2"), "--repeats", "4..8", "--max-time", "900")
    assert done.returncode == 0, done.stderr
    assert "2 cells × 4–8 repeats (adaptive)" in done.stdout
    assert (f"adaptive repeats: 4 to 8 per cell, each look at p <= {design(4, 8).level:.4f}" in done.stdout
            and "at most 16 runs (8 beyond the first 4)" in done.stdout
            and "no round starts after 900 s of the sweep" in done.stdout)


def test_plan_warns_when_a_study_can_never_be_decided(tmp_path: Path) -> None:
    done = _plan(write(tmp_path, "repeats = 3"))
    assert done.returncode == 0
    assert ("warning: study adaptive: with 3 repeats no verdict can ever be significant (3 against 3 runs cannot "
            "reach p < 0.05)") in done.stderr
    assert "warning" not in _plan(write(tmp_path, "repeats = 4")).stderr
    refused = _plan(write(tmp_path, "repeats = { min = 2, max = 3 }"))
    assert refused.returncode == 2 and "[sweep -> repeats -> max] no verdict can be decided with at most 3" in refused.stderr
    refused = _plan(write(tmp_path, "repeats = 4"), "--repeats", "2..3")
    assert refused.returncode == 2 and refused.stderr.startswith("Error: --repeats: no verdict can be decided")


@pytest.mark.parametrize("value", ["1", "0.5", "-1", "nan", "inf", "1000"])
def test_a_bad_detect_is_an_error_line(tmp_path: Path, value: str) -> None:
    done = _plan(write(tmp_path, "repeats = 4"), "--detect", value)
    assert done.returncode == 2 and done.stderr.startswith("Error: --detect: expected an effect")
    assert "Traceback" not in done.stderr


def test_detect_reads_this_hosts_noise_from_the_warehouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake runs' throughputs (SERIES) have a CV of 8.9 % (1 thread) and 1.1 % (2 threads):
    at 1.1x the noisy cell's 4 repeats have little power and the plan says how many would do."""
    path = write(tmp_path, "repeats = 4")
    nothing = _plan(path, "--detect", "1.1")
    assert "no throughput of this host yet" in nothing.stderr and nothing.returncode == 0
    _sweep(monkeypatch, path)
    done = _plan(path, "--detect", "1.1")
    assert done.returncode == 0, done.stderr
    assert "--detect 1.1: power of 4 repeats at this host's measured noise" in done.stdout
    rows = [line for line in done.stdout.splitlines() if "%" in line and "│" in line]
    assert len(rows) == 2  # two CVs, one cell each
    assert "warning: --detect 1.1: 4 repeats cannot reach 80% power for 1 of 2 cells" in done.stderr
    from matrun.runner.planning.sequential import repeats_needed, simulate

    assert simulate(design(4, 4), 2.0, 0.02, draws=500).power > 0.99  # a large effect on quiet runs
    assert repeats_needed(1.1, 0.2, draws=400) > repeats_needed(1.1, 0.05, draws=400)  # noise costs repeats


def test_a_futile_verdict_gets_no_more_repeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 threads as fast as 1 (within a few %): after 6 repeats the ratio's interval says 12
    cannot be expected to decide it (sequential.futile), so the sweep stops there, undecided."""
    same = {"1": [100.0, 103.0, 97.0, 101.0, 99.0, 102.0, 98.0, 100.5, 99.5, 101.5, 98.5, 100.2],
            "2": [101.0, 98.0, 102.0, 99.0, 100.0, 97.5, 103.0, 99.2, 100.8, 98.8, 101.2, 100.1]}
    monkeypatch.setattr(sys.modules[__name__], "SERIES", same)
    path = write(tmp_path, "repeats = { min = 4, max = 12 }")
    summary, events = _sweep(monkeypatch, path)
    assert len(_runs(path)) == 12 and summary.undecided == 1  # 6 repeats each, not 12
    assert any("no more repeats for finding more" in e and "after 6" in e for e in events)
    assert _finding(path)["verdict"] == "not significant"


def test_futility_is_judged_from_the_interval() -> None:
    from matrun.runner.planning.sequential import FUTILITY_FROM, futile, ratio_interval

    level = design(4, 12).level
    assert not futile(0.99, 1.41, 6, 12, level)  # a 1.2x effect, a wide interval: keep going
    assert futile(0.95, 1.06, 6, 12, level)  # about no difference, a narrow interval: futile
    assert not futile(0.95, 1.06, FUTILITY_FROM - 1, 12, level)  # too early to judge
    assert not futile(0.95, 1.06, 12, 12, level) and not futile(None, None, 8, 12, level)
    assert not futile(0.0, 1.06, 8, 12, level) and not futile(1.2, 1.1, 8, 12, level)  # no usable interval
    low, high = ratio_interval([2.0, 2.1, 2.2, 2.3], [1.0, 1.1, 1.2, 1.3])  # 4 vs 4: k = 1, the full range
    assert (low, high) == (pytest.approx(2.0 / 1.3), pytest.approx(2.3 / 1.0))
    assert ratio_interval([1.0, -1.0], [1.0]) is None and ratio_interval([], [1.0]) is None
