"""BLAS variants side by side: the same PyTorch LeNet-5 training cell on MKL (PyPI torch
2.13.0, variant ``cpu``) and on OpenBLAS, BLIS and the reference BLAS (Debian's python3-torch
1.13.1, variants ``cpu-openblas`` / ``cpu-blis`` / ``cpu-reference``, images/torch/Dockerfile.debian).

Default: through the product, `matrun sweep --executor docker` on a study file with
``variant`` as its axis (the images must be built: `matrun build`); repeats run round-robin
over the variants.  ``--image VARIANT=TAG`` (any number) runs the cells directly instead, one
container each, started with the docker executor's own ``container_kwargs`` (for images
built by hand, e.g. `docker build -f images/torch/Dockerfile.debian --build-arg BLAS=blis`),
rotating the order of the variants in each repeat.

For each variant: training images/s (the harness's median over timed steps, the mean of the
repeats), training seconds (summary ``train_seconds``: the epochs' wall time, evaluation
excluded), test accuracy, the torch version and the BLAS the probe found loaded, and the
ratios of images/s and time to the fastest variant.  oneDNN is off by default so that the
convolutions and dense layers run as im2col + GEMM through the BLAS (with it on, oneDNN's
own kernels run in every variant; ``--onednn`` to see that).

    python benchmarks/blas_variants.py [--threads 1] [--repeats 2] [--epochs 1 | --steps N]
        [--batch 64] [--cpuset 0] [--onednn] [--variants cpu,cpu-openblas,cpu-blis,cpu-reference]
        [--image cpu-openblas=matrun-dev/torch-debian:openblas ...]

Needs a Docker engine and Debian's dataset-fashion-mnist (--data, default /usr/share/datasets).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from matrun.warehouse.bundles.layout import EVENTS, SPEC
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.runner.datasets.staging import default_data_dir

MATRUN = str(Path(sys.executable).with_name("matrun"))
VARIANTS = ("cpu", "cpu-openblas", "cpu-blis", "cpu-reference")

STUDY = """
[sweep]
name = "blas-variants-bench"
results = "results"
warehouse = "matrun.duckdb"
data_dir = "{data}"
executor = "docker"
repeats = {repeats}
timeout = {timeout}

[fixed]
framework = "torch"
model = "lenet5"
dataset = "fashion-mnist"
{length}
batch_size = {batch}
lr = 0.01
optimizer = "sgd"
momentum = 0.9
warmup_steps = {warmup}
threads = {threads}
onednn = {onednn}
cpuset = "{cpuset}"
onednn_check = false

[axes]
variant = [{variants}]
"""


def fixed_params(a: argparse.Namespace) -> dict[str, Any]:
    """The cell's parameters (variant ``cpu``), as the matrix parser completes them."""
    from matrun.runner.planning.matrix import parse_matrix

    fixed = {"framework": "torch", "model": "lenet5", "dataset": "fashion-mnist", "batch_size": a.batch,
             "lr": 0.01, "optimizer": "sgd", "momentum": 0.9, "warmup_steps": a.warmup, "threads": a.threads,
             "onednn": a.onednn, "cpuset": a.cpuset, "onednn_check": False}
    fixed.update({"iterations": a.steps} if a.steps else {"epochs": a.epochs})
    (cell,) = parse_matrix({"fixed": fixed}, path=Path("matrix.toml")).cells
    return dict(cell.values)


def read_run(run_dir: Path) -> dict[str, Any]:
    """Variant, images/s, training seconds, accuracy and the probe's findings of one bundle."""
    spec = json.loads((run_dir / SPEC).read_text())
    events = [json.loads(line) for line in (run_dir / EVENTS).read_text().splitlines() if line.strip()]
    summary = next((e for e in events if e["type"] == "summary"), None)
    probe = next((e for e in events if e["type"] == "probe"), {})
    if summary is None:
        raise SystemExit(f"{run_dir}: no summary event (the run failed; see its stderr.log)")
    loaded = probe.get("blas_loaded") or {}
    blas = " ".join(str(x) for x in (loaded.get("provider"), loaded.get("version")) if x)
    if not blas:  # PyPI torch: MKL is linked statically, only its build information says so
        blas = next((part.split("=", 1)[1] for part in probe.get("build", "").replace(",", " ").split()
                     if part.startswith("BLAS_INFO=")), "?") + " (BLAS_INFO)"
    return {"variant": spec["params"]["variant"], "throughput": summary["throughput"],
            "train_seconds": summary["train_seconds"], "accuracy": summary["accuracy"],
            "torch": probe.get("framework_version"), "blas": blas, "mismatches": probe.get("mismatches", [])}


def through_sweep(a: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    length = f"iterations = {a.steps}" if a.steps else f"epochs = {a.epochs}"
    study = work / "blas-variants.toml"
    study.write_text(STUDY.format(data=a.data, repeats=a.repeats, timeout=a.timeout, length=length, batch=a.batch,
                                  warmup=a.warmup, threads=a.threads, onednn=str(a.onednn).lower(),
                                  cpuset=a.cpuset, variants=", ".join(f'"{v}"' for v in a.variants)))
    cmd = [MATRUN, "sweep", str(study), "--executor", "docker", "--force"]
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=work)  # its progress and any error go straight to the terminal
    if done.returncode != 0:
        raise SystemExit(f"matrun sweep exited {done.returncode}")
    runs = sorted(p.parent for p in (work / "results").rglob(EVENTS))
    return [read_run(r) for r in runs]


def direct(a: argparse.Namespace, work: Path, images: dict[str, str]) -> list[dict[str, Any]]:
    """Each cell in its own container of ``images[variant]``, as the docker executor starts it."""
    from matrun.runner.environments.engine import connect
    from matrun.runner.environments.home import stage_harness
    from matrun.runner.executors.docker import NOBODY, CellLabels, ImageRef, cell_user, container_kwargs

    client = connect()
    base = fixed_params(a)
    refs = {}
    for variant in a.variants:
        tag = images.get(variant) or newest_image(client, variant)
        found = client.images.get(tag)
        refs[variant] = ImageRef(tag=tag, image_id=found.id, repo_digests=tuple(found.attrs.get("RepoDigests") or ()),
                                 content_hash="", env=tuple((found.attrs.get("Config") or {}).get("Env") or ()))
        print(f"{variant}: {tag} ({found.id[:19]})", flush=True)
    stage = stage_harness()
    out = []
    for repeat in range(a.repeats):
        order = list(a.variants[repeat % len(a.variants):]) + list(a.variants[:repeat % len(a.variants)])
        for variant in order:
            params = {**base, "variant": variant}
            run_dir = work / variant / str(repeat)
            run_dir.mkdir(parents=True)
            cell_id = hashlib.sha256(variant.encode()).hexdigest()[:16]
            write_json_atomic(run_dir / SPEC, {"schema_version": 1, "sweep": "blas-variants-bench",
                                               "cell_id": cell_id, "repeat": repeat,
                                               "attempt": 1, "env_id": variant, "data_dir": str(a.data),
                                               "params": params})
            user = cell_user(run_dir)  # as the executor: the bundle's owner, or nobody for root's
            if user == f"{NOBODY}:{NOBODY}":
                os.chown(run_dir, NOBODY, NOBODY)
            kwargs = container_kwargs(params, image=refs[variant], run_dir=run_dir, data_dir=a.data, stage=stage,
                                      labels=CellLabels("blas-variants-bench", cell_id, f"{repeat}-1"), user=user)
            container = client.containers.create(**kwargs)
            try:
                container.start()
                code = container.wait(timeout=a.timeout).get("StatusCode")
                if code != 0:
                    tail = container.logs().decode("utf-8", "replace")[-3000:]
                    raise SystemExit(f"{variant} (repeat {repeat}) exited {code}:\n{tail}")
            finally:
                container.remove(force=True)
            run = read_run(run_dir)
            print(f"  repeat {repeat} {variant:<14} {run['throughput']:>8.0f} img/s {run['train_seconds']:>8.2f} s",
                  flush=True)
            out.append(run)
    return out


def newest_image(client: Any, variant: str) -> str:
    """The newest image matrun built for torch ``variant`` from its current recipe."""
    from matrun.runner.environments.contexts import LABEL, recipe_hash

    labels = [f"{LABEL}.framework=torch", f"{LABEL}.variant={variant}",
              f"{LABEL}.recipe-hash={recipe_hash('torch', variant)}"]
    found = sorted(client.images.list(filters={"label": labels}), key=lambda im: im.attrs.get("Created", ""))
    if not found or not found[-1].tags:
        raise SystemExit(f"no image of torch:{variant} from the current recipe: "
                         f"`matrun build`, or --image {variant}=TAG")
    return found[-1].tags[0]


def report(runs: list[dict[str, Any]], variants: list[str]) -> None:
    rows = []
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        rows.append({**mine[-1], "n": len(mine),
                     "throughput": statistics.mean(r["throughput"] for r in mine),
                     "train_seconds": statistics.mean(r["train_seconds"] for r in mine),
                     "spread": (max(r["throughput"] for r in mine) - min(r["throughput"] for r in mine))
                     / statistics.mean(r["throughput"] for r in mine),
                     "accuracy": statistics.mean(r["accuracy"] for r in mine)})
    best = max(r["throughput"] for r in rows)
    fastest = min(r["train_seconds"] for r in rows)
    print(f"\n{'variant':<14} {'torch':<10} {'BLAS loaded':<22} {'n':>2} {'img/s':>8} {'spread':>7} "
          f"{'train s':>8} {'acc':>6} {'img/s / best':>12} {'time / best':>11}")
    for r in rows:
        print(f"{r['variant']:<14} {str(r['torch']):<10} {r['blas']:<22} {r['n']:>2} {r['throughput']:>8.0f} "
              f"{r['spread']:>7.1%} {r['train_seconds']:>8.2f} {r['accuracy']:>6.3f} "
              f"{r['throughput'] / best:>12.3f} {r['train_seconds'] / fastest:>11.2f}")
        for m in r["mismatches"]:
            print(f"{'':<14} mismatch: {m}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="timed steps instead of whole epochs")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cpuset", default="0")
    parser.add_argument("--onednn", action="store_true", help="oneDNN on (default off: the BLAS does the GEMMs)")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--image", action="append", default=[], metavar="VARIANT=TAG",
                        help="run directly in this image instead of through `matrun sweep`")
    parser.add_argument("--data", type=Path, default=default_data_dir())
    a = parser.parse_args()
    a.variants = [v for v in a.variants.split(",") if v]
    images = dict(item.split("=", 1) for item in a.image)
    length = f"{a.steps} steps" if a.steps else f"{a.epochs} epoch(s)"
    print(f"LeNet-5, Fashion-MNIST, threads {a.threads}, cpuset {a.cpuset or '-'}, batch {a.batch}, {length} "
          f"({a.warmup} warm-up steps untimed), oneDNN {'on' if a.onednn else 'off'}, {a.repeats} repeats", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="matrun-blas-") as tmp:
        runs = direct(a, Path(tmp), images) if images else through_sweep(a, Path(tmp))
    report(runs, a.variants)
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
