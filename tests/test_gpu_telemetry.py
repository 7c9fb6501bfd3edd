"""GPU telemetry and energy (issue 15): NVML through its real binding up to the calls themselves.

On this GPU-less host the binding is real and fails for real (no libnvidia-ml.so): the fail-soft
path is tested as it is.  Where a GPU is needed, ``tests/nvml_standin.py`` stands in for the NVML
calls only (values of NVML's documented types); the device mapping, the sampling thread, gpu.jsonl,
the bundle reader, ingest and the views are matrun's real code.  RAPL is read from a powercap tree
written in the kernel's own format (one integer per file).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import nvml_standin
from bundle_factory import make_bundle, read_json
from lake_client import plain_connect
from matrun.runner.executors import gpu
from matrun.runner.executors.energy import EnergyMonitor, MonitorPair, rapl_zones
from matrun.runner.executors.local import cell_environment
from matrun.runner.executors.monitor import Monitor
from matrun.warehouse.bundles.layout import GPU, RESULT
from matrun.warehouse.bundles.read import BadBundle, load_bundle
from matrun.warehouse.ingest import ingest

UUID0 = "GPU-5b1f0b42-6a0e-3f8b-9c1d-0123456789ab"
UUID1 = "GPU-9c2e1a53-7b1f-4a9c-8d2e-abcdef012345"
GPU_PARAMS = {"device": "gpu", "gpus": 1, "gpu_ids": None, "framework": "torch", "seed": 0}


@pytest.fixture
def standin(monkeypatch):
    """Install a stand-in NVML with the given GPUs as ``pynvml`` (the binding matrun imports)."""
    def install(gpus, **kw):
        module = nvml_standin.module(gpus, **kw)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module
    return install


def sql(db: Path, query: str) -> list[tuple]:
    con = plain_connect(db)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


# -- this host: no driver, the real binding fails soft -------------------------------------


def test_inventory_on_this_gpu_less_host_says_why_and_raises_nothing():
    inventory = gpu.gpu_inventory()
    assert inventory["available"] is False and inventory["gpus"] == []
    assert "NVML did not initialise" in inventory["reason"] and "Not Found" in inventory["reason"]
    assert gpu.host_gpu_facts() is None  # a CPU host's record does not change


def test_without_the_binding_the_reason_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    inventory = gpu.gpu_inventory()
    assert inventory["available"] is False and "matrun[gpu]" in inventory["reason"]


def test_a_gpu_cell_on_this_host_is_not_monitored_and_says_why(tmp_path):
    monitor = EnergyMonitor(tmp_path / GPU, GPU_PARAMS, {"CUDA_VISIBLE_DEVICES": "0"}, rapl_root=tmp_path / "none")
    out = monitor.start().stop()
    assert not (tmp_path / GPU).exists()
    assert out["gpu_energy_j"] is None and out["cpu_energy_j"] is None and out["gpu_throttled"] is None
    assert out["energy_note"].startswith("GPUs not monitored: NVML did not initialise")


def test_a_cpu_cell_starts_no_thread_and_records_nulls_not_zeros(tmp_path):
    monitor = EnergyMonitor(tmp_path / GPU, {"device": "cpu"}, {}, rapl_root=tmp_path / "none").start()
    assert monitor._thread is None
    out = monitor.stop()
    assert set(out) == {"gpu_count", "gpu_samples", "gpu_util_avg", "gpu_mem_used_peak_bytes", "gpu_power_avg_w",
                        "gpu_energy_j", "gpu_energy_source", "gpu_throttled", "gpu_throttle_reasons",
                        "cpu_energy_j", "cpu_energy_source", "energy_note"}
    assert all(v is None for v in out.values())


# -- the inventory and the host facts ------------------------------------------------------


def test_inventory_through_nvml(standin):
    nvml = standin([nvml_standin.FakeGpu(UUID0), nvml_standin.FakeGpu(UUID1, mig=(1, 1), ecc=(0, 0))],
                   cuda=12040)
    inventory = gpu.gpu_inventory()
    assert inventory["available"] and inventory["reason"] is None
    assert inventory["driver_version"] == "580.95.05" and inventory["cuda_driver_version"] == "12.4"
    first, second = inventory["gpus"]
    assert first == {"index": 0, "uuid": UUID0, "name": "NVIDIA H100 80GB HBM3",
                     "memory_total_bytes": 85_520_809_984, "mig_mode": False, "ecc_mode": True,
                     "power_limit_w": 700.0, "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 2619}
    assert second["mig_mode"] is True and second["ecc_mode"] is False
    assert nvml.inits == nvml.shutdowns == 1  # initialised for the call, shut down after
    facts = gpu.host_gpu_facts()
    assert facts["cuda_driver_version"] == "12.4" and [g["uuid"] for g in facts["gpus"]] == [UUID0, UUID1]


def test_a_failing_init_is_reported_not_raised(standin):
    import pynvml as real
    standin([], init_error=real.NVMLError_DriverNotLoaded)
    inventory = gpu.gpu_inventory()
    assert inventory["available"] is False and "Driver Not Loaded" in inventory["reason"]


# -- which GPUs a cell was given -----------------------------------------------------------


@pytest.mark.parametrize("params, env, expected", [
    ({"device": "cpu"}, {"CUDA_VISIBLE_DEVICES": "0"}, []),
    # local executor: CUDA_VISIBLE_DEVICES (in NVML's order: CUDA_DEVICE_ORDER=PCI_BUS_ID)
    ({"device": "gpu", "gpus": 2}, {"CUDA_VISIBLE_DEVICES": "0,1"}, ["0", "1"]),
    # docker executor: the device request (gpu_ids, else the first `gpus`)
    ({"device": "gpu", "gpus": 2, "gpu_ids": [3, 1]}, None, ["3", "1"]),
    ({"device": "gpu", "gpus": 2}, None, ["0", "1"]),
    # a Slurm task's allocation
    ({"device": "gpu", "gpus": 1}, {"SLURM_JOB_GPUS": "2"}, ["2"]),
    ({"device": "gpu", "gpus": 1}, {"CUDA_VISIBLE_DEVICES": f"{UUID1}"}, [UUID1]),
    ({"device": "gpu", "gpus": 1}, {"NVIDIA_VISIBLE_DEVICES": "all"}, ["0"]),
])
def test_cell_gpu_selectors(params, env, expected):
    assert gpu.cell_gpu_selectors(params, env) == expected


def test_the_local_executor_makes_cuda_count_gpus_as_nvml_does(tmp_path):
    params = {"framework": "torch", "variant": "cpu", "device": "gpu", "gpus": 2, "seed": 0, "threads": 1,
              "interop_threads": "unset", "onednn": True, "layout": "nchw", "precision": "fp32",
              "conv_algo": "heuristic"}
    env = cell_environment(params, tmp_path, base={"CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert gpu.cell_gpu_selectors(params, env) == ["0", "1"]


def test_resolve_by_index_uuid_and_unique_prefix_and_never_guess():
    inventory = [{"index": 0, "uuid": UUID0}, {"index": 1, "uuid": UUID1},
                 {"index": 2, "uuid": "MIG-0d4f6a1e-1111-2222-3333-444455556666"}]
    found, unknown = gpu.resolve_gpus(["1", UUID0, "MIG-0d4f", "GPU-", "9", "GPU-ffff"], inventory)
    assert [g["index"] for g in found] == [1, 0, 2]
    assert unknown == ["GPU-", "9", "GPU-ffff"]  # "GPU-" is ambiguous: not guessed


# -- sampling into gpu.jsonl and the aggregates --------------------------------------------


def _run_monitor(path: Path, params: dict, env: dict, seconds: float, **kw) -> dict:
    monitor = EnergyMonitor(path, params, env, gpu_interval_s=0.05, **kw).start()
    time.sleep(seconds)
    return monitor.stop()


def test_samples_exactly_the_cells_gpus_and_sums_them(standin, tmp_path):
    busy = nvml_standin.FakeGpu(UUID1, used=[2_000_000_000, 9_000_000_000, 5_000_000_000], power_mw=[600_000, 700_000])
    idle = nvml_standin.FakeGpu(UUID0, util=0, power_mw=[60_000])
    standin([idle, busy])
    out = _run_monitor(tmp_path / GPU, {"device": "gpu", "gpus": 1}, {"CUDA_VISIBLE_DEVICES": "1"}, 0.4,
                       rapl_root=tmp_path / "none")
    lines = [json.loads(line) for line in (tmp_path / GPU).read_text().splitlines()]
    header, samples = lines[0], lines[1:]
    assert header["type"] == "header" and header["gpus"] == [{"index": 1, "uuid": UUID1, "name": busy.name}]
    assert len(samples) >= 4 and {s["gpu"] for s in samples} == {0}  # the cell's one GPU only, never GPU 0
    assert samples[0]["mem_used_bytes"] == 2_000_000_000 and samples[0]["power_w"] == 600.0
    assert samples[0]["util"] == 97 and samples[0]["sm_clock_mhz"] == 1980 and samples[0]["temp_c"] == 71
    ts = [s["t"] for s in samples]
    assert ts == sorted(ts)
    assert out["gpu_count"] == 1 and out["gpu_samples"] == len(samples)
    assert out["gpu_mem_used_peak_bytes"] == 9_000_000_000 and out["gpu_util_avg"] == 97
    # NVML's counter, first to last reading: (samples - 1) steps of 325 J
    assert out["gpu_energy_j"] == pytest.approx(325.0 * (len(samples) - 1))
    assert out["gpu_energy_source"] == "nvml-counter"
    assert out["gpu_throttled"] is False and out["gpu_throttle_reasons"] == []
    assert 600 <= out["gpu_power_avg_w"] <= 700


def test_power_is_integrated_where_a_gpu_has_no_energy_counter(standin, tmp_path):
    standin([nvml_standin.FakeGpu(UUID0, energy_mj=None, power_mw=[500_000])])
    out = _run_monitor(tmp_path / GPU, GPU_PARAMS, {"CUDA_VISIBLE_DEVICES": "0"}, 0.4, rapl_root=tmp_path / "none")
    samples = [json.loads(line) for line in (tmp_path / GPU).read_text().splitlines()[1:]]
    assert all(s["energy_j"] is None for s in samples)
    # The integral is over the times gpu.jsonl records (rounded to the millisecond as written),
    # so it equals 500 W times the recorded span up to the aggregate's own rounding (1 mJ),
    # whatever the machine's timing.
    span = samples[-1]["t"] - samples[0]["t"]
    assert len(samples) >= 2 and span > 0
    assert out["gpu_energy_source"] == "nvml-power" and out["gpu_energy_j"] == pytest.approx(500 * span, abs=1e-3)


def test_throttling_is_flagged_idle_is_not(standin, tmp_path):
    reasons = nvml_standin.FakeGpu(UUID0, reasons=[0x1, 0x4 | 0x1, 0x1])  # idle, then power-capped
    standin([reasons])
    out = _run_monitor(tmp_path / GPU, GPU_PARAMS, None, 0.3, rapl_root=tmp_path / "none")
    assert out["gpu_throttled"] is True and out["gpu_throttle_reasons"] == ["sw_power_cap"]
    standin([nvml_standin.FakeGpu(UUID0, reasons=[0x1])])
    out = _run_monitor(tmp_path / "again.jsonl", GPU_PARAMS, None, 0.2, rapl_root=tmp_path / "none")
    assert out["gpu_throttled"] is False


def test_a_gpu_nvml_cannot_find_is_noted(standin, tmp_path):
    standin([nvml_standin.FakeGpu(UUID0)])
    out = _run_monitor(tmp_path / GPU, {"device": "gpu", "gpus": 1}, {"CUDA_VISIBLE_DEVICES": "GPU-none"}, 0.1,
                       rapl_root=tmp_path / "none")
    assert out["energy_note"] == "GPUs not found by NVML: GPU-none" and out["gpu_samples"] == 0


# -- RAPL ----------------------------------------------------------------------------------


def _rapl(root: Path, name: str, energy: int, wrap: int = 262_143_328_850) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n" if name.count(":") == 1 else "core\n")
    (zone / "energy_uj").write_text(f"{energy}\n")
    (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
    return zone


def test_rapl_packages_only_and_the_counter_wrap(tmp_path):
    package = _rapl(tmp_path, "intel-rapl:0", energy=999_000_000, wrap=999_999_999)
    _rapl(tmp_path, "intel-rapl:0:0", energy=5)  # a part of the package: not added again
    (tmp_path / "intel-rapl:1").mkdir()  # unreadable (no energy_uj): skipped
    zones = rapl_zones(tmp_path)
    assert [z.name for z in zones] == ["package-0"]
    (package / "energy_uj").write_text("1500000\n")  # wrapped: 999,000,000 → 999,999,999 → 0 → 1,500,000
    zones[0].read()
    assert zones[0].total == 999_999_999 - 999_000_000 + 1 + 1_500_000


def test_rapl_energy_of_a_run(tmp_path):
    package = _rapl(tmp_path, "intel-rapl:0", energy=10_000_000)
    monitor = EnergyMonitor(tmp_path / GPU, {"device": "cpu"}, {}, rapl_root=tmp_path).start()
    (package / "energy_uj").write_text("52500000\n")
    out = monitor.stop()
    assert out["cpu_energy_j"] == 42.5 and out["cpu_energy_source"] == "rapl:package-0"
    assert not (tmp_path / GPU).exists()  # no GPU file for a CPU cell


def test_this_host_exposes_no_rapl():
    # The VM has no /sys/class/powercap: cpu_energy_j stays null here (the tests above use a tree).
    assert rapl_zones() == [] or all(z.name for z in rapl_zones())


def test_monitor_pair_merges_both(tmp_path):
    import subprocess
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    try:
        pair = MonitorPair(Monitor(proc.pid, tmp_path / "monitor.jsonl"),
                           EnergyMonitor(tmp_path / GPU, {"device": "cpu"}, {}, rapl_root=tmp_path / "none")).start()
        time.sleep(0.5)
        out = pair.stop()
    finally:
        proc.wait()
    assert out["samples"] >= 1 and "cpu_energy_j" in out and out["cpu_energy_j"] is None


# -- into the warehouse --------------------------------------------------------------------


def _gpu_bundle(results: Path, standin, *, cell_id: str, batch: int, used: int, reasons: int = 0,
                repeat: int = 0) -> Path:
    params = {"device": "gpu", "gpus": 1, "batch_size": batch, "model": "resnet50", "dataset": "synthetic",
              "precision": "bf16"}
    run_dir = make_bundle(results, cell_id=cell_id, repeat=repeat, params=params, images_per_step=batch)
    standin([nvml_standin.FakeGpu(UUID0, used=[used // 2, used], reasons=[reasons])])
    out = _run_monitor(run_dir / GPU, params, None, 0.25, rapl_root=results / "none")
    result = read_json(run_dir / RESULT)
    result["monitor"].update(out)
    result["host"]["gpu"] = gpu.host_gpu_facts()
    result["host"]["state"] = {"busy": repeat == 1, "busy_reasons": ["other processes kept 1.00 …"] if repeat else []}
    (run_dir / RESULT).write_text(json.dumps({**result, "schema_version": 1}))
    events = (run_dir / "events.jsonl").read_text().splitlines()
    patched = []
    for line in events:
        record = json.loads(line)
        if record.get("type") == "summary":
            record["images"] = 6 * batch
            record["peak_device_memory_bytes"] = used - 500 * 2**20
        patched.append(json.dumps(record))
    (run_dir / "events.jsonl").write_text("\n".join(patched) + "\n")
    return run_dir


def test_gpu_samples_aggregates_and_views_through_ingest(standin, tmp_path):
    results, db = tmp_path / "results", tmp_path / "wh.duckdb"
    _gpu_bundle(results, standin, cell_id="c0ffee00000000b1", batch=64, used=8 * 2**30)
    _gpu_bundle(results, standin, cell_id="c0ffee00000000b1", batch=64, used=8 * 2**30, repeat=1)
    _gpu_bundle(results, standin, cell_id="c0ffee00000000b2", batch=256, used=30 * 2**30, reasons=0x40)
    make_bundle(results, cell_id="c0ffee00000000c1")  # a CPU run of an old harness: nothing measured
    report = ingest([results], warehouse=db)
    assert len(report.ingested) == 4 and not report.skipped
    rows = sql(db, "SELECT count(*), count(DISTINCT run_id), min(gpu), max(mem_used_bytes) FROM gpu_samples")
    assert rows[0][0] >= 12 and rows[0][1] == 3 and rows[0][2] == 0 and rows[0][3] == 30 * 2**30
    overview = sql(db, "SELECT cell_id, gpu_throttled, busy_start, gpu_energy_j > 0, images, j_per_image > 0, "
                       "gpu_throttle_reasons FROM run_overview ORDER BY cell_id, \"repeat\"")
    assert overview == [
        ("c0ffee00000000b1", False, False, True, 384, True, []),
        ("c0ffee00000000b1", False, True, True, 384, True, []),
        ("c0ffee00000000b2", True, False, True, 1536, True, ["hw_thermal_slowdown"]),
        ("c0ffee00000000c1", None, None, None, None, None, None),
    ]
    energy = sql(db, "SELECT cell_id, energy_runs, j_per_image IS NOT NULL, gpu_energy_source, throttled_runs "
                     "FROM energy_efficiency ORDER BY cell_id")
    assert energy == [("c0ffee00000000b1", 2, True, "nvml-counter", 0), ("c0ffee00000000b2", 1, True, "nvml-counter", 1),
                      ("c0ffee00000000c1", 0, False, None, 0)]
    per_image = sql(db, "SELECT gpu_energy_j / images, j_per_image FROM run_overview WHERE gpu_energy_j IS NOT NULL")
    assert all(a == pytest.approx(b) for a, b in per_image)
    memory = sql(db, "SELECT batch_size, nvml_peak_mb, allocator_peak_mb, gpu_total_mb, gpu_name "
                     "FROM gpu_memory_batch ORDER BY batch_size")
    assert memory == [(64, 8192.0, 7692.0, 85_520_809_984 / 2**20, "NVIDIA H100 80GB HBM3"),
                      (256, 30720.0, 30220.0, 85_520_809_984 / 2**20, "NVIDIA H100 80GB HBM3")]
    flags = sql(db, "SELECT cell_id, throttled_runs, busy_runs FROM baseline ORDER BY cell_id")
    assert flags == [("c0ffee00000000b1", 0, 1), ("c0ffee00000000b2", 1, 0), ("c0ffee00000000c1", 0, 0)]


def test_gpu_jsonl_enters_the_digest_only_when_present(standin, tmp_path):
    run_dir = make_bundle(tmp_path)
    before = load_bundle(run_dir)
    assert "gpu.jsonl" not in before.signature
    (run_dir / GPU).write_text('{"type": "header", "schema_version": 1, "interval_s": 0.5, "gpus": []}\n'
                               '{"t": 0.5, "gpu": 0, "util": null, "mem_util": null, "mem_used_bytes": 5, '
                               '"power_w": null, "energy_j": null, "sm_clock_mhz": null, "mem_clock_mhz": null, '
                               '"temp_c": null, "throttle": null}\n')
    with_gpu = load_bundle(run_dir)
    assert with_gpu.digest != before.digest and "gpu.jsonl:" in with_gpu.signature
    (run_dir / GPU).unlink()
    assert load_bundle(run_dir).digest == before.digest  # the bundles written before it keep theirs


@pytest.mark.parametrize("line, message", [
    ('{"t": "soon", "gpu": 0}', "gpu.jsonl: line 2: sample key 't' should be a number"),
    ('{"t": 1.0}', "gpu.jsonl: line 2: sample is missing required key 'gpu'"),
    ('{"t": 1.0, "gpu": 0, "mem_used_bytes": 1e400}', "gpu.jsonl: line 2"),
    ('[1, 2]', "gpu.jsonl: line 2 is not a JSON object"),
    ('{"t": 1.0, "gpu": 0, "throttle": 99999999999999999999999}', "gpu.jsonl: line 2"),
])
def test_a_malformed_gpu_file_is_refused_naming_it(tmp_path, line, message):
    run_dir = make_bundle(tmp_path)
    (run_dir / GPU).write_text('{"type": "header", "schema_version": 1}\n' + line + "\n")
    with pytest.raises(BadBundle) as caught:
        load_bundle(run_dir)
    assert message in caught.value.short()


def test_a_cut_off_gpu_file_of_a_failed_run_is_kept(tmp_path):
    run_dir = make_bundle(tmp_path, status="failed", exit_code=1)
    (run_dir / GPU).write_text('{"type": "header", "schema_version": 1}\n'
                               '{"t": 0.5, "gpu": 0, "util": 50}\n{"t": 1.0, "gp')
    bundle = load_bundle(run_dir)
    assert "gpu.jsonl: ignored truncated line 3" in bundle.warnings
    assert sum(len(chunk) if isinstance(chunk, list) else chunk.num_rows for chunk in bundle.gpu_samples) == 1
