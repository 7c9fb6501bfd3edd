"""How long does `matrun report` take on a big warehouse, and how heavy is the site?

    python benchmarks/report_build.py [--runs 1000] [--keep DIR]

It fabricates RUNS result bundles spread over the studies' sweeps (threads x batch size for
three frameworks, training length, batch x learning rate with diverging runs, math
libraries and options, GPU scaling, inference batch sizes up to out-of-memory, layer
profiles, long convergence runs; a few percent of runs fail or time out), ingests them into
a fresh warehouse, then times ``build_report`` (reading the views, rendering, writing) and
prints the page weight: the whole site, each page, and with and without plotly.js.  The
bundles are made by ``tests/bundle_factory.py`` (the tests' factory, which writes the exact
on-disk format), so run it from a checkout with matrun installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bundle_factory import DEFAULT_PARAMS, make_bundle  # noqa: E402

from matrun.reports.build import build_report  # noqa: E402
from matrun.reports.build import read_report_data  # noqa: E402
from matrun.reports.site import render_site  # noqa: E402
from matrun.warehouse.db import open_warehouse  # noqa: E402
from matrun.warehouse.ingest import ingest  # noqa: E402

MiB = 2**20
FRAMEWORKS = ("torch", "tensorflow", "mxnet")
LAYOUT = {"torch": "nchw", "tensorflow": "nhwc", "mxnet": "nchw"}


def cells() -> Iterator[tuple[str, dict[str, Any], int]]:
    """(sweep, params, repeats) of every cell, in the order the sweeps would run them."""
    base = {"threads": "unset", "epochs": 1}
    for fw in FRAMEWORKS:  # A6 x A8 (and A1: threads unset at batch 64)
        for threads in ("unset", 1, 2, 4, 8):
            for batch in (32, 64, 128, 256):
                yield "threads-batch", {**base, "framework": fw, "layout": LAYOUT[fw],
                                        "threads": threads, "batch_size": batch}, 3
    for fw in FRAMEWORKS:  # A7
        for epochs in (1, 2, 4, 8):
            yield "epochs", {**base, "framework": fw, "layout": LAYOUT[fw], "threads": 2,
                             "epochs": epochs}, 4
    for batch in (32, 64, 128, 256):  # A9-A10
        for lr in (0.001, 0.01, 0.1, 1.0):
            for epochs in (1, 2):
                yield "lr-grid", {**base, "threads": 2, "batch_size": batch, "lr": lr,
                                  "epochs": epochs}, 2
    for model in ("lenet5", "alexnet"):  # A4-A5 and E options
        for variant in ("cpu", "cpu-openblas", "cpu-blis", "cpu-reference"):
            for onednn in (True, False):
                yield "libraries", {**base, "threads": 2, "model": model, "variant": variant,
                                    "onednn": onednn}, 4
        for option in ({"layout": "nhwc"}, {"precision": "bf16"}, {"conv_algo": "autotune"}):
            yield "libraries", {**base, "threads": 2, "model": model, **option}, 4
    for fw in ("torch", "mxnet"):  # A3 / B4-B6
        for gpus in (1, 2, 4, 8):
            for per_gpu in (64, 128):
                yield "scaling", {**base, "framework": fw, "model": "resnet18", "device": "gpu",
                                  "variant": "cuda", "gpus": gpus, "batch_size": per_gpu * gpus}, 2
    for fw in FRAMEWORKS:  # B2 / A11 / B1
        for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            yield "inference", {"framework": fw, "layout": LAYOUT[fw], "device": "gpu",
                                "variant": "cuda", "gpus": 1, "mode": "inference",
                                "dataset": "synthetic", "epochs": None, "optimizer": None,
                                "lr": None, "batch_size": batch, "memory_limit": 8192 * MiB}, 2
    for fw in FRAMEWORKS:  # D / E layers
        for model in ("alexnet", "resnet18"):
            yield "layers", {**base, "framework": fw, "layout": LAYOUT[fw], "model": model,
                             "threads": 2, "layer_profile": True}, 2
    for fw in FRAMEWORKS:  # B7: five repeats of ten epochs
        yield "convergence", {**base, "framework": fw, "layout": LAYOUT[fw], "threads": 2,
                              "dataset": "cifar10", "epochs": 10}, 5


def _layers(model: str) -> list[dict[str, Any]]:
    n = 8 if model == "alexnet" else 20
    out = []
    for i in range(n):
        kind = "conv" if i % 3 != 2 else ("relu" if i % 2 else "linear")
        f = 0.002 * (1 + i % 4) if kind == "conv" else 0.0003
        out.append({"name": f"{kind}{i}", "kind": kind, "forward_seconds": f, "backward_seconds": 2 * f,
                    "params": 1000 * i, "flops": 10**6 * i})
    return out


def write_bundles(results: Path, runs: int, seed: int = 7) -> int:
    """Write ``runs`` bundles (cycling through the cells' repeats) and return how many."""
    rng = random.Random(seed)
    plan = [(sweep, params, r) for sweep, params, repeats in cells() for r in range(repeats)]
    extra = [(s, p, r) for s, p, r in plan if s in ("convergence", "libraries")]
    more = 0
    while len(plan) < runs * 1.3:  # more repeats of the convergence and library cells
        more += 1
        plan += [(s, p, r + 10 * more) for s, p, r in extra]
    # A cell is its parameters: one that an earlier sweep already ran is skipped, as a
    # sweep skips cells that are done.
    seen: set[tuple[str, int]] = set()
    unique = []
    for sweep, params, repeat in plan:
        resolved = {**DEFAULT_PARAMS, **params}
        cell_id = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:16]
        if (cell_id, repeat) not in seen:
            seen.add((cell_id, repeat))
            unique.append((sweep, params, repeat, cell_id))
    written = 0
    for sweep, params, repeat, cell_id in unique[:runs]:
        batch = params.get("batch_size", 64)
        threads = params.get("threads")
        speed = 100.0 * (batch / 64) ** 0.3 * (min(int(threads), 4) if isinstance(threads, int) else 3)
        speed *= {"cpu-openblas": 0.7, "cpu-blis": 0.6, "cpu-reference": 0.1}.get(params.get("variant"), 1.0)
        speed *= (params.get("gpus") or 1) if params.get("device") == "gpu" else 1
        noise = rng.gauss(1.0, 0.08 if threads == 8 else 0.02)
        epochs_n = params.get("epochs") or 0
        epoch_s = 6000 / speed
        diverged = params.get("lr") == 1.0
        epochs = tuple({"train_loss": 0.5, "train_accuracy": 0.7, "test_loss": 0.5,
                        "test_accuracy": None if diverged else min(0.99, 0.75 + 0.03 * e - 0.01 * (batch / 64) + rng.gauss(0, 0.004)),
                        "epoch_seconds": epoch_s * noise, "test_seconds": 1.0}
                       for e in range(epochs_n))
        status = "ok"
        if params.get("mode") == "inference" and batch >= 1024:
            status = "oom"
        elif rng.random() < 0.03:
            status = rng.choice(["failed", "timeout"])
        monitor = [(0.5 * k, 100.0 * noise, 8.0, 0.5, int((200 + batch) * MiB * (1 + 0.1 * (k % 5))))
                   for k in range(1, 121)]
        run = make_bundle(results, sweep=sweep, cell_id=cell_id, repeat=repeat, params=params,
                          status=status, exit_code=0 if status == "ok" else 1,
                          throughput=speed * noise, epochs=epochs, monitor=monitor,
                          layers=_layers(params.get("model", "lenet5")) if params.get("layer_profile") else (),
                          error_tail="" if status == "ok" else f"Traceback …\nRuntimeError: {status} in cell {cell_id}",
                          step_seconds=[0.02, 0.02] + [64 / (speed * noise)] * 20)
        if diverged or params.get("mode") == "inference":
            _patch_summary(run, diverged, params)
        written += 1
    return written


def _patch_summary(run: Path, diverged: bool, params: dict[str, Any]) -> None:
    path = run / "events.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for record in lines:
        if record.get("type") == "summary":
            if diverged:
                record.update(diverged=True, accuracy=None)
            else:
                record.update(train_seconds=None, test_seconds=None, accuracy=None,
                              inference_seconds=2.0, peak_device_memory_bytes=(100 + params["batch_size"]) * MiB)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")


def weigh(site: Path) -> None:
    plotly = site / "assets" / "plotly.min.js"
    files = [p for p in site.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    html = sorted((p for p in files if p.suffix == ".html"), key=lambda p: p.name)
    csv = [p for p in files if p.suffix == ".csv"]
    print(f"site: {len(files)} files, {total / 2**20:.2f} MiB; without plotly.js "
          f"{(total - plotly.stat().st_size) / 2**20:.2f} MiB (plotly.min.js {plotly.stat().st_size / 2**20:.2f} MiB, "
          f"{len(html)} pages {sum(p.stat().st_size for p in html) / 2**20:.2f} MiB, "
          f"{len(csv)} CSV files {sum(p.stat().st_size for p in csv) / 2**20:.2f} MiB)")
    print("per page (HTML; a browser also loads plotly.min.js once and report.css):")
    for p in html:
        print(f"  {p.name:18s} {p.stat().st_size / 1024:9.1f} KiB   with plotly.js "
              f"{(p.stat().st_size + plotly.stat().st_size) / 2**20:6.2f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--keep", type=Path, help="write the warehouse and the site here, and keep them")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="matrun-report-build-") as tmp:
        root = args.keep or Path(tmp)
        results, warehouse, site = root / "results", root / "bench.duckdb", root / "site"
        start = time.perf_counter()
        runs = write_bundles(results, args.runs)
        generate_s = time.perf_counter() - start
        start = time.perf_counter()
        report = ingest([results], warehouse=warehouse)
        ingest_s = time.perf_counter() - start
        assert not report.skipped, report.skipped[:3]

        start = time.perf_counter()
        build_report(warehouse=warehouse, out_dir=site)
        build_s = time.perf_counter() - start
        # The same build in its parts: reading the views, rendering the pages.
        start = time.perf_counter()
        with open_warehouse(warehouse, read_only=True) as wh:
            data = read_report_data(wh.con)
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        files = render_site(data)
        render_s = time.perf_counter() - start

        print(f"{runs} runs ({len(data.runs)} in the warehouse, "
              f"{data.runs.select('sweep', 'cell_id').unique().height} cells, {len(data.sweeps)} sweeps): "
              f"generated in {generate_s:.1f} s, ingested in {ingest_s:.1f} s")
        print(f"build_report: {build_s:.2f} s (read the views {read_s:.2f} s, render {render_s:.2f} s, "
              f"write the rest); {sum(1 for f in files if f.endswith('.html'))} pages")
        weigh(site)


if __name__ == "__main__":
    main()
