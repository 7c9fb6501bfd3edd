"""The SQL views over a small, hand-made study.  Every expected number is worked out by hand
from the bundles below.

Cell A (sweep s1, torch, 2 threads, batch 32), ok runs only:

    run    throughput  epochs (train_loss, train_acc, test_acc, epoch_s, test_s)   wall  cpu user/sys/iowait  rss avg/peak MiB
    0-1    100         (1.0, .50, .60, 10, 1.0)  (0.6, .70, .80, 12, 1.0)          10    120 / 20 / 2         200 / 300
    1-1    200         (0.8, .55, .62, 11, 1.2)  (0.4, .75, .84, 13, 1.4)          20    180 / 30 / 0         400 / 400
    2-2    600         (1.2, .45, .58,  9, 0.8)  (0.7, .65, .78, 11, 1.0)          40     70 / 10 / 5         100 / 150
    2-1    failed: excluded everywhere but run_overview / cell_status / provenance

Cell B (tensorflow, threads "unset", no batch_size in its params): one ok run.
Cell C: one failed run with no epochs.  Cell D: a timeout then an oom.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bundle_factory import make_bundle, read_json
from test_study_views import CONTRACT as STUDY_CONTRACT
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MiB = 2**20
A, B, C, D = "aaaa000000000001", "bbbb000000000001", "cccc000000000001", "dddd000000000001"

CONTRACT = {
    "iteration_model": "cell_id, sweeps, framework, variant, model, dataset, device, threads, batch_size, workers, "
                       "nodes, precision, input_pipeline, runs, sampled_steps, phase_every, phase, ordinal, samples, "
                       "seconds_median, share, bottleneck, fused, sampled_step_s_median, step_s_median, phases_s, "
                       "gap_s, gap_share, sampling_cost, gradient_bytes",
    "iteration_scaling": "config, framework, variant, model, dataset, device, kvstore, cell_id, ref_cell_id, gpus, "
                         "nodes, workers, batch_size, global_batch, per_worker_batch, scaling, pattern, transport, "
                         "overlaps_backward, gradient_bytes, calibration_points, latency_s, bandwidth_bytes_per_s, "
                         "ref_step_s, ref_exchange_s, ref_backward_s, compute_s, exchange_s, exposed_s, "
                         "predicted_step_s, measured_step_s, forward_slowdown, predicted_speedup, speedup, linear_speedup, "
                         "efficiency, prediction_error",
    "run_overview": "run_id, sweep, cell_id, repeat, attempt, status, exit_code, executor, "
                    "env_id, framework, variant, model, dataset, device, threads, batch_size, "
                    "epochs, iterations, optimizer, lr, onednn, cpuset, started_at, wall_seconds, "
                    "train_seconds, test_seconds, accuracy, throughput, time_to_first_step, "
                    "cpu_user_avg, cpu_system_avg, cpu_total_avg, iowait_avg, rss_avg_bytes, "
                    "rss_peak_bytes, mismatches, mode, layout, precision, conv_algo, gpus, interop_threads, "
                    "preset, seed, inference_seconds, peak_device_memory_bytes, onednn_primitives, "
                    "epochs_run, stopped_early, best_epoch, gpu_util_avg, gpu_mem_used_peak_bytes, "
                    "gpu_power_avg_w, gpu_energy_j, cpu_energy_j, images, gpu_j_per_image, cpu_j_per_image, "
                    "j_per_image, gpu_throttled, gpu_throttle_reasons, busy_start, busy_reasons, compile, attention, "
                    "seq_len, tokens_per_second, test_loss, perplexity, compile_seconds, compiles_in_steps, compile_cache, "
                    "attention_kernel",
    "cell_status": "cell_id, repeat, attempts, max_attempt, last_status, ok",
    "cell_durations": "cell_id, runs, wall_seconds_median",
    "baseline": "sweep, cell_id, framework, variant, model, dataset, threads, batch_size, epochs, "
                "runs, train_s_median, train_s_min, train_s_max, test_s_median, accuracy_median, "
                "accuracy_min, accuracy_max, throughput_median, throughput_min, throughput_max, "
                "throughput_cv, cpu_total_median, cpu_user_median, cpu_system_median, "
                "iowait_median, rss_avg_mb, rss_peak_mb, mismatch_runs, throttled_runs, busy_runs, "
                "j_per_image_median, gpu_mem_peak_mb, tokens_per_second_median, perplexity_median, "
                "perplexity_min, perplexity_max",
    "epoch_curve": "sweep, cell_id, framework, model, dataset, threads, batch_size, epoch, runs, "
                   "train_loss_median, train_accuracy_median, test_accuracy_median, "
                   "test_accuracy_min, test_accuracy_max, epoch_seconds_median, "
                   "test_seconds_median",
    "provenance": "run_id, sweep, cell_id, hostname, cpu_model, cpu_count, os, python, "
                  "matrun_version, framework, framework_version, env_id, executor, image_tag, "
                  "image_digest, image_blas, image_onednn, in_force, libraries, build, mismatches",
}


def _epoch(loss: float, train_acc: float, test_acc: float, epoch_s: float,
           test_s: float) -> dict[str, float]:
    return {"train_loss": loss, "train_accuracy": train_acc, "test_loss": loss,
            "test_accuracy": test_acc, "epoch_seconds": epoch_s, "test_seconds": test_s}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("study")
    results = root / "results"
    a = {"sweep": "s1", "cell_id": A, "params": {"threads": 2, "batch_size": 32}}
    make_bundle(results, **a, repeat=0, throughput=100.0, wall_seconds=10.0,
                epochs=(_epoch(1.0, .50, .60, 10, 1.0), _epoch(0.6, .70, .80, 12, 1.0)),
                monitor=((0.2, 100.0, 20.0, 1.0, 100 * MiB), (0.4, 140.0, 20.0, 3.0, 300 * MiB)))
    make_bundle(results, **a, repeat=1, throughput=200.0, wall_seconds=20.0,
                epochs=(_epoch(0.8, .55, .62, 11, 1.2), _epoch(0.4, .75, .84, 13, 1.4)),
                monitor=((0.2, 180.0, 30.0, 0.0, 400 * MiB),),
                mismatches=["threads: asked 2, in force 1"], hostname="other-host")
    make_bundle(results, **a, repeat=2, attempt=1, status="failed", exit_code=1,
                wall_seconds=1000.0, error_tail="RuntimeError: boom",
                epochs=(_epoch(9.0, .01, .01, 99, 9.0),))
    make_bundle(results, **a, repeat=2, attempt=2, throughput=600.0, wall_seconds=40.0,
                epochs=(_epoch(1.2, .45, .58, 9, 0.8), _epoch(0.7, .65, .78, 11, 1.0)),
                monitor=((0.2, 60.0, 10.0, 4.0, 50 * MiB), (0.4, 80.0, 10.0, 6.0, 150 * MiB)))
    b = make_bundle(results, sweep="s1", cell_id=B, throughput=500.0,
                    params={"framework": "tensorflow", "threads": "unset"})
    spec = read_json(b / "spec.json")
    del spec["params"]["batch_size"]
    (b / "spec.json").write_text(json.dumps(spec))
    make_bundle(results, sweep="s1", cell_id=C, status="failed", exit_code=2, epochs=())
    make_bundle(results, sweep="s1", cell_id=D, status="timeout", exit_code=-15)
    make_bundle(results, sweep="s1", cell_id=D, attempt=2, status="oom", exit_code=-9)
    warehouse = root / "w.duckdb"
    report = ingest([results], warehouse=warehouse)
    assert len(report.ingested) == 8 and not report.skipped
    return warehouse


def query(warehouse: Path, sql: str) -> list[dict[str, Any]]:
    columns, rows = run_query(sql, warehouse=warehouse)
    return [dict(zip(columns, row)) for row in rows]


EVERY_CONTRACT = {**CONTRACT, **STUDY_CONTRACT}


@pytest.mark.parametrize("view", sorted(EVERY_CONTRACT))
def test_views_have_the_contract_columns_even_when_empty(tmp_path: Path, view: str) -> None:
    """Every view, the study views (tests/test_study_views.py) too."""
    ingest([], warehouse=tmp_path / "empty.duckdb")
    columns, rows = run_query(f"SELECT * FROM {view}", warehouse=tmp_path / "empty.duckdb")
    assert columns == EVERY_CONTRACT[view].split(", ")
    assert rows == []


def test_baseline_over_ok_runs(study: Path) -> None:
    rows = query(study, "SELECT * FROM baseline ORDER BY cell_id")
    assert [r["cell_id"] for r in rows] == [A, B]
    a = rows[0]
    cv = math.sqrt(((100 - 300) ** 2 + (200 - 300) ** 2 + (600 - 300) ** 2) / 2) / 300
    assert a == {
        "sweep": "s1", "cell_id": A, "framework": "torch", "variant": "cpu", "model": "lenet5",
        "dataset": "fashion-mnist", "threads": "2", "batch_size": 32, "epochs": 2, "runs": 3,
        "train_s_median": 22.0, "train_s_min": 20.0, "train_s_max": 24.0,
        "test_s_median": 1.0,
        "accuracy_median": 0.80, "accuracy_min": 0.78, "accuracy_max": 0.84,
        "throughput_median": 200.0, "throughput_min": 100.0, "throughput_max": 600.0,
        "throughput_cv": pytest.approx(cv),
        "cpu_total_median": 140.0, "cpu_user_median": 120.0, "cpu_system_median": 20.0,
        "iowait_median": 2.0, "rss_avg_mb": 200.0, "rss_peak_mb": 400.0, "mismatch_runs": 1,
        "throttled_runs": 0, "busy_runs": 0, "j_per_image_median": None, "gpu_mem_peak_mb": None,
        # a language model's (docs/TRANSFORMERS.md): none for a CNN
        "tokens_per_second_median": None, "perplexity_median": None, "perplexity_min": None, "perplexity_max": None,
    }
    assert cv == pytest.approx(0.881917, abs=1e-6)
    b = rows[1]
    assert (b["framework"], b["threads"], b["batch_size"], b["runs"]) == ("tensorflow", "unset",
                                                                         None, 1)
    assert b["throughput_median"] == 500.0 and b["throughput_cv"] is None
    assert b["mismatch_runs"] == 0


def test_epoch_curve_over_ok_runs(study: Path) -> None:
    rows = query(study, f"SELECT * FROM epoch_curve WHERE cell_id = '{A}' ORDER BY epoch")
    common = {"sweep": "s1", "cell_id": A, "framework": "torch", "model": "lenet5",
              "dataset": "fashion-mnist", "threads": "2", "batch_size": 32, "runs": 3}
    assert rows == [
        {**common, "epoch": 0, "train_loss_median": 1.0, "train_accuracy_median": 0.50,
         "test_accuracy_median": 0.60, "test_accuracy_min": 0.58, "test_accuracy_max": 0.62,
         "epoch_seconds_median": 10.0, "test_seconds_median": 1.0},
        {**common, "epoch": 1, "train_loss_median": 0.6, "train_accuracy_median": 0.70,
         "test_accuracy_median": 0.80, "test_accuracy_min": 0.78, "test_accuracy_max": 0.84,
         "epoch_seconds_median": 12.0, "test_seconds_median": 1.0},
    ]
    cells = {r["cell_id"] for r in query(study, "SELECT cell_id FROM epoch_curve")}
    assert cells == {A, B}  # failed-only cells have no curve


def test_cell_status_and_durations(study: Path) -> None:
    assert query(study, "SELECT * FROM cell_status ORDER BY cell_id, repeat") == [
        {"cell_id": A, "repeat": 0, "attempts": 1, "max_attempt": 1, "last_status": "ok", "ok": True},
        {"cell_id": A, "repeat": 1, "attempts": 1, "max_attempt": 1, "last_status": "ok", "ok": True},
        {"cell_id": A, "repeat": 2, "attempts": 2, "max_attempt": 2, "last_status": "ok", "ok": True},
        {"cell_id": B, "repeat": 0, "attempts": 1, "max_attempt": 1, "last_status": "ok", "ok": True},
        {"cell_id": C, "repeat": 0, "attempts": 1, "max_attempt": 1, "last_status": "failed", "ok": False},
        {"cell_id": D, "repeat": 0, "attempts": 2, "max_attempt": 2, "last_status": "oom", "ok": False},
    ]
    assert query(study, "SELECT * FROM cell_durations ORDER BY cell_id") == [
        {"cell_id": A, "runs": 3, "wall_seconds_median": 20.0},
        {"cell_id": B, "runs": 1, "wall_seconds_median": 30.0},
    ]


def test_run_overview_rows(study: Path) -> None:
    rows = {r["run_id"]: r for r in query(study, "SELECT * FROM run_overview")}
    assert len(rows) == 8
    first = rows[f"{A}/0-1"]
    started = first.pop("started_at")
    assert started.isoformat() == "2026-11-22T01:50:00"
    assert first == {
        "run_id": f"{A}/0-1", "sweep": "s1", "cell_id": A, "repeat": 0, "attempt": 1,
        "status": "ok", "exit_code": 0, "executor": "local", "env_id": "torch-cpu-0123456789ab",
        "framework": "torch", "variant": "cpu", "model": "lenet5", "dataset": "fashion-mnist",
        "device": "cpu", "threads": "2", "batch_size": 32, "epochs": 2, "iterations": 0,
        "optimizer": "sgd", "lr": 0.01, "onednn": True, "cpuset": "",
        "wall_seconds": 10.0, "train_seconds": 22.0, "test_seconds": 1.0, "accuracy": 0.80,
        "throughput": 100.0, "time_to_first_step": 0.75,
        "cpu_user_avg": 120.0, "cpu_system_avg": 20.0, "cpu_total_avg": 140.0,
        "iowait_avg": 2.0, "rss_avg_bytes": 200.0 * MiB, "rss_peak_bytes": 300 * MiB,
        "mismatches": [], "mode": "train", "layout": "nchw", "precision": "fp32",
        "conv_algo": "heuristic", "gpus": None, "interop_threads": "unset", "preset": "none", "seed": 0,
        "inference_seconds": None, "peak_device_memory_bytes": None, "onednn_primitives": None,
        "epochs_run": None, "stopped_early": None, "best_epoch": None,
        "gpu_util_avg": None, "gpu_mem_used_peak_bytes": None, "gpu_power_avg_w": None, "gpu_energy_j": None,
        "cpu_energy_j": None, "images": None, "gpu_j_per_image": None, "cpu_j_per_image": None, "j_per_image": None,
        "gpu_throttled": None, "gpu_throttle_reasons": None, "busy_start": None, "busy_reasons": None,
        "compile": None, "attention": None, "seq_len": None, "tokens_per_second": None, "test_loss": None,
        "perplexity": None, "compile_seconds": None, "compiles_in_steps": None, "compile_cache": None,
        "attention_kernel": None,
    }
    assert rows[f"{A}/1-1"]["mismatches"] == ["threads: asked 2, in force 1"]
    failed = rows[f"{C}/0-1"]
    assert (failed["status"], failed["exit_code"], failed["throughput"], failed["accuracy"],
            failed["train_seconds"]) == ("failed", 2, None, None, None)
    tf = rows[f"{B}/0-1"]
    assert (tf["framework"], tf["threads"], tf["batch_size"], tf["env_id"]) == (
        "tensorflow", "unset", None, "tensorflow-cpu-0123456789ab")


def test_provenance(study: Path) -> None:
    rows = {r["run_id"]: r for r in query(study, "SELECT * FROM provenance")}
    assert len(rows) == 8
    row = rows[f"{A}/1-1"]
    assert {k: row[k] for k in ("hostname", "cpu_model", "cpu_count", "os", "python",
                                "matrun_version", "framework", "framework_version", "env_id",
                                "executor", "build")} == {
        "hostname": "other-host", "cpu_model": "Fixture CPU", "cpu_count": 2,
        "os": "Linux fixture", "python": "3.11.7", "matrun_version": "0.1.0",
        "framework": "torch", "framework_version": "2.13.0+cpu",
        "env_id": "torch-cpu-0123456789ab", "executor": "local", "build": "fixture build"}
    assert json.loads(row["in_force"]) == {"threads": 2, "interop_threads": 1,
                                           "affinity": [0, 1], "onednn": True, "device": "cpu"}
    assert json.loads(row["libraries"]) == [{"name": "libgomp", "path": "/lib/libgomp.so.1"}]
    assert json.loads(row["mismatches"]) == ["threads: asked 2, in force 1"]
    assert json.loads(rows[f"{A}/0-1"]["mismatches"]) == []


def test_layer_breakdown_medians_and_shares(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for repeat, (conv_f, conv_b, fc_f, fc_b) in enumerate([(0.002, 0.004, 0.001, 0.001),
                                                             (0.004, 0.006, 0.001, 0.003)]):
        make_bundle(results, cell_id="1a7e000000000001", repeat=repeat, params={"model": "alexnet"},
                    layers=[{"name": "conv1", "kind": "conv", "forward_seconds": conv_f,
                             "backward_seconds": conv_b, "params": 34944, "flops": 211120000},
                            {"name": "fc1", "kind": "dense", "forward_seconds": fc_f,
                             "backward_seconds": fc_b, "params": 37752832, "flops": 75497472}])
    make_bundle(results, cell_id="1a7e000000000002", status="failed", exit_code=1,
                layers=[{"name": "conv1", "kind": "conv", "forward_seconds": 9.0, "backward_seconds": 9.0}])
    db = tmp_path / "w.duckdb"
    ingest([results], warehouse=db)
    rows = query(db, "SELECT name, kind, layer_index, runs, forward_s_median, backward_s_median, "
                     "total_s_median, round(share, 4) AS share, params FROM layer_breakdown")
    assert rows == [
        {"name": "conv1", "kind": "conv", "layer_index": 0, "runs": 2, "forward_s_median": 0.003,
         "backward_s_median": 0.005, "total_s_median": 0.008, "share": 0.7273, "params": 34944},
        {"name": "fc1", "kind": "dense", "layer_index": 1, "runs": 2, "forward_s_median": 0.001,
         "backward_s_median": 0.002, "total_s_median": 0.003, "share": 0.2727, "params": 37752832},
    ]  # the failed run's layers are left out
