"""The per-iteration performance model (issue 16, docs/MODEL.md): phase records in bundles,
the ``iteration_model`` and ``iteration_scaling`` views, ``matrun explain`` (its sentences,
its JSON and its refusals of malformed and hostile cell ids) and the calibration fit.

The bundles are written by hand (tests/bundle_factory.py) with phases and calibrations whose
medians, fits and predictions are worked out here, in the comments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bundle_factory import make_bundle, patch_events
from matrun.runner.harness import phases as ph
from matrun.warehouse.explain import explain
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MATRUN = str(Path(sys.executable).with_name("matrun"))
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
BASE = {"dataset": "synthetic", "model": "lenet5", "threads": 1, "batch_size": 64, "iterations": 8,
        "epochs": None, "scaling": "weak", "nodes": 1}
# 2 warm-up steps, then 6 timed: steps 4 and 7 sampled (every 3rd: timed k = 2, 5)
STEPS = (0.02, 0.02, 0.010, 0.010, 0.011, 0.010, 0.010, 0.012)
SAMPLED = (4, 7)


def with_phases(run: Path, sampled: dict[int, dict[str, float]], **summary: Any) -> None:
    """Mark ``sampled``'s steps sampled, add their phases records, and add ``summary`` fields."""
    path = run / "events.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    out: list[dict[str, Any]] = []
    for record in records:
        if record.get("type") == "step" and record["step"] in sampled:
            record["phase"] = "sampled"
        if record.get("type") == "epoch" and not any(r.get("type") == "phases" for r in out):
            steps = {r["step"]: r["seconds"] for r in records if r.get("type") == "step"}
            out.extend({"type": "phases", "step": s, "seconds": steps[s], "phases": p} for s, p in sampled.items())
        out.append(record)
    path.write_text("".join(json.dumps(r) + "\n" for r in out), encoding="utf-8")
    patch_events(run, "summary", **summary)


def cell(results: Path, cell_id: str, params: dict[str, Any], phases: dict[int, dict[str, float]],
         steps: tuple[float, ...] = STEPS, images: int = 64, **summary: Any) -> Path:
    run = make_bundle(results, sweep="model", cell_id=cell_id, params={**BASE, **params},
                      step_seconds=steps, images_per_step=images)
    with_phases(run, phases, gradient_bytes=1_000_000, phases={"every": 3}, **summary)
    return run


def calibration(overlaps: bool) -> dict[str, Any]:
    # seconds = 0.001 + bytes * 2e-9: latency 1 ms, bandwidth 5e8 B/s
    return {"calibration": {"points": [[1_000_000, 0.003], [2_000_000, 0.005], [3_000_000, 0.007]],
                            "pattern": "ring all-reduce", "transport": "gloo", "workers": 2,
                            "overlaps_backward": overlaps}}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    results = root / "results"
    torch_phases = {4: {"forward": 0.004, "backward": 0.005, "update": 0.001},
                    7: {"forward": 0.005, "backward": 0.006, "update": 0.001}}
    # torch, 1 worker: unsampled timed steps 0.010, 0.010, 0.011, 0.010 -> median 0.010
    cell(results, "a1torch000000001", {"framework": "torch", "workers": 1}, torch_phases)
    # TensorFlow, the same workload, fused: 0.009 and 0.011
    cell(results, "b1tf000000000001", {"framework": "tensorflow", "workers": 1, "layout": "nhwc"},
         {4: {"forward+backward+update": 0.009}, 7: {"forward+backward+update": 0.011}},
         steps=(0.02, 0.02, 0.008, 0.008, 0.0095, 0.008, 0.008, 0.0115))
    # 2 workers (weak: 128 images a step), step 0.016 -> throughput 8000 against 6400: 1.25x
    two = (0.03, 0.03, 0.016, 0.016, 0.017, 0.016, 0.016, 0.017)
    cell(results, "a2torch000000001", {"framework": "torch", "workers": 2},
         {4: {"forward": 0.005, "backward+exchange": 0.01, "update": 0.001},
          7: {"forward": 0.005, "backward+exchange": 0.011, "update": 0.001}},
         steps=two, images=128, exchange=calibration(overlaps=True))
    cell(results, "b2tf000000000001", {"framework": "tensorflow", "workers": 2, "layout": "nhwc"},
         {4: {"forward+backward+exchange+update": 0.0165}, 7: {"forward+backward+exchange+update": 0.0165}},
         steps=two, images=128, exchange=calibration(overlaps=False))
    wh = root / "w.duckdb"
    ingest([results], warehouse=wh)
    return wh


def rows(warehouse: Path, sql: str) -> list[dict[str, Any]]:
    columns, values = run_query(sql, warehouse=warehouse)
    return [dict(zip(columns, row)) for row in values]


def test_iteration_model_medians_shares_bottleneck_and_gap(warehouse: Path) -> None:
    got = rows(warehouse, "SELECT * FROM iteration_model WHERE cell_id = 'a1torch000000001' ORDER BY ordinal")
    assert [r["phase"] for r in got] == ["forward", "backward", "update"]
    assert [r["seconds_median"] for r in got] == pytest.approx([0.0045, 0.0055, 0.001])
    # the sampled steps: 0.011 and 0.012 -> 0.0115; their gaps 0.011-0.010, 0.012-0.012 -> 0.0005
    head = got[0]
    assert head["sampled_step_s_median"] == pytest.approx(0.0115)
    assert [r["share"] for r in got] == pytest.approx([0.0045 / 0.0115, 0.0055 / 0.0115, 0.001 / 0.0115])
    assert (head["bottleneck"], head["fused"], head["sampled_steps"], head["workers"]) == ("backward", False, 2, 1)
    assert head["gap_s"] == pytest.approx(0.0005) and head["gap_share"] == pytest.approx(0.0005 / 0.0115)
    assert head["phases_s"] == pytest.approx(0.011)
    assert head["step_s_median"] == pytest.approx(0.010)  # the unsampled timed steps
    assert head["sampling_cost"] == pytest.approx(0.0115 / 0.010 - 1)
    assert head["gradient_bytes"] == 1_000_000 and head["phase_every"] == 3
    fused = rows(warehouse, "SELECT DISTINCT bottleneck, fused FROM iteration_model WHERE framework = 'tensorflow'")
    assert sorted(fused, key=str) == [{"bottleneck": "forward+backward+exchange+update", "fused": True},
                                      {"bottleneck": "forward+backward+update", "fused": True}]


def test_sampled_steps_stay_out_of_the_step_counts_and_are_stored(warehouse: Path) -> None:
    got = rows(warehouse, "SELECT phase, count(*) AS n FROM steps JOIN runs USING (run_id) "
                          "WHERE cell_id = 'a1torch000000001' GROUP BY phase ORDER BY phase")
    assert got == [{"phase": "sampled", "n": 2}, {"phase": "timed", "n": 4}, {"phase": "warmup", "n": 2}]
    assert rows(warehouse, "SELECT count(*) AS n FROM step_phases")[0]["n"] == 2 * 3 + 2 + 2 * 3 + 2
    assert rows(warehouse, "SELECT bytes, seconds FROM exchange_calibration JOIN runs USING (run_id) "
                           "WHERE cell_id = 'a2torch000000001' ORDER BY bytes") == [
        {"bytes": 1_000_000, "seconds": 0.003}, {"bytes": 2_000_000, "seconds": 0.005},
        {"bytes": 3_000_000, "seconds": 0.007}]


def test_iteration_scaling_predicts_from_the_reference_phases_and_the_calibration(warehouse: Path) -> None:
    got = {r["framework"]: r for r in rows(warehouse, "SELECT * FROM iteration_scaling")}
    assert set(got) == {"torch", "tensorflow"}
    torch, tf = got["torch"], got["tensorflow"]
    for r in (torch, tf):
        assert r["latency_s"] == pytest.approx(0.001) and r["bandwidth_bytes_per_s"] == pytest.approx(5e8)
        assert r["exchange_s"] == pytest.approx(0.001 + 1_000_000 / 5e8)  # 3 ms
        assert (r["workers"], r["linear_speedup"], r["calibration_points"]) == (2, 2, 3)
        assert r["speedup"] == pytest.approx(128 / 0.016 / (64 / r["ref_step_s"]))
        assert r["measured_step_s"] == pytest.approx(0.016)
    # torch overlaps the exchange with backward (5.5 ms): nothing exposed, 2 x 10 ms / 10 ms
    assert torch["ref_step_s"] == pytest.approx(0.010) and torch["ref_backward_s"] == pytest.approx(0.0055)
    assert torch["exposed_s"] == 0 and torch["predicted_step_s"] == pytest.approx(0.010)
    assert torch["predicted_speedup"] == pytest.approx(2.0)
    assert torch["prediction_error"] == pytest.approx(2.0 / 1.25 - 1)
    # the 2-worker cell's forward (5 ms) against the reference's (4.5 ms); TensorFlow fuses it
    assert torch["forward_slowdown"] == pytest.approx(0.005 / 0.0045) and tf["forward_slowdown"] is None
    # TensorFlow does not: 8 ms + 3 ms exposed -> 2 x 8 / 11
    assert tf["ref_step_s"] == pytest.approx(0.008) and tf["exposed_s"] == pytest.approx(0.003)
    assert tf["predicted_speedup"] == pytest.approx(2 * 0.008 / 0.011)
    assert tf["prediction_error"] == pytest.approx((2 * 0.008 / 0.011) / tf["speedup"] - 1)


def test_explain_says_where_the_time_goes_and_compares_frameworks(warehouse: Path) -> None:
    result = explain("a1torch0", warehouse=warehouse)
    assert result["cell"]["cell_id"] == "a1torch000000001"
    text = result["sentences"]
    assert text[0].startswith("lenet5 on synthetic in PyTorch (cpu, 1 thread, batch 64, 1 worker): a training "
                              "step takes 10 ms")
    assert ("2 sampled steps (one timed step in 3) split it into forward pass 4.5 ms (39 %), backward pass 5.5 ms "
            "(48 %), optimizer update 1 ms (9 %), and 0.5 ms (4 %) is in no phase.") in text[0]
    assert text[1] == "The backward pass bounds this step: 48 % of it."
    # TensorFlow's 8 ms step; its fused phases against the sum of the same three here (11 ms)
    assert text[2] == ("TensorFlow's step on the same workload is 20 % shorter (8 ms, cell b1tf000000000001): "
                       "its fused forward + backward + update takes 10 ms against 11 ms here (9 % shorter).")
    assert any(s.startswith("Its 2-worker cell a2torch000000001 (PyTorch, 2 workers, weak scaling): the model "
                            "predicts a speedup of 2.00× against a linear 2×") and "+60 %" in s
               and s.endswith("Each worker's forward pass took 1.1× as long as the 1-worker cell's: the workers "
                              "contended for the host's cores, caches or memory bandwidth, which the model assumes "
                              "they do not.")
               for s in text)
    fused = explain("b1tf", warehouse=warehouse)["sentences"]
    assert fused[1].startswith("TensorFlow runs its fused forward + backward + update as one call (95 % of the "
                               "step): matrun does not split a fused time")


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workload on the GPU: three PyTorch cells (nhwc at fp32; nchw; bf16 with autotune),
    TensorFlow at nhwc and at nchw (fp32), and TensorFlow at bf16."""
    root = tmp_path_factory.mktemp("variants")
    results = root / "results"
    gpu = {"device": "gpu", "gpus": 1, "workers": 1}
    torch = {**gpu, "framework": "torch", "variant": "cuda", "layout": "nhwc"}
    tf = {**gpu, "framework": "tensorflow", "variant": "cuda"}
    # the cell explained: as a1torch000000001 above (step 10 ms; 4.5, 5.5 and 1 ms)
    cell(results, "c1torch000000001", torch, {4: {"forward": 0.004, "backward": 0.005, "update": 0.001},
                                               7: {"forward": 0.005, "backward": 0.006, "update": 0.001}})
    # nchw: step 17.3 ms (73 % longer); backward 11.5 ms
    cell(results, "c2torch000000001", {**torch, "layout": "nchw"},
         {4: {"forward": 0.006, "backward": 0.011, "update": 0.001},
          7: {"forward": 0.006, "backward": 0.012, "update": 0.001}},
         steps=(0.03, 0.03, 0.0173, 0.0173, 0.0185, 0.0173, 0.0173, 0.0195))
    # bf16 and autotune: step 6 ms (40 % shorter); backward 2.5 ms
    cell(results, "c3torch000000001", {**torch, "precision": "bf16", "conv_algo": "autotune"},
         {4: {"forward": 0.003, "backward": 0.0025, "update": 0.001},
          7: {"forward": 0.003, "backward": 0.0025, "update": 0.001}},
         steps=(0.02, 0.02, 0.006, 0.006, 0.007, 0.006, 0.006, 0.007))
    # TensorFlow, fused: nhwc 8 ms (phases 10 ms), nchw 12 ms (phases 12.5 ms), bf16 5 ms
    cell(results, "d1tf000000000001", {**tf, "layout": "nhwc"},
         {4: {"forward+backward+update": 0.009}, 7: {"forward+backward+update": 0.011}},
         steps=(0.02, 0.02, 0.008, 0.008, 0.0095, 0.008, 0.008, 0.0115))
    cell(results, "d2tf000000000001", {**tf, "layout": "nchw"},
         {4: {"forward+backward+update": 0.012}, 7: {"forward+backward+update": 0.013}},
         steps=(0.02, 0.02, 0.012, 0.012, 0.0125, 0.012, 0.012, 0.0135))
    cell(results, "d3tf000000000001", {**tf, "layout": "nhwc", "precision": "bf16"},
         {4: {"forward+backward+update": 0.005}, 7: {"forward+backward+update": 0.005}},
         steps=(0.02, 0.02, 0.005, 0.005, 0.0055, 0.005, 0.005, 0.0055))
    wh = root / "w.duckdb"
    ingest([results], warehouse=wh)
    return wh


def test_explain_names_what_differs_in_a_cell_of_the_same_framework(variants: Path) -> None:
    result = explain("c1torch", warehouse=variants)
    text = result["sentences"]
    assert text[0].startswith("lenet5 on synthetic in PyTorch (gpu, 1 thread, batch 64, 1 worker): a training "
                              "step takes 10 ms")
    # the other frameworks first (at this precision only: not d3tf's bf16), each named, and
    # TensorFlow's two cells told apart by what differs between them; then PyTorch's own
    # other cells (precision free), by their step, each with every parameter that differs
    assert text[2:] == [
        "TensorFlow's step on the same workload with layout=nhwc is 20 % shorter (8 ms, cell d1tf000000000001): "
        "its fused forward + backward + update takes 10 ms against 11 ms here (9 % shorter).",
        "TensorFlow's step on the same workload with layout=nchw is 20 % longer (12 ms, cell d2tf000000000001): "
        "its fused forward + backward + update takes 12.5 ms against 11 ms here (14 % longer).",
        "PyTorch with precision=bf16 instead of fp32 and conv_algo=autotune instead of heuristic (cell "
        "c3torch000000001, its other parameters the same): its step is 40 % shorter (6 ms); its backward pass "
        "takes 2.5 ms against 5.5 ms here (55 % shorter).",
        "PyTorch with layout=nchw instead of nhwc (cell c2torch000000001, its other parameters the same): its "
        "step is 73 % longer (17.3 ms); its backward pass takes 11.5 ms against 5.5 ms here (109 % longer).",
    ]
    assert not any("d3tf" in s for s in text)
    assert not any(s.startswith("PyTorch's step") or ("same workload" in s and "PyTorch" in s) for s in text)
    others = {o["cell_id"]: o for o in result["others"]}
    assert set(others) == {"c2torch000000001", "c3torch000000001", "d1tf000000000001", "d2tf000000000001"}
    assert others["c2torch000000001"]["same_framework"] is True
    assert others["c2torch000000001"]["differs"] == {"layout": {"value": "nchw", "here": "nhwc"}}
    assert others["c3torch000000001"]["differs"] == {"precision": {"value": "bf16", "here": "fp32"},
                                                     "conv_algo": {"value": "autotune", "here": "heuristic"}}
    assert others["c2torch000000001"]["another_environment"] is False
    assert others["d1tf000000000001"]["same_framework"] is False
    assert (others["d1tf000000000001"]["label"], others["d2tf000000000001"]["label"]) == (
        {"layout": "nhwc"}, {"layout": "nchw"})
    # TensorFlow's framework, variant and layout differ too, but the framework is what is named
    assert "framework" in others["d2tf000000000001"]["differs"]

    # from the bf16 cell: TensorFlow at bf16 only, one cell (no label); PyTorch's nchw cell
    # differs from it in three parameters, listed in the host's order
    text = explain("c3torch", warehouse=variants)["sentences"]
    assert text[2].startswith("TensorFlow's step on the same workload is 17 % shorter (5 ms, cell d3tf000000000001): ")
    assert text[3].startswith("PyTorch with precision=fp32 instead of bf16 and conv_algo=heuristic instead of "
                              "autotune (cell c1torch000000001, its other parameters the same): its step is 67 % "
                              "longer (10 ms); ")
    assert text[4].startswith("PyTorch with layout=nchw instead of nhwc, precision=fp32 instead of bf16 and "
                              "conv_algo=heuristic instead of autotune (cell c2torch000000001, its other parameters "
                              "the same): its step is 188 % longer (17.3 ms); ")
    assert len(text) == 5


def test_a_same_framework_comparison_without_differing_parameters_says_so() -> None:
    from matrun.warehouse.explain import _comparison

    mine = {"forward": 0.02, "backward": 0.05, "update": 0.01}
    other = {"cell_id": "e" * 16, "framework": "torch", "step_s_median": 0.05, "sampled_step_s_median": 0.05,
             "phases": {"forward": 0.02, "backward": 0.02, "update": 0.01}, "same_framework": True,
             "differs": {}, "another_environment": True, "label": {}}
    assert _comparison("PyTorch", 0.1, mine, other) == (
        "PyTorch with the same parameters in another environment (cell eeeeeeeeeeeeeeee): its step is 50 % "
        "shorter (50 ms); its backward pass takes 20 ms against 50 ms here (60 % shorter).")
    unset = {**other, "differs": {"kvstore": {"value": "dist_sync", "here": None},
                                  "onednn": {"value": False, "here": True}}}
    assert _comparison("PyTorch", 0.1, mine, unset).startswith(
        "PyTorch with kvstore=dist_sync instead of null and onednn=false instead of true (cell eeeeeeeeeeeeeeee, "
        "its other parameters the same, in another environment): its step is 50 % shorter")


@pytest.mark.parametrize("cell, message", [
    ("", "CELL '': expected a cell id or its first 4 or more characters"),
    ("abc", "CELL 'abc': expected a cell id or its first 4 or more characters"),
    ("ZZZZ", "CELL ZZZZ: no cell with sampled phases matches: no run of it is in the warehouse"),
    ("../../etc/passwd", "CELL '../../etc/passwd': expected a cell id"),
    ("a1torch0'; DROP TABLE runs; --", "CELL \"a1torch0'; DROP TABLE runs; --\": expected a cell id"),
    ("abcd\n", "CELL 'abcd\\n': expected a cell id"),
    ("f" * 65, "CELL '" + "f" * 37 + "...': expected a cell id"),
    ("dddd", "CELL dddd: no cell with sampled phases matches: no run of it is in the warehouse"),
    ("a", "CELL 'a': expected a cell id"),
])
def test_explain_refuses_bad_cell_ids_with_exit_2(warehouse: Path, tmp_path: Path, cell: str, message: str) -> None:
    proc = subprocess.run([MATRUN, "explain", cell, "--warehouse", str(warehouse)], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, **NO_ENGINE}, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("Error: " + message), proc.stderr
    assert "Traceback" not in proc.stderr


def test_explain_an_ambiguous_prefix_a_missing_warehouse_and_a_bad_format(warehouse: Path, tmp_path: Path) -> None:
    # the hand-written ids share no 4-digit prefix with phases but these two
    results = tmp_path / "results"
    cell(results, "eeee000000000001", {"framework": "torch"}, {4: {"forward": 0.004}})
    cell(results, "eeee000000000002", {"framework": "torch", "batch_size": 32}, {4: {"forward": 0.004}})
    wh = tmp_path / "w.duckdb"
    ingest([results], warehouse=wh)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([MATRUN, "explain", *args], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, **NO_ENGINE}, timeout=120)

    proc = run("eeee", "--warehouse", str(wh))
    assert (proc.returncode, proc.stderr.strip()) == (
        2, "Error: CELL eeee: matches 2 cells (eeee000000000001, eeee000000000002); give more of its id")
    proc = run("eeee", "--warehouse", str(tmp_path / "nowhere.duckdb"))
    assert proc.returncode == 2 and proc.stderr.startswith("Error: warehouse ") and "does not exist" in proc.stderr
    proc = run("eeee0000000000001", "--warehouse", str(wh), "--format", "yaml")
    assert proc.returncode == 2 and proc.stderr.startswith("Error: --format") and "Traceback" not in proc.stderr
    proc = run("eeee000000000001", "--warehouse", str(wh), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["cell"]["cell_id"] == "eeee000000000001" and data["phases"][0]["phase"] == "forward"
    assert data["sentences"][1] == "The forward pass bounds this step: 36 % of it."  # 4 ms of the sampled 11 ms


def test_a_cell_without_sampled_phases_is_explained_as_such(tmp_path: Path) -> None:
    results = tmp_path / "results"
    make_bundle(results, sweep="old", cell_id="0dd0000000000001", params=BASE)
    wh = tmp_path / "w.duckdb"
    ingest([results], warehouse=wh)
    proc = subprocess.run([MATRUN, "explain", "0dd0", "--warehouse", str(wh)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, **NO_ENGINE}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("Error: CELL 0dd0: no cell with sampled phases matches: its runs sampled no "
                                   "phases (phase_sampling = 0, inference, or a matrun before phases)")


# --- the harness's side: which steps, the summary, the fit ------------------------------


def test_sampler_picks_every_nth_timed_step() -> None:
    sampler = ph.Sampler(10, 5)
    assert [i for i in range(60) if sampler.sampled(i)] == [14, 24, 34, 44, 54]
    assert not any(ph.Sampler(0, 5).sampled(i) for i in range(100))
    assert [i for i in range(6) if ph.Sampler(1, 2).sampled(i)] == [2, 3, 4, 5]


@pytest.mark.parametrize("name, ok", [
    ("forward", True), ("forward+backward+update", True), ("input+h2d", True),
    ("backward+exchange", True), ("update+forward", False), ("forward+forward", False),
    ("", False), ("coffee", False), ("forward+", False), ("+forward", False), ("Forward", False),
])
def test_phase_names(name: str, ok: bool) -> None:
    assert ph.known(name) is ok


def test_calibration_fit_is_least_squares_and_refuses_what_it_cannot_fit() -> None:
    latency, bandwidth = ph.fit([(1000, 0.0011), (2000, 0.0012), (3000, 0.0013)])
    assert latency == pytest.approx(0.001) and bandwidth == pytest.approx(1e7)
    assert ph.fit([(1000, 0.001)]) == (None, None)           # one size
    assert ph.fit([(1000, 0.002), (2000, 0.001)]) == (None, None)  # falling: no bandwidth
    assert ph.fit([(1000, 0.0), (2000, 0.001)])[0] == 0.0    # a negative intercept is clamped
    entry = ph.calibration([(1000, 0.0011), (2000, 0.0012)], pattern="ring all-reduce", transport="gloo",
                           workers=2, overlaps_backward=True)
    assert entry["points"] == [[1000, 0.0011], [2000, 0.0012]] and entry["overlaps_backward"] is True


def test_phase_summary_medians_gap_and_unsampled_median() -> None:
    kept = [(4, (("forward", 0.004), ("backward", 0.005))), (7, (("forward", 0.006), ("backward", 0.007)))]
    out = ph.summary(3, kept, {4: 0.010, 7: 0.014}, [0.009, 0.010, 0.011])
    assert out["order"] == ["forward", "backward"] and out["fused"] == []
    assert out["median"] == pytest.approx({"forward": 0.005, "backward": 0.006})
    assert out["step_seconds_median"] == pytest.approx(0.012)
    assert out["gap_seconds_median"] == pytest.approx(0.001)     # 0.001 and 0.001
    assert out["unsampled_step_seconds_median"] == pytest.approx(0.010)
    assert (out["every"], out["sampled_steps"]) == (3, 2)


def test_time_collective_times_each_size_after_one_untimed_call() -> None:
    calls: list[int] = []

    def prepare(size: int):
        def call() -> None:
            calls.append(size)
        return call

    barriers: list[int] = []
    points = ph.time_collective(prepare, sizes=(8, 16), rounds=3, barrier=lambda: barriers.append(1))
    assert [b for b, _ in points] == [8, 16] and all(s >= 0 for _, s in points)
    assert calls == [8] * 4 + [16] * 4 and len(barriers) == 6


def test_a_phase_without_counterpart_is_named_not_compared() -> None:
    from matrun.warehouse.explain import _comparison

    mine = {"forward": 0.02, "backward": 0.05, "update": 0.01}
    other = {"cell_id": "f" * 16, "framework": "mxnet", "step_s_median": 0.2, "sampled_step_s_median": 0.2,
             "phases": {"forward": 0.02, "backward": 0.04, "exchange+update": 0.13}}
    assert _comparison("PyTorch", 0.1, mine, other) == (
        "MXNet's step on the same workload is 100 % longer (200 ms, cell ffffffffffffffff): its backward pass "
        "takes 40 ms against 50 ms here (20 % shorter); its fused exchange + update (130 ms, 65 % of its step) "
        "has no counterpart here.")
    fused = {**other, "phases": {"forward+backward": 0.06, "exchange+update": 0.13}}
    assert _comparison("PyTorch", 0.1, {"forward+backward+update": 0.08}, fused).endswith(
        "its fused exchange + update (130 ms, 65 % of its step) has no counterpart here.")
