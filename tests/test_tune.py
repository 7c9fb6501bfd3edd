"""`matrun tune` (runner/sweep/tune.py, runner/cli/tune.py, warehouse/tunings.py,
reports/tune_pages.py).

The search's rules are tested on real matrix files with a measure that computes each cell's
throughput and accuracy from its parameters (no run: a landscape whose best is known), through
the same Tuner class the CLI runs: the cells and their ids are the sweep's, the refusals the
planner's.  The CLI is tested end to end with real PyTorch runs of a small space: the answer, the
warehouse's tuning tables, the report page, a resume after kill -9, and the bad inputs."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import pytest

from lake_client import plain_connect
from matrun.errors import InputError, MatrixError
from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.identity import identify, plan_cells
from matrun.runner.planning.matrix import load_matrix, load_space
from matrun.runner.sweep import tune as tn

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}

SPACE = """
[sweep]
name = "tune"
executor = "local"
[fixed]
model = "lenet5"
dataset = "synthetic"
[axes]
framework = ["torch", "jax"]
threads = [1, 2]
batch_size = [16, 32, 64, 128, 256]
layout = ["nchw", "nhwc"]
precision = ["fp32", "bf16"]
onednn = [true, false]

[[exclude]]
framework = "jax"
onednn = false
"""


def runner_ids():
    runner, _ = get_executor("local")
    return lambda cell: identify(cell, runner.env_id)[0]


class Landscape:
    """Throughput and accuracy as functions of a cell's parameters: larger batches and two
    threads are faster, bf16 slower; accuracy falls with the batch size (fewer steps).  Runs
    of the same cell add a small spread, deterministically."""

    def __init__(self, ids: Any, fail: set[str] | None = None) -> None:
        self.ids, self.fail = ids, fail or set()
        self.values_of: dict[str, Any] = {}
        self.runs: dict[str, int] = {}
        self.calls: list[str] = []

    def value(self, v: Mapping[str, Any], repeat: int) -> tuple[float, float]:
        bs = int(v["batch_size"])
        thr = 1000.0 * (1 + 0.9 * (bs / 256)) * (1.7 if v["threads"] == 2 else 1.0)
        thr *= 0.6 if v["precision"] == "bf16" else 1.0
        thr *= 1.05 if v["layout"] == "nhwc" else 1.0
        thr *= 0.9 if v.get("onednn") is False else 1.0
        thr *= 1.3 if v["framework"] == "jax" else 1.0
        thr *= 1 + 0.004 * ((repeat * 7919) % 5 - 2)
        acc = 0.80 - 0.05 * max(0, (bs - 64) / 64)
        return thr, acc

    def measure(self, cell: Any, combo: Mapping[str, Any], runs: int) -> tuple[int, float]:
        cid = self.ids(cell)
        self.calls.append(cid)
        have = self.runs.get(cid, 0)
        self.runs[cid] = max(have, runs)
        self.values_of[cid] = cell.values
        return max(0, runs - have), 0.5 * max(0, runs - have)

    def evidence(self, cell_ids: Any) -> dict[str, tn.Evidence]:
        out = {}
        for cid in cell_ids:
            n = self.runs.get(cid, 0)
            if not n:
                continue
            if cid in self.fail:
                out[cid] = tn.Evidence(failed=n, reason="failed: RuntimeError: boom")
                continue
            vals = [self.value(self.values_of[cid], r) for r in range(n)]
            out[cid] = tn.Evidence(values=[v for v, _ in vals], accuracies=[a for _, a in vals], ok=n)
        return out


class Memory:
    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        self.rows = list(rows or [])
        self.status: list[str] = []

    def trials(self) -> list[dict[str, Any]]:
        return list(self.rows)

    def add(self, trial: dict[str, Any]) -> None:
        self.rows.append(json.loads(json.dumps(trial)))

    def save(self, status: str, summary: Any) -> None:
        self.status.append(status)


@pytest.fixture
def space_file(tmp_path: Path) -> Path:
    p = tmp_path / "space.toml"
    p.write_text(SPACE, encoding="utf-8")
    return p


def tuner(space_path: Path, land: Landscape, store: Memory, **kw: Any) -> tn.Tuner:
    settings = tn.Settings(**{"budget_runs": 30, "accuracy_within": 2.0, "seed": 0, **kw})
    return tn.Tuner(load_space(space_path), settings, measure=land.measure, evidence=land.evidence, store=store,
                    cell_id=land.ids)


def test_a_trial_is_the_sweeps_own_cell_and_refusals_are_the_planners(space_file: Path) -> None:
    ids = runner_ids()
    runner, _ = get_executor("local")
    planned = {pc.cell_id: pc for pc in plan_cells(load_matrix(space_file), runner.env_id)}
    space = load_space(space_file)
    assert space.size == 2 * 2 * 5 * 2 * 2 * 2 and len(planned) == 80 + 40
    cell = tn.cell_for(space, {"framework": "torch", "threads": 2, "batch_size": 64, "layout": "nhwc",
                               "precision": "fp32", "onednn": False})
    assert not isinstance(cell, str) and ids(cell) in planned  # the same id as the full plan's
    assert tn.cell_for(space, {"framework": "jax", "threads": 2, "batch_size": 64, "layout": "nhwc",
                               "precision": "fp32", "onednn": False}) == "excluded by [[exclude]]"
    refused = tn.cell_for(space, {"framework": "jax", "threads": 2, "batch_size": 64, "layout": "nhwc",
                                  "precision": "fp32", "onednn": True, "interop_threads": 2})
    assert isinstance(refused, str) and "jax cannot run this cell" in refused and "inter-op" in refused
    # each framework's default: the searched parameters at matrun's defaults (threads unset)
    combo = tn.default_combo(space, tn.dimensions(space), "torch")
    assert combo == {"framework": "torch", "threads": "unset", "batch_size": 64, "layout": "nchw",
                     "precision": "fp32", "onednn": True}
    assert not isinstance(tn.cell_for(space, combo), str)


def test_a_space_too_large_to_plan_is_searched_lazily(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text(SPACE.replace('batch_size = [16, 32, 64, 128, 256]', 'batch_size = ' + str(list(range(8, 60008)))),
                   encoding="utf-8")
    with pytest.raises(MatrixError, match="over the limit"):
        load_matrix(big)
    space = load_space(big)
    assert space.size == 2 * 2 * 60000 * 2 * 2 * 2 > 10**6
    land = Landscape(runner_ids())
    store = Memory()
    s = tuner(big, land, store, budget_runs=12, confirm=False).run()
    assert s["runs"] == 12 and len(land.calls) == 12  # two defaults and ten sampled cells, each planned alone
    assert all(r["cell_id"] for r in store.rows if r["state"] != "refused")


def test_the_search_finds_the_best_feasible_cell_within_its_budget(space_file: Path) -> None:
    land = Landscape(runner_ids())
    store = Memory()
    s = tuner(space_file, land, store, budget_runs=40).run()
    assert s["runs"] <= 40 and sum(r["runs"] for r in store.rows) == s["runs"]
    by_fw = {a["framework"]: a for a in s["answer"]}
    for fw in ("torch", "jax"):
        best = by_fw[fw]["best"]
        # feasible: accuracy at most 2 points below the default (batch 64: 0.80) -> batch <= 64
        assert best["params"]["batch_size"] <= 64 and best["accuracy"] >= 0.78
        assert best["params"]["precision"] == "fp32"
        assert by_fw[fw]["default"]["runs"] >= tn.CONFIRM_RUNS and best["runs"] >= tn.CONFIRM_RUNS
        assert by_fw[fw]["comparison"]["ratio"] > 1
    # the fastest cells (batch 256) were measured or not, never chosen: infeasible
    assert all(r["state"] in ("infeasible", "refused") for r in store.rows if r["params"].get("batch_size") == 256)
    assert set(s["importance"]) == {"torch", "jax"}
    assert set(s["importance"]["torch"]) == {"threads", "batch_size", "layout", "precision", "onednn"}
    assert set(s["importance"]["jax"]) == {"threads", "batch_size", "layout", "precision", "onednn"}
    assert s["trace"][-1]["runs"] <= s["runs"] and s["trace"][-1]["best"] is not None
    assert store.status == ["running", "done"]


def test_a_failed_trial_is_recorded_never_measured_again_and_the_search_goes_on(space_file: Path) -> None:
    ids = runner_ids()
    space = load_space(space_file)
    failing = {ids(tn.cell_for(space, {"framework": "torch", "threads": t, "batch_size": b, "layout": lay,
                                       "precision": p, "onednn": True}))
               for t in (1, 2) for b in (16, 32, 64, 128, 256) for lay in ("nchw", "nhwc") for p in ("fp32", "bf16")}
    land = Landscape(ids, fail=failing)
    store = Memory()
    s = tuner(space_file, land, store, budget_runs=25, sampler="random", confirm=False).run()
    failed = [r for r in store.rows if r["state"] == "failed"]
    assert failed and all("boom" in r["reason"] for r in failed)
    assert len(land.calls) == len(set(land.calls))  # no cell measured twice
    assert s["trials"]["failed"] == len([r for r in failed if r["kind"] == "search"]) and s["trials"]["ok"] > 0


def test_a_tuning_stopped_mid_way_resumes_from_its_recorded_trials(space_file: Path) -> None:
    land = Landscape(runner_ids())
    store = Memory()
    calls = 0
    real = land.measure

    def dies(cell: Any, combo: Any, runs: int) -> tuple[int, float]:
        nonlocal calls
        calls += 1
        if calls == 9:
            raise KeyboardInterrupt
        return real(cell, combo, runs)

    land_measure = land.measure
    land.measure = dies  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        tuner(space_file, land, store, budget_runs=20, confirm=False).run()
    assert store.status == ["running", "stopped"]
    spent = sum(r["runs"] for r in store.rows)
    assert spent == 8
    land.measure = land_measure  # type: ignore[method-assign]
    before = list(land.calls)
    resumed = Memory(store.rows)
    s = tuner(space_file, land, resumed, budget_runs=20, confirm=False).run()
    assert s["runs"] == 20  # the 8 runs before count against the budget
    new = land.calls[len(before):]
    assert not set(new) & set(before)  # nothing measured twice
    assert [r["trial"] for r in resumed.rows] == list(range(len(resumed.rows)))


def test_an_objective_the_default_cells_did_not_measure_is_refused(space_file: Path) -> None:
    land = Landscape(runner_ids())

    def unmeasured(cell_ids: Any) -> dict[str, tn.Evidence]:  # ok runs without the objective (no energy counter)
        return {cid: tn.Evidence(accuracies=[0.8] * n, ok=n) for cid, n in land.runs.items() if cid in cell_ids}

    store = Memory()
    t = tn.Tuner(load_space(space_file), tn.Settings(objective="j_per_image", budget_runs=10), measure=land.measure,
                 evidence=unmeasured, store=store, cell_id=land.ids)
    with pytest.raises(InputError, match="--objective j_per_image: the runs of torch's default cell measured no "
                                         "j_per_image .*RAPL"):
        t.run()
    assert len(land.calls) == 1 and store.status == ["running", "stopped"]


@pytest.mark.parametrize("settings, match", [
    ({"budget_runs": 0}, "--budget: expected at least 1 run"),
    ({"budget_runs": None}, "--budget is missing"),
    ({"objective": "speed"}, "--objective: expected one of"),
    ({"sampler": "grid"}, "--sampler: expected one of"),
    ({"accuracy_within": -1.0}, "--accuracy-within: expected points"),
])
def test_bad_settings_are_refused_before_anything_runs(space_file: Path, settings: dict, match: str) -> None:
    land = Landscape(runner_ids())
    with pytest.raises(InputError, match=match):
        tuner(space_file, land, Memory(), **settings)
    assert land.calls == []


def test_an_accuracy_bound_on_inference_cells_and_a_one_cell_space_are_refused(tmp_path: Path) -> None:
    inference = tmp_path / "inference.toml"
    inference.write_text(SPACE.replace('dataset = "synthetic"', 'dataset = "synthetic"\nmode = "inference"'))
    with pytest.raises(InputError, match="inference cells measure no accuracy"):
        tuner(inference, Landscape(runner_ids()), Memory())
    one = tmp_path / "one.toml"
    one.write_text('[fixed]\nmodel = "lenet5"\n[axes]\nthreads = [1]\n')
    with pytest.raises(InputError, match="one combination: nothing to tune"):
        tuner(one, Landscape(runner_ids()), Memory())


# -- the command line, with real runs --------------------------------------------------------

SMALL = """
[sweep]
name = "tune-cli"
executor = "local"
[fixed]
framework = "torch"
model = "lenet5"
dataset = "synthetic"
synthetic_train = 256
synthetic_test = 128
iterations = 8
warmup_steps = 2
onednn_check = false
[axes]
threads = [1, 2]
batch_size = [16, 32]
layout = ["nchw", "nhwc"]
"""


def sql(root: Path, query: str) -> list[tuple]:
    con = plain_connect(root / "matrun.duckdb")
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def matrun(*args: str, cwd: Path, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **NO_ENGINE, "COLUMNS": "200"}, **kw)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.parametrize("args, words", [
    (["--budget", "0"], "--budget: expected from 1 to"),
    (["--budget", "ten"], "--budget: expected a number of runs"),
    (["--budget", "5", "--objective", "speed"], "--objective: expected one of"),
    (["--budget", "5", "--sampler", "grid"], "--sampler: expected one of"),
    (["--budget", "5", "--repeats", "0"], "--repeats: expected from 1"),
    (["--budget", "5", "--executor", "ssh"], "--executor: expected local"),
    (["--budget", "5", "--set", "threads=x"], "--set threads"),
    (["--budget", "-5"], "--budget: expected a number of runs"),
    (["--budget", "5; rm -rf /"], "--budget: expected a number of runs"),
    (["--budget", "99999999999"], "--budget: expected from 1 to 1,000,000 runs"),
    (["--budget", "0s"], "--budget: expected a number of runs"),
    (["--budget", "5", "--accuracy-within", "nan"], "--accuracy-within: expected points"),
    (["--budget", "5", "--accuracy-within", "2", "--set", "mode=inference"], "inference cells measure no accuracy"),
    (["--budget", "5", "--format", "yaml"], "--format"),
    ([], "--budget is missing"),
])
def test_the_command_refuses_bad_options_with_an_error_line(tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "m.toml").write_text(SMALL)
    proc = matrun("tune", "m.toml", *args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("Error: ") and words in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("result.json"))


@pytest.mark.parametrize("text, words", [
    ("", "no such matrix file"),
    ("[axes]\nthreads = [1, 2\n", "invalid TOML"),
    ("[axes]\nthreads = [1, -2]\n", "[axes -> threads -> 1]"),
    ("[axes]\nthreads = [1, 1]\n", "threads"),
])
def test_a_bad_matrix_is_refused_by_key(tmp_path: Path, text: str, words: str) -> None:
    if text:
        (tmp_path / "m.toml").write_text(text)
    proc = matrun("tune", "m.toml", "--budget", "5", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("Error: ") and words in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("result.json"))


@pytest.mark.slow
def test_tune_end_to_end_with_real_runs_report_and_resume(tmp_path: Path, torch_env: Any) -> None:
    (tmp_path / "m.toml").write_text(SMALL)
    # a second tuning of the same space at once is refused while the first runs
    first = subprocess.Popen([*MATRUN, "tune", "m.toml", "--budget", "7", "--format", "json",
                              "--accuracy-within", "100"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, **NO_ENGINE},
                             start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list((tmp_path / "results").rglob("result.json")):
        time.sleep(0.5)
    second = matrun("tune", "m.toml", "--budget", "7", "--accuracy-within", "100", cwd=tmp_path, check=False)
    assert second.returncode == 1 and "running in another matrun tune" in second.stderr, second.stderr
    # kill -9 mid-tuning: the trials recorded so far survive, the resumed tuning spends the rest
    while time.monotonic() < deadline and len(list((tmp_path / "results").rglob("result.json"))) < 3:
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    recorded = sql(tmp_path, "SELECT count(*), coalesce(sum(runs), 0) FROM tuning_trials")[0]
    assert recorded[0] >= 1
    proc = matrun("tune", "m.toml", "--budget", "7", "--format", "json", "--accuracy-within", "100", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert "resuming: " in proc.stderr
    assert doc["runs"] <= 7 and doc["runs"] >= recorded[1]
    (answer,) = doc["answer"]
    assert answer["framework"] == "torch" and answer["default"]["params"]["threads"] == "unset"
    assert answer["best"]["cell_id"] and answer["best"]["median"] > 0
    (status,), = sql(tmp_path, "SELECT status FROM tunings")
    trials = sql(tmp_path, "SELECT cell_id, kind, runs FROM tuning_trials WHERE cell_id IS NOT NULL")
    ok_runs = sql(tmp_path, "SELECT count(*) FROM runs WHERE status = 'ok'")[0][0]
    assert status == "done" and sum(r[2] for r in trials) == doc["runs"]
    # every run the tuning spent is a run of the warehouse (plus the runs of the killed cell, if it ended)
    assert ok_runs >= doc["runs"] - 1
    # the tuning's cells are ordinary cells: compare and advise see them
    assert matrun("advise", "--format", "json", cwd=tmp_path).stdout.strip().startswith("[")
    # run again: nothing left to spend, nothing run, the same answer
    again = json.loads(matrun("tune", "m.toml", "--budget", "7", "--format", "json", "--accuracy-within", "100",
                              cwd=tmp_path).stdout)
    assert again["runs"] == doc["runs"] and again["answer"][0]["best"]["cell_id"] == answer["best"]["cell_id"]
    # the report has a page for the tuning
    matrun("report", "--out", "report", cwd=tmp_path)
    tid = doc["tuning"]
    page = (tmp_path / "report" / f"tune-{tid}.html").read_text()
    assert "The answer: the best configuration per framework" in page and answer["best"]["cell_id"] in page
    assert f"tune-{tid}-trials.csv" in page and (tmp_path / "report" / f"tune-{tid}-trials.csv").is_file()
    # the table the terminal shows
    table = matrun("tune", "m.toml", "--budget", "7", "--accuracy-within", "100", cwd=tmp_path).stdout
    assert "best configuration per framework against its default" in table and "runs D/B" in table


def test_a_resumed_tuning_confirms_the_leaders_found_before_it_stopped(space_file: Path) -> None:
    """The confirmation may pick a trial recorded by the process that stopped: its cell is
    planned again from the recorded parameters (a KeyError here once)."""
    land = Landscape(runner_ids())
    store = Memory()
    tuner(space_file, land, store, budget_runs=30, confirm=False).run()  # the search alone, recorded
    searched = {r["cell_id"] for r in store.rows if r["kind"] == "search" and r["cell_id"]}
    resumed = Memory(store.rows)
    s = tuner(space_file, land, resumed, budget_runs=46, confirm=True).run()
    confirmed = {r["cell_id"] for r in resumed.rows[len(store.rows):] if r["kind"] == "confirm"}
    assert confirmed & searched  # leaders of the earlier process got their runs
    assert s["runs"] <= 46 and all(a["best"]["runs"] >= 2 for a in s["answer"])


class DefaultFastest(Landscape):
    """The landscape, but the default cell (threads unset: no axis value) is the fastest."""

    def value(self, v: Mapping[str, Any], repeat: int) -> tuple[float, float]:
        thr, acc = super().value(v, repeat)
        return (thr * 3 if v["threads"] not in (1, 2) else thr), acc


def test_when_no_searched_configuration_beats_the_default_the_default_is_the_answer(space_file: Path) -> None:
    """The default cell is a candidate like any searched one: the answer never names a slower
    configuration as the best (a live tuning once answered 8,817 img/s against its default's
    16,239)."""
    land = DefaultFastest(runner_ids())
    s = tuner(space_file, land, Memory(), budget_runs=40).run()
    for a in s["answer"]:
        assert a["best"]["cell_id"] == a["default"]["cell_id"], a
        assert a["changes"] == [] and a["verdict"] == tn.DEFAULT_IS_BEST and a["comparison"] == {}
        assert a["default"]["runs"] >= tn.CONFIRM_RUNS
    out = Landscape(runner_ids())  # and where a searched cell is faster, it is the answer, as before
    s = tuner(space_file, out, Memory(), budget_runs=40).run()
    assert all(a["best"]["cell_id"] != a["default"]["cell_id"] and a["changes"] for a in s["answer"])


class TwoModes(Landscape):
    """The landscape, but every cell's third and fourth runs land in a slow mode at half the speed."""

    def value(self, v: Mapping[str, Any], repeat: int) -> tuple[float, float]:
        thr, acc = super().value(v, repeat)
        return (thr * 0.5 if repeat in (2, 3) else thr), acc


def test_the_answer_notes_a_side_whose_runs_fall_into_two_modes_and_none_for_quiet_runs(space_file: Path) -> None:
    s = tuner(space_file, TwoModes(runner_ids()), Memory(), budget_runs=40).run()
    for a in s["answer"]:
        assert a["default"]["runs"] >= 4 and a["best"]["runs"] >= 4
        assert len(a["noise"]) == 2, a["noise"]
        assert a["noise"][0].startswith("the default's 4 runs fall into two modes (")
        assert a["noise"][1].startswith("the best's 4 runs fall into two modes (") and "CV " in a["noise"][1]
    quiet = tuner(space_file, Landscape(runner_ids()), Memory(), budget_runs=40).run()
    assert all(a["noise"] == [] for a in quiet["answer"])  # a spread of 0.4 %: nothing to note
    # what the terminal shows: a note line per noisy side under the table
    from matrun.runner.cli import tune as cli_tune
    printed = io.StringIO()
    cli_tune.out.file = printed
    try:
        cli_tune._print("t" * 16, s)
    finally:
        cli_tune.out.file = None  # the console's default again: sys.stdout when it writes
    lines = [ln for ln in printed.getvalue().splitlines() if ln.startswith("note (")]
    assert len(lines) == 4 and lines[0].startswith("note (torch): the default's 4 runs fall into two modes (")
