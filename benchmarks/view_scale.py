"""Do the warehouse's views answer fast on a big warehouse?  Run from the repository root:

    python benchmarks/view_scale.py [--runs 100000] [--repeat 5] [--only NAME ...]
                                    [--keep DIR | --reuse DIR]

It builds a warehouse of RUNS synthetic runs straight from rows (no bundles: one INSERT per
table, then the view caches filled as an ingest of them all would, timed), times what an
ingest of one more run spends refreshing the caches, then times, each in a fresh read-only
``open_warehouse``, every view of ``warehouse/views`` (``SELECT count(*) FROM (SELECT * FROM
<view>)``) and the queries matrun itself runs on them: each read of ``matrun report``
(``reports/data.py``; the study views as the report reads them, whole and ordered, for every
sweep and for one), ``matrun compare`` (two sweeps), ``matrun advise`` (all, one sweep), the
sweep's skip list and estimates (``cell_status``, ``cell_durations``, the ``run_overview``
medians of ``matrun studies``).  It prints the median milliseconds of REPEAT timings of each
(after one untimed read of each, so what is timed is a warm reader), and whether it is under
100 ms.  Run with an older matrun (before the view caches) it measures that one: the before
numbers.  ``--keep`` keeps the warehouse, ``--reuse`` times one kept before (refreshing its
caches first when they are out of date).

How the data are made.  The cells are the real ones: every profile of every study file in
``studies/`` is planned by matrun's own planner (``plan``: every parameter resolved, as in a
bundle's ``spec.json``), which gives 573 distinct cells and about 2,300 runs.  That
catalogue is run over and over by "hosts" (campaigns) until RUNS runs exist: each host has
its own environments (env_id ``<framework>-<variant>-h<NN>``, so its own cell ids and
configurations, as a real second machine has), its own CPU count (4 to 64), and runs each
study profile as one sweep (``<sweep name>-h<NN>``), skipping the cells an earlier sweep of
the host already ran, with the study's own repeats.  About 3 % of runs fail or time out
(and are attempted again, successfully), inference cells with large batches under a memory
limit run out of memory, training with lr >= 0.5 diverges.  Throughput follows a simple
model (threads up to the host's CPUs then over-subscription, batch size, GPUs and workers
at 85 % efficiency, BLAS variant, oneDNN, layout, precision, convolution algorithm) with 3 %
noise; train time is the images over the throughput; accuracy grows with epochs.  Each run
has realistic JSON records (params, host, a 2 KiB probe with its libraries and BLAS, data,
model, summary with exchange times for multi-worker cells, monitor aggregates), 20 steps
(2 warm-up), one row per epoch, 30 monitor samples, and, for layer-profile cells, one row
per layer.  Every study is registered (``register_study``: its real findings) with the
cells of every host under each profile: the most the ``findings`` view can be asked to
judge (a warehouse written from several hosts keeps only the last host's registration).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pyarrow as pa

from matrun.reports import data as reads
from matrun.runner.planning.identity import cell_id as identity_cell_id
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.planning.studies import study_files
from matrun.warehouse.advise import ADVISE_SQL
from matrun.warehouse.compare import COMPARE_SQL, matching_keys
from matrun.warehouse.db import open_warehouse, view_sql
from matrun.warehouse.findings import BASE_PROFILE, register_study
from matrun.warehouse.rows import RUNS_SCHEMA

try:
    from matrun.warehouse import materialise
except ImportError:  # a matrun before the view caches: the before numbers
    materialise = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MS = 100.0
STEPS_PER_RUN = 20
WARMUP_STEPS = 2
MONITOR_SAMPLES = 30
CPU_COUNTS = (4, 8, 16, 32, 64)
MiB = 2**20
T0 = datetime(2026, 1, 5, 8, 0, 0)

MODEL_SPEED = {"lenet5": 9000.0, "alexnet": 300.0, "resnet18": 120.0, "resnet50": 40.0, "vgg16": 25.0}
MODEL_SIZE = {"lenet5": (61706, 833040), "alexnet": (61_100_840, 714_188_480),
              "resnet18": (11_689_512, 1_818_558_976), "resnet50": (25_557_032, 4_111_514_624),
              "vgg16": (138_357_544, 15_470_264_320)}
VARIANT_SPEED = {"cpu-openblas": 0.7, "cpu-blis": 0.6, "cpu-reference": 0.1, "cpu-mkl": 1.1}
BLAS = {"cpu": "openblas", "cpu-openblas": "openblas", "cpu-blis": "blis", "cpu-mkl": "mkl",
        "cpu-reference": "reference", "cuda": "cublas"}


@dataclass(frozen=True)
class PlannedCell:
    """One cell of the catalogue: its sweep (study file and profile) and parameters."""

    study: str
    profile: str
    sweep: str
    repeats: int
    params: dict[str, Any]
    identity: dict[str, Any]


# -- the cells ---------------------------------------------------------------------------


def catalogue() -> tuple[list[PlannedCell], dict[str, Any]]:
    """Every profile's cells of every study file (planned by matrun), and the studies'
    declarations by study id."""
    cells, studies = [], {}
    for path in study_files(ROOT / "studies"):
        base = load_matrix(path)
        studies[base.study.id] = (base.study, str(path))
        for name in (None, *base.profiles):
            matrix = base if name is None else load_matrix(path, name)
            for cell in matrix.cells:
                cells.append(PlannedCell(base.study.id, name or BASE_PROFILE, matrix.sweep.name,
                                         matrix.sweep.repeats, dict(cell.values), dict(cell.identity)))
    return cells, studies


def _rand(*key: Any) -> random.Random:
    return random.Random(hashlib.blake2b(repr(key).encode(), digest_size=8).digest())


def throughput(p: dict[str, Any], cpus: int) -> float:
    """Images per second of a cell on a host with ``cpus`` CPUs (before noise)."""
    speed = MODEL_SPEED.get(p["model"], 200.0)
    speed *= (p["batch_size"] / 64) ** 0.3 if p.get("batch_size") else 1.0
    if p["device"] == "gpu":
        workers = max(p.get("workers") or 1, p.get("gpus") or 1) * (p.get("nodes") or 1)
        speed *= 20 * workers ** 0.93
    else:
        threads = p["threads"] if isinstance(p["threads"], int) else min(cpus, 8)
        speed *= min(threads, cpus) ** 0.8 / (1 + max(0, threads - cpus) * 0.15)
        speed *= VARIANT_SPEED.get(p["variant"], 1.0) * (1.0 if p["onednn"] else 0.6)
        speed *= (p.get("workers") or 1) ** 0.7
    speed *= {"nhwc": 0.9}.get(p["layout"], 1.0) * {"fp16": 1.6, "bf16": 1.3}.get(p["precision"], 1.0)
    speed *= 1.15 if p["conv_algo"] == "autotune" else 1.0
    speed *= {"tensorflow": 0.85, "mxnet": 0.95}.get(p["framework"], 1.0)
    return speed


def probe_json(framework: str, variant: str, env: str) -> str:
    """A probe record as a harness writes it (about 2 KiB), the same for every run of an env."""
    blas = BLAS.get(variant, "openblas")
    lib = f"/root/.cache/matrun/envs/{env}/lib/python3.11/site-packages"
    probe = {
        "framework": framework, "framework_version": {"torch": "2.3.1", "tensorflow": "2.16.1"}.get(framework, "1.9.1"),
        "python": "3.11.7",
        "in_force": {"threads": 4, "interop_threads": 4, "onednn": True, "device": "cpu", "gpus_visible": 0,
                     "env": {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4"},
                     "precision": "fp32", "layout": "nchw", "affinity": list(range(4))},
        "build": f"{framework} build: BLAS_INFO={blas}, LAPACK_INFO={blas}, USE_MKLDNN=ON, USE_OPENMP=ON",
        "libraries": [
            {"name": f"lib{blas}.so.0", "path": f"{lib}/{framework}/lib{blas}.so.0", "version": "0.3.27",
             "threads": 4, "user_api": "blas", "internal_api": blas},
            {"name": "libgomp.so.1.0.0", "path": "/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0", "threads": 4,
             "user_api": "openmp", "internal_api": "openmp"},
            {"name": "libscipy_openblas64_.so", "path": f"{lib}/numpy.libs/libscipy_openblas64_.so",
             "version": "0.3.27", "threads": 4, "user_api": "blas", "internal_api": "openblas"}],
        "blas_loaded": {"provider": blas, "path": f"{lib}/{framework}/lib{blas}.so.0", "source": "symbols",
                        "version": "0.3.27", "corename": "Haswell", "threading": "openmp"},
        "mismatches": [], "onednn_primitives": 91,
        "onednn_primitive_kinds": {"convolution": 12, "eltwise": 20, "pooling_v2": 10, "reorder": 23},
        "onednn_verbose_sample": ["dnnl_verbose,exec,cpu,convolution,x64:gemm:jit,forward_training,"
                                  "src_f32::blocked:abcd:f0 wei_f32::blocked:abcd:f0,,alg:convolution_direct,"
                                  "mb8_ic1oc6_ih28oh28kh5sh1dh0ph2_iw28ow28kw5sw1dw0pw2,41.79"] * 3,
    }
    return json.dumps(probe, sort_keys=True)


def host_runs(host: int, cells: list[PlannedCell]) -> Iterator[dict[str, Any]]:
    """The runs rows of one host running the whole catalogue, sweep after sweep."""
    cpus = CPU_COUNTS[host % len(CPU_COUNTS)]
    host_json = json.dumps({"cpu_count": cpus, "cpu_model": "AMD EPYC 7B13", "hostname": f"bench-h{host:02d}",
                            "matrun_version": "0.1.0", "mem_total_bytes": 128 * 2**30,
                            "os": "Linux 6.8.0", "python": "3.11.7"}, sort_keys=True)
    probes: dict[str, str] = {}
    done: set[str] = set()
    clock = T0 + timedelta(days=3 * host)
    for c in cells:
        p = c.params
        env = f"{p['framework']}-{p['variant']}-h{host:02d}"
        cid = identity_cell_id(c.identity, env)
        if cid in done:
            continue  # an earlier sweep of this host ran it: a sweep skips cells that are done
        done.add(cid)
        probe = probes.setdefault(env, probe_json(p["framework"], p["variant"], env))
        base = throughput(p, cpus)
        for repeat in range(c.repeats):
            rng = _rand(cid, repeat)
            attempts = ["failed" if rng.random() < 0.5 else "timeout"] if rng.random() < 0.03 else []
            for attempt, status in enumerate([*attempts, "ok"], start=1):
                row = run_row(c, p, cid, env, repeat, attempt, status, base, rng, cpus, clock)
                row["sweep"] = f"{c.sweep}-h{host:02d}"
                row.update(host=host_json, probe=probe)
                clock += timedelta(seconds=row["wall_seconds"] or 30)
                yield row


def run_row(c: PlannedCell, p: dict[str, Any], cid: str, env: str, repeat: int, attempt: int,
            status: str, base: float, rng: random.Random, cpus: int, clock: datetime) -> dict[str, Any]:
    """One runs row with its JSON records, as ingest would write it from a bundle."""
    inference = p["mode"] == "inference"
    if status == "ok" and inference and p.get("memory_limit") and p["batch_size"] >= 512:
        status = "oom"
    ok = status == "ok"
    speed = base * rng.gauss(1.0, 0.03)
    samples = (p.get("train_limit") or 60_000) if p["dataset"] != "synthetic" else (p.get("synthetic_train") or 2048)
    epochs = p.get("epochs") or 0
    iterations = p.get("iterations") or 0
    images = iterations * p["batch_size"] if iterations else samples * max(epochs, 1)
    diverged = ok and not inference and (p.get("lr") or 0) >= 0.5
    train_s = images / speed if ok and not inference else None
    test_s = 0.05 * train_s if train_s else None
    accuracy = (None if not ok or inference or diverged
                else min(0.99, 0.80 + 0.03 * min(max(epochs, 1), 6) - 0.01 * (p["batch_size"] / 256)
                         + rng.gauss(0, 0.004)))
    workers = max(p.get("workers") or 1, p.get("gpus") or 1) * (p.get("nodes") or 1)
    summary = {
        "accuracy": accuracy, "best_epoch": None, "diverged": diverged, "epochs_run": epochs if ok else None,
        "first_layer_backward": p.get("first_layer_backward"), "input_gradient_steps": 0,
        "input_pipeline": {"kind": p.get("input_pipeline") or "preloaded"},
        "inference_seconds": images / speed if ok and inference else None,
        "peak_device_memory_bytes": (200 + 3 * p["batch_size"]) * MiB if p["device"] == "gpu" and ok else None,
        "stopped_early": False, "test_seconds": test_s, "throughput": speed if ok else None,
        "time_to_first_step": 2.0 + rng.random(), "timed_steps": STEPS_PER_RUN - WARMUP_STEPS,
        "train_seconds": train_s, "warmup_steps": WARMUP_STEPS,
    }
    if workers > 1 and ok:
        summary["exchange"] = {"seconds_median": 0.004 * workers, "fraction_of_step": 0.02 * workers ** 0.5}
    rss = (300 + 2 * p["batch_size"]) * MiB * rng.uniform(0.95, 1.05)
    cpu_user = 100.0 * min(p["threads"] if isinstance(p["threads"], int) else 4, cpus) * rng.uniform(0.8, 0.95)
    monitor = {"cpu_system_avg": 8.0, "cpu_total_avg": cpu_user + 8.0, "cpu_user_avg": cpu_user,
               "interval_s": 0.5, "iowait_avg": 0.3, "rss_avg_bytes": rss, "rss_peak_bytes": int(rss * 1.2),
               "samples": MONITOR_SAMPLES}
    wall = (train_s or 10.0) + (test_s or 0.0) + 6.0 if ok else 12.0
    size = MODEL_SIZE.get(p["model"], (1_000_000, 10**8))
    mismatch = ["threads: asked 8, in force 4"] if p["threads"] == 8 and rng.random() < 0.1 else []
    return {
        "run_id": f"{cid}/{repeat}-{attempt}", "cell_id": cid,
        "repeat": repeat, "attempt": attempt, "env_id": env, "executor": "local", "status": status,
        "exit_code": 0 if ok else (137 if status == "oom" else 1),
        "error_tail": "" if ok else f"Traceback (most recent call last):\n  ...\nRuntimeError: {status}",
        "started_at": clock, "ended_at": clock + timedelta(seconds=wall), "wall_seconds": round(wall, 2),
        "params": json.dumps(p, sort_keys=True),
        "data": json.dumps({"classes": 10, "dataset": p["dataset"], "load_seconds": 0.34,
                            "shape": p.get("synthetic_shape") or [1, 28, 28], "test_size": 10000,
                            "train_size": samples}, sort_keys=True),
        "model": json.dumps({"flops": size[1], "name": p["model"], "parameters": size[0]}, sort_keys=True),
        "summary": json.dumps(summary, sort_keys=True) if ok else None,
        "monitor": json.dumps(monitor, sort_keys=True), "harness_version": "1.0",
        "train_seconds": train_s, "test_seconds": test_s, "accuracy": accuracy,
        "throughput": speed if ok else None, "time_to_first_step": summary["time_to_first_step"] if ok else None,
        "timed_steps": STEPS_PER_RUN - WARMUP_STEPS if ok else None, "warmup_steps": WARMUP_STEPS if ok else None,
        "diverged": diverged if ok else None,
        "monitor_interval_s": 0.5, "monitor_samples": MONITOR_SAMPLES,
        "cpu_user_avg": cpu_user, "cpu_system_avg": 8.0, "cpu_total_avg": cpu_user + 8.0, "iowait_avg": 0.3,
        "rss_avg_bytes": rss, "rss_peak_bytes": int(rss * 1.2), "mismatches": mismatch,
        "events_truncated": False,
        "bundle_path": f"/srv/results/{c.sweep}/{cid}/{repeat}-{attempt}",
        "bundle_digest": hashlib.sha256(f"{cid}/{repeat}-{attempt}".encode()).hexdigest(),
        "bundle_stat": None,
    }


# -- the warehouse -----------------------------------------------------------------------

# The child rows of the runs just inserted (``_bench_runs``), made in SQL from their params.
CHILD_SQL = {
    "steps": f"""
        SELECT run_id,
            CASE WHEN epochs > 0 THEN (s * epochs) // {STEPS_PER_RUN} END::INTEGER AS epoch,
            s::INTEGER AS step, CASE WHEN s < {WARMUP_STEPS} THEN 'warmup' ELSE 'timed' END AS phase,
            batch / throughput * (1 + 0.03 * ((hash(run_id, s) % 1000) / 1000.0 - 0.5))
                * CASE WHEN s < {WARMUP_STEPS} THEN 3 ELSE 1 END AS seconds,
            batch::INTEGER AS images
        FROM _bench_runs, range({STEPS_PER_RUN}) AS t(s)
        WHERE throughput > 0""",
    "epochs": """
        SELECT run_id, e::INTEGER AS epoch, 938 AS steps,
            CASE WHEN diverged THEN NULL ELSE 1.0 / (e + 2) END AS train_loss,
            CASE WHEN diverged THEN NULL ELSE accuracy - 0.02 * (epochs - 1 - e) + 0.01 END AS train_accuracy,
            CASE WHEN diverged THEN NULL ELSE 1.1 / (e + 2) END AS test_loss,
            CASE WHEN diverged THEN NULL ELSE accuracy - 0.02 * (epochs - 1 - e) END AS test_accuracy,
            train_seconds / epochs AS epoch_seconds, test_seconds / epochs AS test_seconds
        FROM _bench_runs, range(epochs) AS t(e)
        WHERE status = 'ok' AND epochs > 0 AND mode = 'train'""",
    "monitor_samples": f"""
        SELECT run_id, 0.5 * (k + 1) AS t, cpu_user_avg * (0.9 + 0.2 * (k % 3) / 2) AS cpu_user,
            cpu_system_avg AS cpu_system, iowait_avg AS iowait,
            (rss_avg_bytes * (0.9 + 0.05 * (k % 5)))::BIGINT AS rss_bytes, 1 AS nprocs
        FROM _bench_runs, range({MONITOR_SAMPLES}) AS t(k)""",
    "layers": """
        SELECT run_id, kind || i AS name, kind, i::INTEGER AS "index",
            CASE kind WHEN 'conv' THEN 0.002 * (1 + i % 4) ELSE 0.0003 END
                * (1 + 0.05 * ((hash(run_id, i) % 100) / 100.0)) AS forward_seconds,
            CASE kind WHEN 'conv' THEN 0.004 * (1 + i % 4) ELSE 0.0006 END AS backward_seconds,
            5 AS repeats, 1000 * i AS params, 1000000 * i AS flops
        FROM (SELECT run_id, i, CASE WHEN i % 3 <> 2 THEN 'conv' WHEN i % 2 = 1 THEN 'relu' ELSE 'linear' END AS kind
              FROM _bench_runs, range(CASE WHEN model = 'lenet5' THEN 8 ELSE 20 END) AS t(i)
              WHERE status = 'ok' AND layer_profile)""",
}

RUN_COLUMNS = """
    SELECT run_id, status, throughput, accuracy, diverged, train_seconds, test_seconds,
        cpu_user_avg, cpu_system_avg, iowait_avg, rss_avg_bytes,
        coalesce(TRY_CAST(params ->> 'batch_size' AS INTEGER), 1) AS batch,
        coalesce(TRY_CAST(params ->> 'epochs' AS INTEGER), 0) AS epochs,
        params ->> 'mode' AS mode, params ->> 'model' AS model,
        coalesce(TRY_CAST(params ->> 'layer_profile' AS BOOLEAN), false) AS layer_profile
    FROM _bench_new"""


def generate(path: Path, runs: int) -> dict[str, int]:
    """Write a warehouse of ``runs`` runs at ``path``; return the row count of each table."""
    cells, studies = catalogue()
    rows: list[dict[str, Any]] = []
    registered: dict[tuple[str, str], set[str]] = {}
    host = 0
    while len(rows) < runs:
        for row in host_runs(host, cells):
            rows.append(row)
            if len(rows) >= runs:
                break
        host += 1
    for host_no in range(host):
        for c in cells:
            env = f"{c.params['framework']}-{c.params['variant']}-h{host_no:02d}"
            registered.setdefault((c.study, c.profile), set()).add(identity_cell_id(c.identity, env))
    table = pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)
    with open_warehouse(path) as wh:
        con = wh.con
        con.register("_bench_new", table)
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO runs BY NAME SELECT * FROM _bench_new")
        con.execute(f"CREATE TEMP TABLE _bench_runs AS {RUN_COLUMNS}")
        for name, sql in CHILD_SQL.items():
            con.execute(f"INSERT INTO {name} BY NAME {sql}")
        con.execute("COMMIT")
        con.execute("DROP TABLE _bench_runs")
        con.unregister("_bench_new")
        present = {cid for (cid,) in con.execute("SELECT DISTINCT cell_id FROM runs").fetchall()}
        start = time.perf_counter()
        if materialise is not None:
            con.execute("BEGIN TRANSACTION")
            materialise.refresh(con)  # what an ingest of all these runs at once does
            con.execute("COMMIT")
        refresh_s = time.perf_counter() - start
        start = time.perf_counter()
        for (study, profile), ids in registered.items():  # each computes its study's findings
            decl, matrix = studies[study]
            register_study(con, decl, profile=profile, matrix=matrix, cell_ids=sorted(ids & present))
        print(f"registered {len(registered)} study profiles in {time.perf_counter() - start:.1f} s")
        tables = ("runs", "steps", "epochs", "layers", "monitor_samples", "study_cells")
        tables += ("cell_cache", *(c.table for c in materialise.CACHED)) if materialise is not None else ()
        counts = {name: con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in tables}
        counts["cells"] = len(present)
        counts["sweeps"] = con.execute("SELECT count(DISTINCT sweep) FROM runs").fetchone()[0]
    return counts, refresh_s


def refresh_one_cell(path: Path) -> float:
    """Seconds an ingest of one more run of one cell spends refreshing the caches."""
    if materialise is None:
        return 0.0
    with open_warehouse(path) as wh:
        con = wh.con
        con.execute("BEGIN TRANSACTION")
        con.execute("""
            INSERT INTO runs BY NAME
            SELECT * REPLACE (run_id || '-again' AS run_id, current_timestamp::TIMESTAMP AS ingested_at)
            FROM runs WHERE run_id = (SELECT max(run_id) FROM runs WHERE status = 'ok')""")
        start = time.perf_counter()
        materialise.refresh(con)
        seconds = time.perf_counter() - start
        con.execute("ROLLBACK")
    return seconds


# -- the timings -------------------------------------------------------------------------

Query = Callable[[duckdb.DuckDBPyConnection], Any]


def _sql(sql: str, params: Any = None) -> Query:
    return lambda con: con.sql(sql, params=params).to_arrow_table()


def queries(path: Path, only: list[str]) -> list[tuple[str, Query]]:
    """(name, query) of what is timed: each view counted, then matrun's own reads."""
    with open_warehouse(path, read_only=True) as wh:
        sweeps = [s for (s,) in wh.con.execute(
            "SELECT sweep FROM runs GROUP BY sweep ORDER BY count(*) DESC, sweep LIMIT 1").fetchall()]
        sweep = sweeps[0]
        stem = sweep.rsplit("-h", 1)[0]
        other = wh.con.execute("SELECT min(sweep) FROM runs WHERE sweep LIKE $p AND sweep <> $s",
                               {"p": stem + "-h%", "s": sweep}).fetchone()[0]
        levels = reads.read_cell_levels(wh.con)
    drop = list(matching_keys(()))
    out: list[tuple[str, Query]] = [(f"view {name}", _sql(f"SELECT count(*) FROM (SELECT * FROM {name})"))
                                    for name in view_sql()]
    out += [(f"report {name}", (lambda n: lambda con: reads.read_study(con, n, None))(name))
            for name in reads.STUDY_VIEWS]
    out += [(f"report {name} --sweep", (lambda n: lambda con: reads.read_study(con, n, sweep, levels))(name))
            for name in reads.STUDY_VIEWS]
    out += [
        ("report read_sweeps", reads.read_sweeps),
        ("report read_runs", lambda con: reads.read_runs(con, None)),
        ("report read_runs --sweep", lambda con: reads.read_runs(con, sweep)),
        ("report read_baseline", lambda con: reads.read_baseline(con, None)),
        ("report read_epoch_curve", lambda con: reads.read_epoch_curve(con, None)),
        ("report read_provenance", lambda con: reads.read_provenance(con, None)),
        ("report read_cell_levels", reads.read_cell_levels),
        ("report read_catalogue", reads.read_catalogue),
        ("report read_images", lambda con: reads.read_images(con, None)),
        ("report read_monitor", lambda con: reads.read_monitor(
            con, [r for (r,) in con.execute("SELECT run_id FROM runs WHERE sweep = $s AND status = 'ok' "
                                            "ORDER BY run_id LIMIT 8", {"s": sweep}).fetchall()])),
        ("compare (two sweeps)", lambda con: _compare(con, sweep, other, drop)),
        ("advise", _sql(ADVISE_SQL, {"sweep": None})),
        ("advise --sweep", _sql(ADVISE_SQL, {"sweep": sweep})),
        ("sweep cell_status", _sql("SELECT cell_id, repeat, attempts, last_status, ok, max_attempt "
                                   "FROM cell_status")),
        ("sweep cell_durations", _sql("SELECT cell_id, wall_seconds_median FROM cell_durations")),
        ("studies estimates", _sql("SELECT framework, model, device, median(throughput) FROM run_overview "
                                   "WHERE status = 'ok' AND throughput > 0 AND mode = 'train' GROUP BY ALL")),
    ]
    if only:
        out = [(name, q) for name, q in out if any(o in name for o in only)]
    return out


def _compare(con: duckdb.DuckDBPyConnection, a: str, b: str, drop: list[str]) -> Any:
    """What ``matrun compare sweep:A sweep:B`` runs on the warehouse."""
    ids = {side: [r for (r,) in con.execute("SELECT run_id FROM runs WHERE sweep = $s ORDER BY run_id",
                                            {"s": name}).fetchall()]
           for side, name in (("a", a), ("b", b))}
    return con.execute(COMPARE_SQL, {**ids, "drop": drop}).fetchall()


def time_queries(path: Path, named: list[tuple[str, Query]], repeat: int) -> list[tuple[str, float]]:
    """The median milliseconds of each query over ``repeat`` timings, each in a fresh reader."""
    results = []
    for name, query in named:
        if repeat > 1:  # one untimed read first: what every later read of a process reuses
            with open_warehouse(path, read_only=True) as wh:
                query(wh.con)
        times = []
        for _ in range(repeat):
            with open_warehouse(path, read_only=True) as wh:
                start = time.perf_counter()
                query(wh.con)
                times.append((time.perf_counter() - start) * 1000)
        ms = statistics.median(times)
        results.append((name, ms))
        print(f"  {name:44s} {ms:9.1f} ms  {'ok' if ms < LIMIT_MS else 'SLOW'}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5,
                        help="timings of each query (the median is shown); above 1, after one untimed read")
    parser.add_argument("--only", nargs="*", default=[],
                        help="time only the queries whose name contains one of these")
    place = parser.add_mutually_exclusive_group()
    place.add_argument("--keep", type=Path, help="build the warehouse here and keep it")
    place.add_argument("--reuse", type=Path, help="time a warehouse an earlier --keep built")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="matrun-view-scale-") as tmp:
        path = args.reuse or args.keep or Path(tmp) / "scale.duckdb"
        if args.reuse:
            with open_warehouse(path) as wh:  # a writer: migrations, this matrun's views, caches
                start = time.perf_counter()
                if materialise is not None and materialise.ensure_current(wh.con):
                    print(f"caches refreshed in {time.perf_counter() - start:.1f} s")
        else:
            start = time.perf_counter()
            counts, refresh_s = generate(path, args.runs)
            print(f"generated in {time.perf_counter() - start:.1f} s (of which filling the view caches "
                  f"{refresh_s:.1f} s): " + ", ".join(f"{n:,} {name}" for name, n in counts.items()))
        print(f"an ingest of one more run refreshes the caches in {refresh_one_cell(path):.2f} s")
        print(f"median of {args.repeat} timings per query (each in a fresh reader), limit {LIMIT_MS:.0f} ms:")
        results = time_queries(path, queries(path, args.only), args.repeat)
        slow = [name for name, ms in results if ms >= LIMIT_MS]
        print(f"{len(results) - len(slow)} of {len(results)} under {LIMIT_MS:.0f} ms"
              + (f"; over: {', '.join(slow)}" if slow else ""))


if __name__ == "__main__":
    main()
