"""The study views (docs/WAREHOUSE.md, "Views that answer the studies") and their statistics
macros, over a hand-made warehouse.  Every expected number is worked out by hand from the
bundles below; no framework runs.

Each run has one epoch record (so train s = its epoch_seconds and accuracy = its
test_accuracy) unless said otherwise.  Runs per cell, as (throughput, train s, accuracy):

G1 torch / lenet5 / fashion-mnist / cpu (threads "unset", epochs 1, batch 64, lr 0.01):
  g1-default   default settings       (100, 10, .80) (110, 11, .80) (120, 12, .81) (130, 13, .81)
  g1-threads2  threads 2              (200, 5, .80) (210, 5.5, .80) (220, 6, .81) (230, 6.5, .81)
  g1-threads1  threads 1              (90, 14, .79) (92, 15, .79)
  g1-batch256  batch 256              (400, 3, .70) (410, 3, .70) (420, 3, .70) (430, 3, .70)
  g1-lr1       lr 1.0, both diverged  (500, 2, -) (510, 2, -)
  g1-tf        tensorflow, nhwc       (300, 4, .90) (310, 4, .90)
  g1-mxnet     mxnet, threads 1       (50, 30, .85)
G2 torch / lenet5 / mnist:      g2-default (100, 10, .90) (102, 10, .90); g2-threads2 (150, 7, .90) (152, 7, .90)
G4 torch / lenet5 / cifar10:    g4-epochs1 (80, 10, .50) x2; g4-epochs2 two epochs per run:
                                run 0 (10 s, .50) (11 s, .60), run 1 (12 s, .52) (13 s, .64)
G5 torch / resnet18 / gpu (cuda, one run each, epochs 1):
  gpus 1 batch 64 (1000, 10, .5); gpus 2 batch 128 (1800, 6, .5); gpus 4 batch 256 (3200, 4, .5);
  gpus 2 batch 64 (1500, 8, .5)
G6 torch / alexnet / cpu (threads 1): ref (100, 10, .80) (104, 10, .80); onednn off (50, 20, .80)
  (52, 20, .80); variant cpu-openblas (60, 17, .80) (62, 17, .80); layout nhwc (120, 8, .81) (124, 8, .81)
G7 torch / lenet5 / synthetic / gpu, inference: batch 32 (2000 img/s, 4 s, 100 MiB on the GPU),
  batch 128 (6000 img/s, 2 s, 300 MiB), batch 512 (oom)
G8 tensorflow / lenet5 / mnist (threads "unset", nhwc): preset framework-default (adam, 0.001,
  batch 128), the same with batch 32, and preset none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import duckdb
import pytest

from bundle_factory import make_bundle, patch_events
from matrun.warehouse.db import OWNED_MACROS, macro_sql, open_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MiB = 2**20

CONTRACT = {
    "cell_stats": "cell_id, sweeps, env_id, framework, variant, blas, device, mode, model, dataset, "
                  "threads, interop_threads, batch_size, epochs, iterations, optimizer, lr, onednn, "
                  "layout, precision, conv_algo, gpus, nodes, workers, scaling, global_batch, "
                  "preset, cpuset, seed, seq_len, params, "
                  "runs, failed_runs, timeout_runs, oom_runs, diverged_runs, mismatch_runs, busy_set_aside, design_level, "
                  "train_s_n, train_s_median, train_s_ci_low, train_s_ci_high, train_s_ci_level, "
                  "train_s_cv, train_s_noisy, train_s_values, "
                  "test_s_n, test_s_median, test_s_ci_low, test_s_ci_high, test_s_ci_level, "
                  "test_s_cv, test_s_noisy, test_s_values, "
                  "accuracy_n, accuracy_median, accuracy_ci_low, accuracy_ci_high, accuracy_ci_level, "
                  "accuracy_cv, accuracy_noisy, accuracy_values, "
                  "throughput_n, throughput_median, throughput_ci_low, throughput_ci_high, "
                  "throughput_ci_level, throughput_cv, throughput_noisy, throughput_values, "
                  "epoch_s_median, inference_s_median, onednn_primitives, cpu_user_median, "
                  "cpu_system_median, iowait_median, cpu_total_median, rss_avg_mb, rss_peak_mb, "
                  "device_memory_peak_mb, exchange_s_median, exchange_fraction_median, "
                  "tokens_per_second_median, perplexity_median",
    "default_cells": "framework, model, dataset, device, mode, cell_id, candidates, note, preset, "
                     "threads, batch_size, epochs, optimizer, lr, runs, train_s_median, "
                     "train_s_ci_low, train_s_ci_high, test_s_median, accuracy_median, "
                     "accuracy_ci_low, accuracy_ci_high, throughput_median, throughput_ci_low, "
                     "throughput_ci_high",
    "library_comparison": "config, framework, model, dataset, device, mode, threads, batch_size, "
                          "epochs, cell_id, variant, blas, onednn, onednn_primitives, runs, "
                          "train_s_median, train_s_ci_low, train_s_ci_high, train_s_noisy, "
                          "test_s_median, accuracy_median, throughput_median, throughput_ci_low, "
                          "throughput_ci_high, throughput_noisy, cpu_user_median, "
                          "cpu_system_median, iowait_median, cpu_total_median, rss_avg_mb, "
                          "rss_peak_mb, ref_cell_id, ref_variant, ref_blas, speedup, "
                          "throughput_ratio, throughput_ratio_low, throughput_ratio_high, "
                          "throughput_ratio_level, accuracy_change, p_value, test, significant, verdict, "
                          "accuracy_p_value, accuracy_significant, accuracy_verdict",
    "thread_sweep": "config, framework, variant, model, dataset, device, mode, onednn, batch_size, "
                    "epochs, cell_id, threads, threads_n, interop_threads, runs, train_s_median, "
                    "train_s_ci_low, train_s_ci_high, train_s_cv, train_s_noisy, "
                    "throughput_median, throughput_ci_low, throughput_ci_high, throughput_cv, "
                    "throughput_noisy, accuracy_median, cpu_user_median, cpu_system_median, "
                    "iowait_median, cpu_total_median, rss_peak_mb, ref_threads, ref_cell_id, "
                    "speedup, throughput_ratio, throughput_ratio_low, throughput_ratio_high, "
                    "throughput_ratio_level, p_value, test, significant, verdict, fastest",
    "epoch_sweep": "config, framework, variant, model, dataset, device, threads, batch_size, "
                   "optimizer, lr, cell_id, unit, length, epochs, iterations, runs, diverged_runs, "
                   "train_s_median, train_s_ci_low, train_s_ci_high, train_s_noisy, epoch_s_median, "
                   "test_s_median, accuracy_median, accuracy_ci_low, accuracy_ci_high, "
                   "throughput_median, ref_length, ref_cell_id, time_ratio, length_ratio, "
                   "time_linearity, accuracy_change, accuracy_p_value, accuracy_test, "
                   "accuracy_significant, accuracy_verdict",
    "batch_sweep": "config, framework, variant, model, dataset, device, mode, threads, epochs, "
                   "iterations, optimizer, lr, cell_id, batch_size, runs, failed_runs, oom_runs, "
                   "train_s_median, train_s_ci_low, train_s_ci_high, train_s_noisy, "
                   "epoch_s_median, test_s_median, inference_s_median, throughput_median, "
                   "throughput_ci_low, throughput_ci_high, throughput_noisy, accuracy_median, "
                   "accuracy_ci_low, accuracy_ci_high, ref_batch_size, ref_cell_id, speedup, "
                   "epoch_speedup, throughput_ratio, throughput_ratio_low, throughput_ratio_high, "
                   "throughput_ratio_level, accuracy_change, p_value, test, significant, "
                   "verdict, accuracy_p_value, accuracy_significant, accuracy_verdict",
    "batch_resources": "config, framework, variant, model, dataset, device, mode, threads, epochs, "
                       "iterations, cell_id, batch_size, runs, failed_runs, timeout_runs, oom_runs, "
                       "cpu_user_median, cpu_system_median, iowait_median, cpu_total_median, "
                       "rss_avg_mb, rss_peak_mb, device_memory_peak_mb, memory_limit_mb, "
                       "throughput_median",
    "batch_lr_grid": "config, framework, variant, model, dataset, device, threads, optimizer, "
                     "cell_id, batch_size, epochs, iterations, lr, runs, failed_runs, "
                     "diverged_runs, diverged, accuracy_n, accuracy_median, accuracy_ci_low, "
                     "accuracy_ci_high, train_s_median, epoch_s_median, throughput_median, "
                     "best_accuracy",
    "worker_scaling": "config, framework, variant, model, dataset, device, mode, epochs, kvstore, cell_id, "
                      "gpus, nodes, workers, batch_size, global_batch, per_worker_batch, runs, "
                      "failed_runs, oom_runs, train_s_median, train_s_ci_low, train_s_ci_high, "
                      "throughput_median, throughput_ci_low, throughput_ci_high, "
                      "throughput_noisy, accuracy_median, exchange_s_median, "
                      "exchange_fraction_median, scaling, ref_cell_id, ref_batch_size, "
                      "ref_global_batch, "
                      "speedup, speedup_low, speedup_high, speedup_level, efficiency, time_speedup, "
                      "accuracy_change, p_value, test, "
                      "significant, verdict",
    "epoch_convergence": "cell_id, framework, variant, model, dataset, device, threads, "
                         "batch_size, optimizer, lr, epoch, runs, test_accuracy_mean, "
                         "test_accuracy_sd, test_accuracy_min, test_accuracy_max, "
                         "test_accuracy_median, test_accuracy_ci_low, test_accuracy_ci_high, "
                         "test_accuracy_ci_level, train_accuracy_mean, train_loss_mean, "
                         "epoch_s_median, epoch_s_ci_low, epoch_s_ci_high, elapsed_s",
    "layer_kinds": "sweep, cell_id, framework, model, batch_size, kind, layers, forward_s, "
                   "backward_s, total_s, share, backward_ratio, params, flops",
    "option_effect": "option, ref_value, value, config, framework, variant, model, dataset, "
                     "device, mode, threads, batch_size, cell_id, ref_cell_id, runs, ref_runs, "
                     "throughput_median, ref_throughput_median, throughput_ratio, "
                     "throughput_ratio_low, throughput_ratio_high, throughput_ratio_level, "
                     "train_s_median, ref_train_s_median, speedup, accuracy_median, "
                     "ref_accuracy_median, accuracy_change, p_value, test, significant, verdict, "
                     "accuracy_p_value, accuracy_significant, accuracy_verdict",
    "best_vs_default": "framework, model, dataset, device, default_cell_id, default_note, "
                       "candidates, best_cell_id, changes, default_runs, best_runs, "
                       "default_throughput, best_throughput, speedup, speedup_low, speedup_high, "
                       "speedup_level, default_train_s, "
                       "best_train_s, time_speedup, default_accuracy, best_accuracy, "
                       "accuracy_change, p_value, test, significant, verdict, accuracy_p_value, "
                       "accuracy_verdict",
    "pareto_front": "model, dataset, device, framework, cell_id, variant, threads, batch_size, "
                    "epochs, iterations, optimizer, lr, onednn, layout, precision, runs, "
                    "train_s_median, train_s_ci_low, train_s_ci_high, accuracy_median, "
                    "accuracy_ci_low, accuracy_ci_high, dominated_by, on_front, "
                    "on_framework_front",
}

G1 = {"threads": "unset", "epochs": 1}  # the framework-default execution settings


def _epoch(seconds: float, accuracy: float | None) -> dict[str, Any]:
    return {"train_loss": 0.5, "train_accuracy": accuracy, "test_loss": 0.5,
            "test_accuracy": accuracy, "epoch_seconds": seconds, "test_seconds": 1.0}


def _cell(results: Path, cell_id: str, runs: Sequence[tuple[float, float, float | None]],
          params: dict[str, Any], *, probe: dict[str, Any] | None = None,
          summary: dict[str, Any] | None = None, **kwargs: Any) -> None:
    for repeat, (throughput, seconds, accuracy) in enumerate(runs):
        run = make_bundle(results, sweep="study", cell_id=cell_id, repeat=repeat, params=params,
                          throughput=throughput, epochs=(_epoch(seconds, accuracy),), **kwargs)
        if probe:
            patch_events(run, "probe", **probe)
        if summary:
            patch_events(run, "summary", **summary)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("study") / "results"
    # G1
    _cell(results, "g1-default", [(100, 10, .80), (110, 11, .80), (120, 12, .81), (130, 13, .81)], G1)
    _cell(results, "g1-threads2", [(200, 5, .80), (210, 5.5, .80), (220, 6, .81), (230, 6.5, .81)],
          {**G1, "threads": 2})
    _cell(results, "g1-threads1", [(90, 14, .79), (92, 15, .79)], {**G1, "threads": 1})
    _cell(results, "g1-batch256", [(400, 3, .70), (410, 3, .70), (420, 3, .70), (430, 3, .70)],
          {**G1, "batch_size": 256})
    for repeat, throughput in enumerate((500, 510)):
        run = make_bundle(results, sweep="study", cell_id="g1-lr1", repeat=repeat,
                          params={**G1, "lr": 1.0}, throughput=throughput,
                          epochs=(_epoch(2, None),))
        patch_events(run, "summary", diverged=True, accuracy=None)
    _cell(results, "g1-tf", [(300, 4, .90), (310, 4, .90)],
          {**G1, "framework": "tensorflow", "layout": "nhwc"})
    _cell(results, "g1-mxnet", [(50, 30, .85)], {"framework": "mxnet", "epochs": 1})
    # G2: the best is faster, but with 2 runs against 2 that is never significant
    _cell(results, "g2-default", [(100, 10, .90), (102, 10, .90)], {**G1, "dataset": "mnist"})
    _cell(results, "g2-threads2", [(150, 7, .90), (152, 7, .90)],
          {**G1, "dataset": "mnist", "threads": 2})
    # G4: an epochs sweep at default settings (so the default is ambiguous)
    _cell(results, "g4-epochs1", [(80, 10, .50), (80, 10, .50)], {**G1, "dataset": "cifar10"})
    for repeat, epochs in enumerate([(_epoch(10, .50), _epoch(11, .60)),
                                     (_epoch(12, .52), _epoch(13, .64))]):
        make_bundle(results, sweep="study", cell_id="g4-epochs2", repeat=repeat, throughput=80,
                    params={**G1, "dataset": "cifar10", "epochs": 2}, epochs=epochs)
    # G5: GPUs
    gpu = {"model": "resnet18", "device": "gpu", "variant": "cuda", "epochs": 1}
    for cell_id, gpus, batch, throughput, seconds in [("g5-gpus1", 1, 64, 1000, 10),
                                                      ("g5-gpus2", 2, 128, 1800, 6),
                                                      ("g5-gpus4", 4, 256, 3200, 4),
                                                      ("g5-gpus2-b64", 2, 64, 1500, 8)]:
        _cell(results, cell_id, [(throughput, seconds, .5)], {**gpu, "gpus": gpus, "batch_size": batch})
    # G6: math libraries and options
    mkl = {"build": "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release"}
    alex = {"model": "alexnet", "epochs": 1}
    _cell(results, "g6-ref", [(100, 10, .80), (104, 10, .80)], alex, probe=mkl)
    _cell(results, "g6-onednn-off", [(50, 20, .80), (52, 20, .80)], {**alex, "onednn": False}, probe=mkl)
    _cell(results, "g6-openblas", [(60, 17, .80), (62, 17, .80)], {**alex, "variant": "cpu-openblas"},
          probe={"build": "BLAS_INFO=generic",
                 "blas_loaded": {"provider": "openblas", "version": "0.3.21"}})
    _cell(results, "g6-nhwc", [(120, 8, .81), (124, 8, .81)], {**alex, "layout": "nhwc"}, probe=mkl)
    # G7: inference on a GPU; the largest batch runs out of memory
    inference = {"device": "gpu", "variant": "cuda", "gpus": 1, "mode": "inference",
                 "dataset": "synthetic", "epochs": None, "optimizer": None, "lr": None}
    for cell_id, batch, throughput, seconds, device_mib, monitor in [
            ("g7-b32", 32, 2000, 4.0, 100, ((0.2, 90.0, 10.0, 0.0, 100 * MiB), (0.4, 110.0, 10.0, 0.0, 300 * MiB))),
            ("g7-b128", 128, 6000, 2.0, 300, ((0.2, 50.0, 5.0, 2.0, 200 * MiB), (0.4, 70.0, 5.0, 4.0, 400 * MiB)))]:
        run = make_bundle(results, sweep="study", cell_id=cell_id, params={**inference, "batch_size": batch},
                          throughput=throughput, epochs=(), monitor=monitor)
        patch_events(run, "summary", train_seconds=None, test_seconds=None, accuracy=None,
               inference_seconds=seconds, peak_device_memory_bytes=device_mib * MiB)
    make_bundle(results, sweep="study", cell_id="g7-b512", params={**inference, "batch_size": 512},
                status="oom", exit_code=-9, epochs=())
    # G8: which preset wins the default
    tf = {**G1, "framework": "tensorflow", "layout": "nhwc", "dataset": "mnist"}
    preset = {**tf, "preset": "framework-default", "optimizer": "adam", "lr": 0.001, "momentum": None}
    _cell(results, "g8-preset", [(300, 5, .9)], {**preset, "batch_size": 128})
    _cell(results, "g8-preset-b32", [(200, 7, .9)], {**preset, "batch_size": 32})
    _cell(results, "g8-none", [(300, 5, .9)], tf)

    warehouse = results.parent / "w.duckdb"
    report = ingest([results], warehouse=warehouse)
    assert not report.skipped and len(report.ingested) == 45
    return warehouse


def query(warehouse: Path, sql: str) -> list[dict[str, Any]]:
    columns, rows = run_query(sql, warehouse=warehouse)
    return [dict(zip(columns, row)) for row in rows]


def pick(row: dict[str, Any], keys: str) -> dict[str, Any]:
    return {k: row[k] for k in keys.split(", ")}


# -- the statistics macros -----------------------------------------------------------------


def one(warehouse: Path, expr: str) -> Any:
    return run_query(f"SELECT {expr}", warehouse=warehouse)[1][0][0]


def test_median_ci_is_the_exact_order_statistic_interval(study: Path) -> None:
    # n = 9: P(B <= 1) = 10/512, 2 x 10/512 = 0.039 <= 0.05 but P(B <= 2) = 46/512 is not:
    # ranks 2 and 8, coverage 1 - 20/512.  Below 6 values no interval reaches 95 %: [min, max].
    assert one(study, "median_ci([9, 1, 8, 2, 7, 3, 6, 4, 5]::DOUBLE[])") == {
        "low": 2.0, "high": 8.0, "level": 1 - 20 / 512}
    assert one(study, "median_ci([3, 1, 2]::DOUBLE[])") == {"low": 1.0, "high": 3.0, "level": 0.75}
    assert one(study, "median_ci(range(1, 7)::DOUBLE[])") == {"low": 1.0, "high": 6.0,
                                                            "level": 1 - 2 / 64}
    # n = 12: 2 P(B <= 2) = 2 x 79/4096 = 0.0386; ranks 3 and 10
    assert one(study, "median_ci(range(1, 13)::DOUBLE[])") == {
        "low": 3.0, "high": 10.0, "level": pytest.approx(1 - 2 * 79 / 4096)}
    assert one(study, "median_ci([4]::DOUBLE[])") is None


def test_mann_whitney_exact_small_cases(study: Path) -> None:
    # 4 vs 4, separated: U = 0; only 2 of the C(8,4) = 70 splits are as extreme: p = 2/70.
    # (the ratio fields: tests/test_effect_sizes.py)
    r = one(study, "compare_samples([1, 2, 3, 4]::DOUBLE[], [5, 6, 7, 8]::DOUBLE[])")
    assert {k: v for k, v in r.items() if not k.startswith("ratio")} == {
        "n": 4, "ref_n": 4, "u": 0.0, "p_value": pytest.approx(2 / 70), "test": "mann-whitney exact",
        "significant": True, "direction": -1, "intervals_overlap": False, "level": 0.05}
    # at an adaptive design's level (runner/planning/sequential.py) 4 vs 4 cannot decide:
    # p = 2/70 = 0.0286 > 0.0175; 5 vs 5 separated (p = 2/252) can; p equal to the level decides
    r = one(study, "compare_samples([1, 2, 3, 4]::DOUBLE[], [5, 6, 7, 8]::DOUBLE[], level := 0.0175)")
    assert (r["significant"], r["level"]) == (False, 0.0175)
    r = one(study, "compare_samples([1, 2, 3, 4, 5]::DOUBLE[], [6, 7, 8, 9, 10]::DOUBLE[], level := 0.0175)")
    assert (r["p_value"], r["significant"]) == (pytest.approx(2 / 252), True)
    r = one(study, f"compare_samples([1, 2, 3, 4]::DOUBLE[], [5, 6, 7, 8]::DOUBLE[], level := {2 / 70!r})")
    assert r["significant"] is True
    r = one(study, "compare_samples([1, 2, 3, 4]::DOUBLE[], [5, 6, 7, 8]::DOUBLE[], level := NULL)")
    assert (r["significant"], r["level"]) == (True, 0.05)  # NULL: a fixed design's 0.05
    # 3 vs 5, separated: p = 2 / C(8,3) = 2/56 < 0.05
    r = one(study, "compare_samples([6, 7, 8]::DOUBLE[], [1, 2, 3, 4, 5]::DOUBLE[])")
    assert (r["u"], r["p_value"], r["significant"], r["direction"]) == (15.0, pytest.approx(2 / 56), True, 1)
    # 2 vs 2 can never reach 0.05: p = 2/6 at best, so the test does not decide
    r = one(study, "compare_samples([1, 2]::DOUBLE[], [3, 4]::DOUBLE[])")
    assert (r["p_value"], r["test"], r["significant"], r["intervals_overlap"]) == (
        pytest.approx(1 / 3), "interval overlap", False, False)
    # 3 vs 3: 2/20 = 0.1 at best; 3 vs 4: 2/35
    r = one(study, "compare_samples([1, 2, 3]::DOUBLE[], [4, 5, 6]::DOUBLE[])")
    assert (r["p_value"], r["significant"]) == (pytest.approx(0.1), False)
    # ties: x = [1, 2, 2, 3] vs [2, 3, 4, 5, 5]: U = 0 + .5 + .5 + (1 + .5) = 2.5; the
    # permutation p counts the splits of the pooled mid-ranks as far from mn/2 = 10:
    # 10 of C(9,4) = 126
    r = one(study, "compare_samples([1, 2, 2, 3]::DOUBLE[], [2, 3, 4, 5, 5]::DOUBLE[])")
    assert (r["u"], r["p_value"], r["test"], r["significant"]) == (
        2.5, pytest.approx(10 / 126), "mann-whitney exact", False)
    # all tied: U = mn/2, p = 1
    r = one(study, "compare_samples([.8, .8]::DOUBLE[], [.8, .8]::DOUBLE[])")
    assert (r["u"], r["p_value"], r["direction"]) == (2.0, 1.0, 0)
    assert one(study, "compare_samples([]::DOUBLE[], [1, 2]::DOUBLE[])") is None
    assert one(study, "compare_samples(NULL::DOUBLE[], [1, 2]::DOUBLE[])") is None


def test_mann_whitney_normal_approximation_above_16_values(study: Path) -> None:
    # 10 vs 10, no ties: U = 21 (x=k beats the 3.5+j below it: 0+0+0+0+1+2+3+4+5+6),
    # sigma^2 = 10*10*21/12 = 175, z = (|21 - 50| - 0.5) / sqrt(175) = 2.15440,
    # two-sided p = erfc(z / sqrt 2) = 0.031209 (scipy.stats.mannwhitneyu asymptotic agrees)
    r = one(study, "compare_samples(range(10)::DOUBLE[], list_transform(range(10), lambda i: i + 3.5)::DOUBLE[])")
    z = 28.5 / math.sqrt(175)
    assert (r["u"], r["test"], r["significant"]) == (21.0, "mann-whitney normal", True)
    assert r["p_value"] == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-6)
    assert r["p_value"] == pytest.approx(0.031209, abs=1e-6)


def test_when_the_test_can_decide(study: Path) -> None:
    pairs = [(2, 2), (3, 3), (3, 4), (4, 4), (3, 5), (2, 7), (2, 8), (1, 30)]
    got = [one(study, f"mw_can_decide({m}, {n})") for m, n in pairs]
    assert got == [False, False, False, True, True, False, True, False]


def test_default_hyperparams_agree_with_the_presets_and_the_parameter_defaults(study: Path) -> None:
    from matrun.runner.planning.params import PARAMS
    from matrun.runner.planning.presets import FAMILY, PRESET_VALUES

    for (framework, family), values in PRESET_VALUES.items():
        for dataset in [d for d, f in FAMILY.items() if f == family]:
            got = one(study, f"default_hyperparams('{framework}', '{dataset}', 'framework-default')")
            assert got == {"optimizer": values["optimizer"], "lr": pytest.approx(values["lr"]),
                           "batch_size": values["batch_size"]}, (framework, dataset)
    got = one(study, "default_hyperparams('torch', 'cifar10', 'none')")
    assert got == {k: PARAMS[k].default for k in ("optimizer", "lr", "batch_size")}


# -- cell_stats ----------------------------------------------------------------------------


def test_cell_stats_medians_intervals_and_noise(study: Path) -> None:
    rows = {r["cell_id"]: r for r in query(study, "SELECT * FROM cell_stats")}
    d = rows["g1-default"]
    # throughput 100..130: mean 115, sample sd sqrt((225+25+25+225)/3) = 12.9099; train 10..13
    assert pick(d, "framework, threads, workers, runs, diverged_runs, sweeps") == {
        "framework": "torch", "threads": "unset", "workers": 1, "runs": 4, "diverged_runs": 0,
        "sweeps": ["study"]}
    assert pick(d, "throughput_n, throughput_median, throughput_ci_low, throughput_ci_high, "
                   "throughput_ci_level, throughput_noisy, throughput_values") == {
        "throughput_n": 4, "throughput_median": 115.0, "throughput_ci_low": 100.0,
        "throughput_ci_high": 130.0, "throughput_ci_level": 1 - 2 / 16, "throughput_noisy": True,
        "throughput_values": [100.0, 110.0, 120.0, 130.0]}
    assert d["throughput_cv"] == pytest.approx(math.sqrt(500 / 3) / 115)
    assert (d["train_s_median"], d["train_s_ci_low"], d["train_s_ci_high"]) == (11.5, 10.0, 13.0)
    assert d["train_s_cv"] == pytest.approx(math.sqrt(5 / 3) / 11.5)
    assert (d["accuracy_median"], d["accuracy_ci_low"], d["accuracy_ci_high"]) == (
        pytest.approx(.805), .80, .81)
    assert d["accuracy_noisy"] is False  # sd 0.00577 / mean 0.805 = 0.0072
    assert (d["test_s_median"], d["test_s_cv"], d["epoch_s_median"]) == (1.0, 0.0, 11.5)
    # monitor defaults of the factory: user 100, system 10, RSS 100 MB and 300 MB (decimal)
    assert (d["cpu_user_median"], d["cpu_total_median"], d["rss_peak_mb"]) == (
        100.0, 110.0, pytest.approx(300e6 / MiB))
    # a diverged run: no train time, no accuracy; its throughput counts
    lr1 = rows["g1-lr1"]
    assert pick(lr1, "runs, diverged_runs, train_s_n, accuracy_n, throughput_n, train_s_median, "
                     "accuracy_median, throughput_median") == {
        "runs": 2, "diverged_runs": 2, "train_s_n": 0, "accuracy_n": 0, "throughput_n": 2,
        "train_s_median": None, "accuracy_median": None, "throughput_median": 505.0}
    one_run = rows["g1-mxnet"]
    assert (one_run["throughput_ci_low"], one_run["throughput_cv"], one_run["throughput_noisy"]) == (
        None, None, None)
    oom = rows["g7-b512"]
    assert pick(oom, "runs, oom_runs, failed_runs, throughput_n, throughput_median, mode") == {
        "runs": 0, "oom_runs": 1, "failed_runs": 0, "throughput_n": 0, "throughput_median": None,
        "mode": "inference"}
    gpu = rows["g5-gpus4"]
    assert (gpu["gpus"], gpu["workers"], gpu["nodes"]) == (4, 4, None)
    assert json.loads(d["params"])["threads"] == "unset" and "timeout" not in json.loads(d["params"])


def test_cell_stats_blas_from_the_probe(study: Path) -> None:
    rows = {r["cell_id"]: r["blas"] for r in query(
        study, "SELECT cell_id, blas FROM cell_stats WHERE cell_id LIKE 'g6-%' OR cell_id IN ('g1-tf', 'g1-default')")}
    assert rows == {"g6-ref": "mkl", "g6-onednn-off": "mkl", "g6-nhwc": "mkl",
                    "g6-openblas": "openblas 0.3.21",  # what was mapped beats BLAS_INFO=generic
                    "g1-tf": "eigen", "g1-default": None}  # the factory's probe names no BLAS


# -- A1: default cells, best against default ---------------------------------------------


def test_default_cells(study: Path) -> None:
    rows = {(r["framework"], r["dataset"], r["model"], r["mode"]): r
            for r in query(study, "SELECT * FROM default_cells")}
    assert len(rows) == 9
    notes = {k: (r["cell_id"], r["candidates"], r["note"]) for k, r in rows.items()}
    assert notes[("torch", "fashion-mnist", "lenet5", "train")] == ("g1-default", 1, "default")
    assert notes[("tensorflow", "fashion-mnist", "lenet5", "train")] == ("g1-tf", 1, "default")
    assert notes[("torch", "mnist", "lenet5", "train")] == ("g2-default", 1, "default")
    assert notes[("mxnet", "fashion-mnist", "lenet5", "train")] == (
        None, 0, "no cell with the framework's default settings")
    assert notes[("torch", "cifar10", "lenet5", "train")] == (
        None, 2, "ambiguous: 2 cells with default settings differ in other parameters")
    assert notes[("torch", "fashion-mnist", "alexnet", "train")][0] is None  # threads 1
    # the preset wins over preset none, and of the preset cells the one with its own batch
    assert notes[("tensorflow", "mnist", "lenet5", "train")] == ("g8-preset", 1, "default")
    d = rows[("torch", "fashion-mnist", "lenet5", "train")]
    assert pick(d, "runs, train_s_median, test_s_median, accuracy_median, throughput_median") == {
        "runs": 4, "train_s_median": 11.5, "test_s_median": 1.0,
        "accuracy_median": pytest.approx(.805), "throughput_median": 115.0}


def test_best_vs_default(study: Path) -> None:
    rows = {(r["framework"], r["model"], r["dataset"]): r for r in query(study, "SELECT * FROM best_vs_default")}
    # G1: candidates g1-default and g1-threads2 (g1-threads1 .79 and g1-batch256 .70 are more
    # than 0.5 points below .805; g1-lr1 diverged).  threads2 beats every default run:
    # U = 16 of 16, exact p = 2/70.
    g1 = rows[("torch", "lenet5", "fashion-mnist")]
    assert pick(g1, "default_cell_id, default_note, candidates, best_cell_id, changes, "
                    "default_runs, best_runs, default_throughput, best_throughput, "
                    "default_train_s, best_train_s, time_speedup, test, significant, verdict, "
                    "accuracy_p_value, accuracy_verdict") == {
        "default_cell_id": "g1-default", "default_note": "default", "candidates": 2,
        "best_cell_id": "g1-threads2", "changes": ["threads=2"], "default_runs": 4, "best_runs": 4,
        "default_throughput": 115.0, "best_throughput": 215.0, "default_train_s": 11.5,
        "best_train_s": 5.75, "time_speedup": 2.0, "test": "mann-whitney exact",
        "significant": True, "verdict": "faster", "accuracy_p_value": 1.0,
        "accuracy_verdict": "not significant"}
    assert g1["speedup"] == pytest.approx(215 / 115)
    assert g1["p_value"] == pytest.approx(2 / 70)
    assert g1["accuracy_change"] == pytest.approx(0.0)
    # G2: faster by the medians (151 vs 101) but 2 runs against 2: not significant, not a win
    g2 = rows[("torch", "lenet5", "mnist")]
    assert pick(g2, "best_cell_id, test, significant, verdict") == {
        "best_cell_id": "g2-threads2", "test": "interval overlap", "significant": False,
        "verdict": "not significant"}
    assert (g2["speedup"], g2["p_value"]) == (pytest.approx(151 / 101), pytest.approx(1 / 3))
    # the default is the best there is
    tf = rows[("tensorflow", "lenet5", "fashion-mnist")]
    assert pick(tf, "best_cell_id, changes, speedup, p_value, significant, verdict") == {
        "best_cell_id": "g1-tf", "changes": [], "speedup": 1.0, "p_value": None,
        "significant": False, "verdict": "default is fastest"}
    # no default, or an ambiguous one: nothing is invented
    for key in [("mxnet", "lenet5", "fashion-mnist"), ("torch", "lenet5", "cifar10")]:
        assert pick(rows[key], "default_cell_id, best_cell_id, speedup, significant, verdict") == {
            "default_cell_id": None, "best_cell_id": None, "speedup": None, "significant": None,
            "verdict": None}
    assert ("torch", "lenet5", "synthetic") not in rows  # inference cells have no training best


def test_pareto_front(study: Path) -> None:
    rows = query(study, "SELECT cell_id, train_s_median, accuracy_median, dominated_by, on_front, "
                        "on_framework_front FROM pareto_front WHERE model = 'lenet5' "
                        "AND dataset = 'fashion-mnist'")
    # (train s, accuracy): batch256 (3, .70), tf (4, .90), threads2 (5.75, .805),
    # default (11.5, .805), threads1 (14.5, .79), mxnet (30, .85); lr1 has neither median
    assert [(r["cell_id"], r["dominated_by"], r["on_front"], r["on_framework_front"]) for r in rows] == [
        ("g1-batch256", 0, True, True),
        ("g1-tf", 0, True, True),
        ("g1-threads2", 1, False, True),     # tf
        ("g1-default", 2, False, False),     # threads2 (same accuracy, faster), tf
        ("g1-threads1", 3, False, False),    # default, threads2, tf
        ("g1-mxnet", 1, False, True),        # tf only: the torch cells are less accurate
    ]


# -- the sweeps ------------------------------------------------------------------------------


def test_thread_sweep(study: Path) -> None:
    rows = query(study, "SELECT * FROM thread_sweep WHERE dataset = 'fashion-mnist' AND model = 'lenet5'")
    assert [(r["cell_id"], r["threads"], r["threads_n"], r["ref_threads"], r["fastest"]) for r in rows] == [
        ("g1-threads1", "1", 1, 1, False), ("g1-threads2", "2", 2, 1, True),
        ("g1-default", "unset", None, 1, False)]
    ref, two, unset = rows
    assert pick(ref, "ref_cell_id, speedup, p_value, test, significant, verdict") == {
        "ref_cell_id": "g1-threads1", "speedup": 1.0, "p_value": None, "test": None,
        "significant": False, "verdict": "reference"}
    # 4 runs against 2, all faster: U = 8, the 2 most extreme of C(6,2) = 15 splits, p = 2/15;
    # 2/15 > 0.05 whatever the data, so the test cannot decide: not significant
    assert two["speedup"] == pytest.approx(14.5 / 5.75)
    assert two["throughput_ratio"] == pytest.approx(215 / 91)
    assert pick(two, "test, significant, verdict") == {
        "test": "interval overlap", "significant": False, "verdict": "not significant"}
    assert two["p_value"] == pytest.approx(2 / 15)
    assert unset["speedup"] == pytest.approx(14.5 / 11.5)
    mnist = query(study, "SELECT cell_id, ref_cell_id FROM thread_sweep WHERE dataset = 'mnist' "
                         "AND framework = 'torch'")
    assert mnist == [{"cell_id": "g2-threads2", "ref_cell_id": "g2-threads2"},
                     {"cell_id": "g2-default", "ref_cell_id": "g2-threads2"}]


def test_batch_sweep_training_and_inference(study: Path) -> None:
    rows = query(study, "SELECT * FROM batch_sweep WHERE model = 'lenet5' AND dataset = 'fashion-mnist'")
    assert [r["cell_id"] for r in rows] == ["g1-default", "g1-batch256"]
    big = rows[1]
    assert pick(big, "ref_batch_size, ref_cell_id, epoch_s_median, test, significant, verdict, "
                     "accuracy_significant, accuracy_verdict") == {
        "ref_batch_size": 64, "ref_cell_id": "g1-default", "epoch_s_median": 3.0,
        "test": "mann-whitney exact", "significant": True, "verdict": "faster",
        "accuracy_significant": True, "accuracy_verdict": "less accurate"}
    assert big["speedup"] == pytest.approx(11.5 / 3)
    assert big["epoch_speedup"] == pytest.approx(11.5 / 3)
    assert big["throughput_ratio"] == pytest.approx(415 / 115)
    assert big["accuracy_change"] == pytest.approx(-10.5)
    # accuracy .70 x4 against .80 .80 .81 .81: U = 0; with the ties only the split that puts
    # the four .70 on one side (and its mirror) is as extreme: 2 of 70
    assert big["p_value"] == pytest.approx(2 / 70) and big["accuracy_p_value"] == pytest.approx(2 / 70)
    inf = query(study, "SELECT * FROM batch_sweep WHERE mode = 'inference'")
    assert [(r["cell_id"], r["runs"], r["oom_runs"]) for r in inf] == [
        ("g7-b32", 1, 0), ("g7-b128", 1, 0), ("g7-b512", 0, 1)]
    assert pick(inf[1], "inference_s_median, throughput_median, throughput_ratio, train_s_median, "
                        "accuracy_median, speedup, ref_cell_id") == {
        "inference_s_median": 2.0, "throughput_median": 6000.0, "throughput_ratio": 3.0,
        "train_s_median": None, "accuracy_median": None, "speedup": None, "ref_cell_id": "g7-b32"}
    assert (inf[2]["throughput_median"], inf[2]["verdict"]) == (None, None)


def test_batch_resources(study: Path) -> None:
    rows = query(study, "SELECT cell_id, batch_size, runs, oom_runs, cpu_user_median, "
                        "cpu_system_median, iowait_median, cpu_total_median, rss_avg_mb, "
                        "rss_peak_mb, device_memory_peak_mb, memory_limit_mb FROM batch_resources "
                        "WHERE mode = 'inference'")
    assert rows == [
        {"cell_id": "g7-b32", "batch_size": 32, "runs": 1, "oom_runs": 0, "cpu_user_median": 100.0,
         "cpu_system_median": 10.0, "iowait_median": 0.0, "cpu_total_median": 110.0,
         "rss_avg_mb": 200.0, "rss_peak_mb": 300.0, "device_memory_peak_mb": 100.0,
         "memory_limit_mb": None},
        {"cell_id": "g7-b128", "batch_size": 128, "runs": 1, "oom_runs": 0, "cpu_user_median": 60.0,
         "cpu_system_median": 5.0, "iowait_median": 3.0, "cpu_total_median": 65.0,
         "rss_avg_mb": 300.0, "rss_peak_mb": 400.0, "device_memory_peak_mb": 300.0,
         "memory_limit_mb": None},
        {"cell_id": "g7-b512", "batch_size": 512, "runs": 0, "oom_runs": 1, "cpu_user_median": None,
         "cpu_system_median": None, "iowait_median": None, "cpu_total_median": None,
         "rss_avg_mb": None, "rss_peak_mb": None, "device_memory_peak_mb": None,
         "memory_limit_mb": None},
    ]


def test_batch_lr_grid_represents_divergence(study: Path) -> None:
    rows = query(study, "SELECT cell_id, batch_size, lr, runs, diverged_runs, diverged, accuracy_n, "
                        "accuracy_median, best_accuracy FROM batch_lr_grid "
                        "WHERE dataset = 'fashion-mnist' AND model = 'lenet5'")
    assert rows == [
        {"cell_id": "g1-default", "batch_size": 64, "lr": 0.01, "runs": 4, "diverged_runs": 0,
         "diverged": False, "accuracy_n": 4, "accuracy_median": pytest.approx(.805), "best_accuracy": True},
        {"cell_id": "g1-lr1", "batch_size": 64, "lr": 1.0, "runs": 2, "diverged_runs": 2,
         "diverged": True, "accuracy_n": 0, "accuracy_median": None, "best_accuracy": False},
        {"cell_id": "g1-batch256", "batch_size": 256, "lr": 0.01, "runs": 4, "diverged_runs": 0,
         "diverged": False, "accuracy_n": 4, "accuracy_median": .70, "best_accuracy": False},
    ]


def test_epoch_sweep(study: Path) -> None:
    rows = query(study, "SELECT * FROM epoch_sweep")
    assert [(r["cell_id"], r["unit"], r["length"]) for r in rows] == [
        ("g4-epochs1", "epochs", 1), ("g4-epochs2", "epochs", 2)]
    two = rows[1]
    # train s: 10 + 11 = 21 and 12 + 13 = 25, median 23, against 10: 2.3 for twice the epochs
    assert pick(two, "train_s_median, epoch_s_median, ref_cell_id, ref_length, length_ratio, "
                     "accuracy_test, accuracy_significant, accuracy_verdict") == {
        "train_s_median": 23.0, "epoch_s_median": 11.5, "ref_cell_id": "g4-epochs1", "ref_length": 1,
        "length_ratio": 2.0, "accuracy_test": "interval overlap", "accuracy_significant": False,
        "accuracy_verdict": "not significant"}
    assert two["time_ratio"] == pytest.approx(2.3)
    assert two["time_linearity"] == pytest.approx(1.15)
    assert two["accuracy_change"] == pytest.approx(12.0)   # median(.60, .64) - .50
    assert two["accuracy_p_value"] == pytest.approx(1 / 3)
    assert rows[0]["accuracy_verdict"] == "reference"


def test_epoch_convergence_over_repeats(study: Path) -> None:
    rows = query(study, "SELECT * FROM epoch_convergence WHERE cell_id = 'g4-epochs2'")
    assert [r["epoch"] for r in rows] == [0, 1]
    first, second = rows
    assert pick(second, "runs, test_accuracy_min, test_accuracy_max, test_accuracy_ci_low, "
                        "test_accuracy_ci_high, test_accuracy_ci_level, epoch_s_median, "
                        "epoch_s_ci_low, epoch_s_ci_high") == {
        "runs": 2, "test_accuracy_min": .60, "test_accuracy_max": .64, "test_accuracy_ci_low": .60,
        "test_accuracy_ci_high": .64, "test_accuracy_ci_level": 0.5, "epoch_s_median": 12.0,
        "epoch_s_ci_low": 11.0, "epoch_s_ci_high": 13.0}
    assert second["test_accuracy_mean"] == pytest.approx(.62)
    assert second["test_accuracy_sd"] == pytest.approx(math.sqrt(2 * .02 ** 2))
    assert second["test_accuracy_median"] == pytest.approx(.62)
    assert (first["epoch_s_median"], first["elapsed_s"], second["elapsed_s"]) == (11.0, 11.0, 23.0)


def test_worker_scaling(study: Path) -> None:
    rows = query(study, "SELECT cell_id, gpus, workers, batch_size, per_worker_batch, scaling, "
                        "ref_cell_id, speedup, efficiency, time_speedup, test, significant, verdict "
                        "FROM worker_scaling")
    assert rows == [
        {"cell_id": "g5-gpus1", "gpus": 1, "workers": 1, "batch_size": 64, "per_worker_batch": 64.0,
         "scaling": "weak", "ref_cell_id": "g5-gpus1", "speedup": 1.0, "efficiency": 1.0,
         "time_speedup": 1.0, "test": None, "significant": False, "verdict": "reference"},
        {"cell_id": "g5-gpus2-b64", "gpus": 2, "workers": 2, "batch_size": 64, "per_worker_batch": 32.0,
         "scaling": "strong", "ref_cell_id": "g5-gpus1", "speedup": 1.5, "efficiency": 0.75,
         "time_speedup": 1.25, "test": "interval overlap", "significant": False,
         "verdict": "not significant"},
        {"cell_id": "g5-gpus2", "gpus": 2, "workers": 2, "batch_size": 128, "per_worker_batch": 64.0,
         "scaling": "weak", "ref_cell_id": "g5-gpus1", "speedup": 1.8, "efficiency": 0.9,
         "time_speedup": pytest.approx(10 / 6), "test": "interval overlap", "significant": False,
         "verdict": "not significant"},
        {"cell_id": "g5-gpus4", "gpus": 4, "workers": 4, "batch_size": 256, "per_worker_batch": 64.0,
         "scaling": "weak", "ref_cell_id": "g5-gpus1", "speedup": 3.2, "efficiency": 0.8,
         "time_speedup": 2.5, "test": "interval overlap", "significant": False,
         "verdict": "not significant"},
    ]


def test_worker_scaling_of_multi_worker_cells_follows_the_declared_scaling(tmp_path: Path) -> None:
    """Cells with ``workers`` (DDP and friends): with scaling = "weak" batch_size is per worker,
    so the global batch is batch_size x workers x nodes; with "strong" it is batch_size.  The
    reference is the 1-worker cell the cell declares, even when the other kind also exists."""
    results = tmp_path / "results"
    base = {**G1, "threads": 1, "model": "lenet5", "dataset": "mnist"}
    weak, strong = {**base, "scaling": "weak"}, {**base, "scaling": "strong"}
    exchange = {"exchange": {"method": "comm hook", "seconds_median": 0.02, "fraction_of_step": 0.25}}
    _cell(results, "w1", [(100, 10, .8), (102, 10, .8)], {**weak, "workers": 1, "batch_size": 32})
    _cell(results, "w2", [(170, 6, .8), (174, 6, .8)], {**weak, "workers": 2, "batch_size": 32},
          summary=exchange)
    _cell(results, "w2n2", [(300, 4, .8)], {**weak, "workers": 2, "nodes": 2, "batch_size": 32})
    _cell(results, "s1", [(120, 9, .8)], {**strong, "workers": 1, "batch_size": 64})
    _cell(results, "s1-b32", [(100, 10, .8)], {**strong, "workers": 1, "batch_size": 32})
    _cell(results, "s2", [(180, 6, .8)], {**strong, "workers": 2, "batch_size": 64})
    db = tmp_path / "w.duckdb"
    ingest([results], warehouse=db)
    rows = query(db, "SELECT cell_id, workers, batch_size, global_batch, per_worker_batch, scaling, "
                     "ref_cell_id, ref_global_batch, speedup, efficiency, exchange_s_median, "
                     "exchange_fraction_median FROM worker_scaling ORDER BY cell_id")
    assert rows == [
        {"cell_id": "s1", "workers": 1, "batch_size": 64, "global_batch": 64, "per_worker_batch": 64.0,
         "scaling": "strong", "ref_cell_id": "s1", "ref_global_batch": 64, "speedup": 1.0,
         "efficiency": 1.0, "exchange_s_median": None, "exchange_fraction_median": None},
        {"cell_id": "s1-b32", "workers": 1, "batch_size": 32, "global_batch": 32, "per_worker_batch": 32.0,
         "scaling": "strong", "ref_cell_id": "s1-b32", "ref_global_batch": 32, "speedup": 1.0,
         "efficiency": 1.0, "exchange_s_median": None, "exchange_fraction_median": None},
        # s1-b32 has s2's per-worker batch too, but s2 declares strong scaling: s1 it is
        {"cell_id": "s2", "workers": 2, "batch_size": 64, "global_batch": 64, "per_worker_batch": 32.0,
         "scaling": "strong", "ref_cell_id": "s1", "ref_global_batch": 64, "speedup": 1.5,
         "efficiency": 0.75, "exchange_s_median": None, "exchange_fraction_median": None},
        {"cell_id": "w1", "workers": 1, "batch_size": 32, "global_batch": 32, "per_worker_batch": 32.0,
         "scaling": "weak", "ref_cell_id": "w1", "ref_global_batch": 32, "speedup": 1.0,
         "efficiency": 1.0, "exchange_s_median": None, "exchange_fraction_median": None},
        {"cell_id": "w2", "workers": 2, "batch_size": 32, "global_batch": 64, "per_worker_batch": 32.0,
         "scaling": "weak", "ref_cell_id": "w1", "ref_global_batch": 32, "speedup": 172 / 101,
         "efficiency": 172 / 101 / 2, "exchange_s_median": 0.02, "exchange_fraction_median": 0.25},
        {"cell_id": "w2n2", "workers": 4, "batch_size": 32, "global_batch": 128, "per_worker_batch": 32.0,
         "scaling": "weak", "ref_cell_id": "w1", "ref_global_batch": 32, "speedup": 300 / 101,
         "efficiency": 300 / 101 / 4, "exchange_s_median": None, "exchange_fraction_median": None},
    ]


def test_library_comparison(study: Path) -> None:
    rows = query(study, "SELECT cell_id, variant, blas, onednn, ref_cell_id, ref_blas, speedup, "
                        "throughput_ratio, accuracy_change, p_value, test, significant, verdict, "
                        "accuracy_p_value, accuracy_verdict FROM library_comparison")
    assert rows == [
        {"cell_id": "g6-ref", "variant": "cpu", "blas": "mkl", "onednn": True, "ref_cell_id": "g6-ref",
         "ref_blas": "mkl", "speedup": 1.0, "throughput_ratio": 1.0, "accuracy_change": 0.0,
         "p_value": None, "test": None, "significant": False, "verdict": "reference",
         "accuracy_p_value": None, "accuracy_verdict": "reference"},
        {"cell_id": "g6-onednn-off", "variant": "cpu", "blas": "mkl", "onednn": False,
         "ref_cell_id": "g6-ref", "ref_blas": "mkl", "speedup": 0.5, "throughput_ratio": 0.5,
         "accuracy_change": 0.0, "p_value": pytest.approx(1 / 3), "test": "interval overlap",
         "significant": False, "verdict": "not significant", "accuracy_p_value": 1.0,
         "accuracy_verdict": "not significant"},
        {"cell_id": "g6-openblas", "variant": "cpu-openblas", "blas": "openblas 0.3.21", "onednn": True,
         "ref_cell_id": "g6-ref", "ref_blas": "mkl", "speedup": pytest.approx(10 / 17),
         "throughput_ratio": pytest.approx(61 / 102), "accuracy_change": 0.0,
         "p_value": pytest.approx(1 / 3), "test": "interval overlap", "significant": False,
         "verdict": "not significant", "accuracy_p_value": 1.0, "accuracy_verdict": "not significant"},
    ]  # g6-nhwc differs in layout too: not part of this comparison


def test_option_effect_pairs_cells_that_differ_in_one_option(study: Path) -> None:
    rows = query(study, "SELECT option, ref_value, value, cell_id, ref_cell_id, throughput_ratio, "
                        "speedup, accuracy_change, significant, verdict FROM option_effect")
    assert rows == [
        {"option": "layout", "ref_value": "nchw", "value": "nhwc", "cell_id": "g6-nhwc",
         "ref_cell_id": "g6-ref", "throughput_ratio": pytest.approx(122 / 102), "speedup": 1.25,
         "accuracy_change": pytest.approx(1.0), "significant": False, "verdict": "not significant"},
        {"option": "onednn", "ref_value": "true", "value": "false", "cell_id": "g6-onednn-off",
         "ref_cell_id": "g6-ref", "throughput_ratio": 0.5, "speedup": 0.5,
         "accuracy_change": 0.0, "significant": False, "verdict": "not significant"},
    ]  # tensorflow's nhwc cells have no nchw partner: no row


def test_layer_kinds_share(tmp_path: Path) -> None:
    results = tmp_path / "results"
    layers = [{"name": "conv1", "kind": "conv", "forward_seconds": 0.002, "backward_seconds": 0.004,
               "params": 100, "flops": 1000},
              {"name": "conv2", "kind": "conv", "forward_seconds": 0.003, "backward_seconds": 0.005,
               "params": 200, "flops": 3000},
              {"name": "fc1", "kind": "dense", "forward_seconds": 0.001, "backward_seconds": 0.001,
               "params": 300, "flops": 600}]
    make_bundle(results, cell_id="1a7e", params={"model": "alexnet"}, layers=layers)
    db = tmp_path / "w.duckdb"
    ingest([results], warehouse=db)
    rows = query(db, "SELECT kind, layers, forward_s, backward_s, total_s, share, backward_ratio, "
                     "params, flops FROM layer_kinds")
    # conv: 0.005 forward + 0.009 backward = 0.014 of 0.016 in all
    assert rows == [
        {"kind": "conv", "layers": 2, "forward_s": pytest.approx(0.005), "backward_s": pytest.approx(0.009),
         "total_s": pytest.approx(0.014), "share": pytest.approx(0.875), "backward_ratio": pytest.approx(1.8),
         "params": 300, "flops": 4000},
        {"kind": "dense", "layers": 1, "forward_s": 0.001, "backward_s": 0.001, "total_s": 0.002,
         "share": pytest.approx(0.125), "backward_ratio": 1.0, "params": 300, "flops": 600},
    ]


# -- partial and empty warehouses -------------------------------------------------------------


def test_a_single_run_gives_the_rows_it_can(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _cell(results, "only", [(100, 10, .8)], G1)
    db = tmp_path / "w.duckdb"
    ingest([results], warehouse=db)
    stats = query(db, "SELECT runs, train_s_median, train_s_ci_low, train_s_ci_level, train_s_cv, "
                      "train_s_noisy FROM cell_stats")
    assert stats == [{"runs": 1, "train_s_median": 10.0, "train_s_ci_low": None,
                      "train_s_ci_level": None, "train_s_cv": None, "train_s_noisy": None}]
    for view in ("thread_sweep", "batch_sweep", "epoch_sweep", "library_comparison", "worker_scaling",
                 "option_effect", "batch_lr_grid", "batch_resources", "layer_kinds"):
        assert query(db, f"SELECT * FROM {view}") == [], view
    best = query(db, "SELECT default_cell_id, best_cell_id, speedup, verdict FROM best_vs_default")
    assert best == [{"default_cell_id": "only", "best_cell_id": "only", "speedup": 1.0,
                     "verdict": "default is fastest"}]
    assert query(db, "SELECT cell_id, on_front FROM pareto_front") == [{"cell_id": "only", "on_front": True}]
    curve = query(db, "SELECT runs, test_accuracy_sd, test_accuracy_ci_low FROM epoch_convergence")
    assert curve == [{"runs": 1, "test_accuracy_sd": None, "test_accuracy_ci_low": None}]


# -- the macro mechanism ------------------------------------------------------------------------


def test_macros_exist_for_read_only_connections_and_stale_ones_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:
        wh.con.execute("CREATE MACRO old_matrun_macro(x) AS x")  # as if an older matrun made it
        listed = wh.con.execute(f"SELECT {OWNED_MACROS}()").fetchone()[0]
        wh.con.execute(f"CREATE OR REPLACE MACRO {OWNED_MACROS}() AS "
                       f"{[*listed, 'old_matrun_macro']}::VARCHAR[]")
        wh.con.execute("CREATE OR REPLACE MACRO matrun_views_digest() AS 'older'")
        wh.con.execute("CREATE MACRO users_own(x) AS x + 1")
    with open_warehouse(path):
        pass
    with open_warehouse(path, read_only=True) as wh:
        names = {row[0] for row in wh.con.execute(
            "SELECT function_name FROM duckdb_functions() WHERE function_type = 'macro' "
            "AND NOT internal").fetchall()}
    assert {name for name, _, _ in macro_sql()} <= names
    assert "old_matrun_macro" not in names and "users_own" in names
    # and the query path (read-only, external access off) can call them
    assert run_query("SELECT (median_ci([1, 2]::DOUBLE[])).level", warehouse=path)[1] == [(0.5,)]


def test_views_are_left_alone_when_current_and_rebuilt_when_not(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    touched = "matrun view: views/baseline.sql (touched)"
    with open_warehouse(path) as wh:
        wh.con.execute(f"COMMENT ON VIEW baseline IS '{touched}'")
    with open_warehouse(path) as wh:  # same SQL, everything there: nothing re-created
        comment = "SELECT comment FROM duckdb_views() WHERE view_name = 'baseline'"
        assert wh.con.execute(comment).fetchall() == [(touched,)]
        digest = wh.con.execute("SELECT matrun_views_digest()").fetchone()[0]
        wh.con.execute("CREATE OR REPLACE MACRO matrun_views_digest() AS 'stale'")
    with open_warehouse(path) as wh:  # another digest: all re-created
        assert wh.con.execute(comment).fetchall() == [("matrun view: views/baseline.sql",)]
        assert wh.con.execute("SELECT matrun_views_digest()").fetchone() == (digest,)


def test_every_macro_statement_is_recognised() -> None:
    macros = macro_sql()
    assert len({name for name, _, _ in macros}) == len(macros) >= 15
    con = duckdb.connect()  # what the macros read (caches_match: the runs and cache_state)
    con.execute("CREATE MACRO matrun_views_digest() AS 'd'")
    con.execute("CREATE TABLE runs (ingested_at TIMESTAMP)")
    con.execute("CREATE TABLE cache_state (digest VARCHAR, runs BIGINT, last_ingested_at TIMESTAMP)")
    for _, _, sql in macros:
        con.execute(sql)
