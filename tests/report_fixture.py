"""A warehouse with rows in every study view, for the report's tests (HTML and browser).

Sweep ``study``, every run written by ``bundle_factory.make_bundle`` (no framework runs).
Base settings: torch / lenet5 / fashion-mnist / cpu, batch 64, sgd 0.01, one epoch.

    threads 1, 2, 4, unset x batch 64 (4 runs each) and 128 (2 runs)   A6, heatmap, A1 default, A8
    threads 1, batch 64: epochs 2 and 4 (2 runs, an epoch record each)   A7, B7
    threads 1, batch 64 / 128: lr 0.1, and lr 1.0 that diverges         A9-A10
    threads 1, batch 64: variant cpu-openblas (in an image), oneDNN off  A4-A5, options
    threads 1, batch 64: layout nhwc                                     options (E)
    resnet18 on the GPU: 1, 2, 4 GPUs at 64 images per GPU               A3 / B4 scaling
    inference on the GPU under a memory limit: batch 32, 128, 512 (oom)  B2, A11, B1
    layer_profile: four layers                                           D / E layers
    phases sampled (build_study_warehouse only): torch and jax (fused) at  C: iteration_model
      1 worker, torch at 2 workers with an all-reduce calibration,          and iteration_scaling
      a hostile cell
    a hostile cell: model, optimizer, dataset, host, library and error tail are attacks
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from bundle_factory import make_bundle, patch_events, read_json
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.warehouse.db import open_warehouse
from matrun.warehouse.ingest import ingest

MiB = 2**20
SWEEP = "study"
# Attacks on the page: each would run script (alert, or set window.__xss) if it were markup.
XSS_SCRIPT = "<script>alert(1)</script><script>window.__xss=1</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)><img src=y onerror=window.__xss=2>'
XSS_HOSTNAME = "<svg onload=window.__xss=3>evil-host"
XSS_LIB = "<img src=z onerror=window.__xss=4>"
FORMULA = '=HYPERLINK("http://evil.example","click")'
TAIL_FORMULA = "@SUM(1+1) crashed"
IMAGE_TAG = "matrun/torch:cpu-openblas-0123456789ab"
BASE: dict[str, Any] = {"threads": "unset", "epochs": 1}


def _epoch(seconds: float, accuracy: float | None, train_acc: float = 0.7) -> dict[str, Any]:
    return {"train_loss": 0.5, "train_accuracy": train_acc, "test_loss": 0.5,
            "test_accuracy": accuracy, "epoch_seconds": seconds, "test_seconds": 1.0}


def _result(run_dir: Path, **changes: Any) -> None:
    result = read_json(run_dir / "result.json")
    result.update(changes)
    write_json_atomic(run_dir / "result.json", result)


def _cell(results: Path, cell_id: str, runs: Sequence[tuple[float, float, float | None]],
          params: dict[str, Any], *, sweep: str = SWEEP, **kwargs: Any) -> list[Path]:
    """Runs of (throughput, train s, accuracy), one epoch each."""
    dirs = []
    for repeat, (throughput, seconds, accuracy) in enumerate(runs):
        dirs.append(make_bundle(results, sweep=sweep, cell_id=cell_id, repeat=repeat,
                                params=params, throughput=throughput,
                                epochs=(_epoch(seconds, accuracy),), **kwargs))
    return dirs


def write_study_bundles(results: Path) -> None:
    """Write every bundle of the study sweep under ``results``."""
    # A6 threads x A8 batch; "unset" at batch 64 is the framework-default cell (A1)
    speed = {"1": 100.0, "2": 180.0, "4": 300.0, "unset": 120.0}
    for threads, base in speed.items():
        for batch, runs, scale in ((64, 4, 1.0), (128, 2, 1.3)):
            params = {**BASE, "threads": threads if threads == "unset" else int(threads),
                      "batch_size": batch}
            cell = f"t{threads}-b{batch}"
            _cell(results, cell, [(base * scale + 3 * r, 60.0 / (base * scale / 100) + 0.2 * r,
                                   0.80 + 0.005 * r - (0.02 if batch == 128 else 0.0))
                                  for r in range(runs)], params)
    # A7: longer training of threads 1 / batch 64
    for epochs in (2, 4):
        for repeat in range(2):
            make_bundle(results, sweep=SWEEP, cell_id=f"t1-b64-e{epochs}", repeat=repeat,
                        params={**BASE, "threads": 1, "epochs": epochs}, throughput=100.0 + repeat,
                        epochs=tuple(_epoch(60.0 + repeat, 0.80 + 0.03 * e + 0.01 * repeat, 0.7 + 0.04 * e)
                                     for e in range(epochs)))
    # A9-A10: learning rates; 1.0 diverges
    for batch in (64, 128):
        _cell(results, f"t1-b{batch}-lr01", [(110.0, 55.0, 0.83)],
              {**BASE, "threads": 1, "batch_size": batch, "lr": 0.1})
        run = make_bundle(results, sweep=SWEEP, cell_id=f"t1-b{batch}-lr1", throughput=115.0,
                          params={**BASE, "threads": 1, "batch_size": batch, "lr": 1.0},
                          epochs=(_epoch(20.0, None),))
        patch_events(run, "summary", diverged=True, accuracy=None)
    # A4-A5 libraries (one in a docker image), and oneDNN off
    for repeat, run in enumerate(_cell(results, "t1-openblas", [(70.0, 85.0, 0.80), (72.0, 84.0, 0.80)],
                                       {**BASE, "threads": 1, "variant": "cpu-openblas"})):
        patch_events(run, "probe", blas_loaded={"provider": "openblas", "version": "0.3.21"})
        _result(run, executor="docker",
                image={"tag": IMAGE_TAG, "id": "sha256:" + "ab" * 32, "repo_digests": []})
    _cell(results, "t1-onednn-off", [(60.0, 95.0, 0.80), (61.0, 94.0, 0.80)],
          {**BASE, "threads": 1, "onednn": False})
    # E: layout
    _cell(results, "t1-nhwc", [(104.0, 58.0, 0.81), (106.0, 57.0, 0.81)],
          {**BASE, "threads": 1, "layout": "nhwc"})
    # A3 / B4: GPUs at a fixed per-GPU batch
    gpu = {"model": "resnet18", "device": "gpu", "variant": "cuda", "epochs": 1, "threads": "unset"}
    for gpus, throughput in ((1, 1000.0), (2, 1800.0), (4, 3000.0)):
        _cell(results, f"gpu{gpus}", [(throughput, 40.0 / gpus * 1.1, 0.5)],
              {**gpu, "gpus": gpus, "batch_size": 64 * gpus})
    # B2 / A11 / B1: inference on a GPU under a memory limit; the largest batch runs out
    inference = {"device": "gpu", "variant": "cuda", "gpus": 1, "mode": "inference",
                 "dataset": "synthetic", "epochs": None, "optimizer": None, "lr": None,
                 "memory_limit": 1024 * MiB}
    for batch, throughput, device_mib, rss in ((32, 2000.0, 100, 300), (128, 6000.0, 300, 600)):
        run = make_bundle(results, sweep=SWEEP, cell_id=f"inf-b{batch}",
                          params={**inference, "batch_size": batch}, throughput=throughput,
                          epochs=(), monitor=((0.2, 90.0, 10.0, 1.0, (rss - 100) * MiB),
                                              (0.4, 110.0, 10.0, 3.0, rss * MiB)))
        patch_events(run, "summary", train_seconds=None, test_seconds=None, accuracy=None,
               inference_seconds=4.0 * 32 / batch, peak_device_memory_bytes=device_mib * MiB)
    make_bundle(results, sweep=SWEEP, cell_id="inf-b512", params={**inference, "batch_size": 512},
                status="oom", exit_code=-9, epochs=(), error_tail="Killed: out of memory")
    # D / E: layer-wise times
    layers = [{"name": "conv1", "kind": "conv", "forward_seconds": 0.004, "backward_seconds": 0.008},
              {"name": "relu1", "kind": "relu", "forward_seconds": 0.0005, "backward_seconds": 0.0005},
              {"name": "conv2", "kind": "conv", "forward_seconds": 0.006, "backward_seconds": 0.012},
              {"name": "fc1", "kind": "linear", "forward_seconds": 0.001, "backward_seconds": 0.002}]
    for repeat in range(2):
        make_bundle(results, sweep=SWEEP, cell_id="layers", repeat=repeat, layers=layers,
                    params={**BASE, "threads": 1, "layer_profile": True})
    write_hostile_bundles(results)


def write_hostile_bundles(results: Path) -> None:
    """A cell whose every text is an attack, in a two-setting thread sweep, plus a failed run."""
    hostile = {**BASE, "model": XSS_SCRIPT, "optimizer": XSS_ATTR, "dataset": FORMULA}
    for threads, throughput in ((1, 90.0), (2, 150.0)):
        for run in _cell(results, f"evil-t{threads}", [(throughput, 40.0, 0.6), (throughput + 2, 41.0, 0.62)],
                         {**hostile, "threads": threads}, hostname=XSS_HOSTNAME,
                         mismatches=[f"threads: asked {threads}, in force 1 {XSS_ATTR}"]):
            patch_events(run, "probe", libraries=[{"name": XSS_LIB, "path": "/opt/secret/lib/<b>libx</b>.so",
                                             "version": XSS_ATTR}])
    failed = results / SWEEP / "evil-t4" / "0-1"
    make_bundle(results, sweep=SWEEP, cell_id="evil-t4", params={**hostile, "threads": 4},
                status="failed", exit_code=1, hostname=XSS_HOSTNAME,
                error_tail=f"{TAIL_FORMULA}\nFile \"{failed}/harness.py\", line 1\n{XSS_SCRIPT}\n{XSS_ATTR}")


# Study C (docs/MODEL.md): cells whose sampled steps carry their phases.  Every number the
# tests expect follows from these: (step seconds after two 0.02 s warm-up steps, the indices
# of the sampled steps among them, each sampled step's phases).
PHASED: dict[str, Any] = {**BASE, "threads": 1, "dataset": "synthetic", "scaling": "weak",
                          "workers": 1}
PHASE_TORCH = {"forward": 0.004, "backward": 0.006, "update": 0.001}   # 11 ms of a 12 ms step
PHASE_JAX = {"forward+backward+update": 0.0081}                        # 8.1 ms of an 8 ms step
PHASE_W2 = {"forward": 0.0044, "backward": 0.006, "exchange": 0.004, "update": 0.001}  # 15.4 of 16.5
# The 2-worker cell's all-reduce: exactly 0.5 ms + bytes / 1e9 B/s, so its fit is exact.
CALIBRATION = [[n, 0.0005 + n / 1e9] for n in (4096, 65536, 1048576, 4194304)]
GRADIENT_BYTES = 2_000_000


def _sampled(run_dir: Path, phases: dict[int, dict[str, float]], **summary: Any) -> None:
    """Mark the steps ``phases`` names as sampled, write their phases records before the
    summary and add ``summary`` (and the summary's phases block) to the summary record."""
    path = run_dir / "events.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    seconds = {}
    for record in lines:
        if record.get("type") == "step" and record["step"] in phases:
            record["phase"] = "sampled"
            seconds[record["step"]] = record["seconds"]
    at = next(i for i, r in enumerate(lines) if r.get("type") == "summary")
    lines[at:at] = [{"type": "phases", "step": step, "seconds": seconds[step], "phases": parts}
                    for step, parts in phases.items()]
    lines[at + len(phases)].update(phases={"every": 2, "sampled_steps": len(phases)}, **summary)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")


def write_phase_bundles(results: Path) -> None:
    """The cells of study C: phases sampled at 1 worker (torch, jax fused, a hostile cell) and
    at 2 workers (torch, with its all-reduce calibration)."""
    warm = (0.02, 0.02)
    cells = (
        ("ph-torch", {"framework": "torch"}, (0.010, 0.010, 0.012, 0.010, 0.012, 0.010),
         {4: PHASE_TORCH, 6: PHASE_TORCH}, 6400.0, {}),
        ("ph-jax", {"framework": "jax"}, (0.008, 0.008, 0.008, 0.008),
         {3: PHASE_JAX, 5: PHASE_JAX}, 8000.0, {}),
        ("ph-evil", {"framework": "torch", "model": XSS_SCRIPT, "dataset": FORMULA},
         (0.010, 0.012, 0.010), {3: PHASE_TORCH}, 6400.0, {}),
        ("ph-torch-w2", {"framework": "torch", "workers": 2}, (0.016, 0.0165, 0.016, 0.016),
         {3: PHASE_W2}, 8000.0,
         {"exchange": {"seconds_median": 0.004, "fraction_of_step": 0.25,
                       "calibration": {"points": CALIBRATION, "pattern": "ring all-reduce",
                                       "transport": "gloo", "workers": 2,
                                       "overlaps_backward": False}}}),
    )
    for cell_id, params, steps, phases, throughput, summary in cells:
        run = make_bundle(results, sweep=SWEEP, cell_id=cell_id, params={**PHASED, **params},
                          step_seconds=warm + steps, throughput=throughput,
                          images_per_step=64 * (params.get("workers") or 1),
                          epochs=(_epoch(1.0, 0.5),))
        _sampled(run, phases, gradient_bytes=GRADIENT_BYTES, **summary)


def record_image(warehouse: Path) -> None:
    """The images table row of the image the openblas cell ran in (as `matrun build` would)."""
    with open_warehouse(warehouse) as wh:
        wh.con.execute(
            "INSERT INTO images (tag, image_id, framework, variant, content_hash, recipe_hash, "
            "base_image, size_bytes, build_seconds, recorded_at, framework_version, python, cuda, "
            "cudnn, blas, onednn, openmp) VALUES (?, ?, 'torch', 'cpu-openblas', '0123456789ab', "
            "'feedc0de', 'debian:bookworm', ?, 120.5, TIMESTAMPTZ '2026-11-20 10:00:00+00', "
            "'2.13.0', '3.11.2', NULL, NULL, 'openblas 0.3.21', 'v3.1', 'libgomp')",
            [IMAGE_TAG, "sha256:" + "ab" * 32, 900 * MiB])


def build_study_warehouse(root: Path) -> Path:
    """Write the bundles under ``root/results``, ingest them and return the warehouse."""
    write_study_bundles(root / "results")
    write_phase_bundles(root / "results")
    path = root / "study.duckdb"
    report = ingest([root / "results"], warehouse=path)
    assert not report.skipped, report.skipped
    record_image(path)
    return path
