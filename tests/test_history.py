"""``matrun history`` over a hand-made warehouse.  Every expected number is worked out by hand
from the bundles below; no framework runs.

A run's release is the framework version its probe recorded (the factory's 2.13.0+cpu,
rewritten here), each release in its own environment and sweep:

    torch lenet5 fashion-mnist threads 1    2.4.1: 100 101 102 103 104
                                            2.9.0: 100.5 101.5 102.5 103.5 104.5  (within 5 %)
                                            2.13.0: 150 151 152 153 154            (faster)
    tensorflow lenet5 fashion-mnist          2.16.1: 50 51 52 53 54; 2.21.0: 40 41 42 43 44 (slower)
    torch lenet5 mnist threads 1            2.9.0: 100 101; 2.13.0: 120 121     (2 against 2)
    torch lenet5 cifar10, one release        sweep d1 (01:00): 100..104; sweep d2 (01:10): 80..84
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

import pytest
from typer.testing import CliRunner

from bundle_factory import make_bundle, read_json
from matrun.errors import InputError
from matrun.runner.cli.main import app
from matrun.warehouse.bundles.write import write_json_atomic
from matrun.warehouse.history import history, holm
from matrun.warehouse.ingest import ingest


def _release(run_dir: Path, release: str, minute: int) -> None:
    """Give a bundle its framework release (the probe's, and an environment of its own) and a
    start time."""
    env_id = f"env-{release.replace('.', '')}-000000000000"
    for name in ("spec.json", "result.json"):
        doc = read_json(run_dir / name)
        doc["env_id"] = env_id
        if name == "result.json":
            doc["started_at"] = f"2026-11-22T01:{minute:02d}:00+00:00"
        write_json_atomic(run_dir / name, doc)
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        record = json.loads(line)
        if record.get("type") == "probe":
            record["framework_version"] = release
        out.append(json.dumps(record))
    (run_dir / "events.jsonl").write_text("\n".join(out) + "\n")


def _point(results: Path, sweep: str, release: str, params: dict[str, Any], values: Sequence[float],
           minute: int = 0) -> None:
    cell = f"{sweep}-{release}-{params.get('dataset', 'fm')}-{params.get('framework', 'torch')}"
    for repeat, value in enumerate(values):
        run = make_bundle(results, sweep=sweep, cell_id=cell, repeat=repeat, params=params, throughput=value)
        _release(run, release, minute)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("history") / "results"
    fm = {"threads": 1}
    _point(results, "r241", "2.4.1", fm, [100, 101, 102, 103, 104])
    _point(results, "r290", "2.9.0", fm, [100.5, 101.5, 102.5, 103.5, 104.5])
    _point(results, "r2130", "2.13.0", fm, [150, 151, 152, 153, 154])
    tf = {"framework": "tensorflow", "threads": 1}
    _point(results, "tf216", "2.16.1", tf, [50, 51, 52, 53, 54])
    _point(results, "tf221", "2.21.0", tf, [40, 41, 42, 43, 44])
    mnist = {"threads": 1, "dataset": "mnist"}
    _point(results, "r290", "2.9.0", mnist, [100, 101])
    _point(results, "r2130", "2.13.0", mnist, [120, 121])
    cifar = {"threads": 1, "dataset": "cifar10"}
    _point(results, "d1", "2.13.0", cifar, [100, 101, 102, 103, 104], minute=0)
    _point(results, "d2", "2.13.0", cifar, [80, 81, 82, 83, 84], minute=10)
    path = results.parent / "matrun.duckdb"
    report = ingest([results], warehouse=path)
    assert not report.skipped, report.skipped
    return path


def _by_label(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        out.setdefault(p["label"], []).append(p)
    return out


def test_holm_multiplies_the_ith_smallest_by_m_minus_i_and_keeps_the_order():
    assert holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert holm([0.5, 0.9]) == [pytest.approx(1.0), pytest.approx(1.0)]
    assert holm([]) == [] and holm([None]) == [None]


def test_releases_in_version_order_each_change_tested_against_the_one_before(warehouse: Path):
    result = history(warehouse=warehouse)
    torch_fm = _by_label(result.points)["torch lenet5 fashion-mnist cpu threads=1"]
    assert [p["point"] for p in torch_fm] == ["2.4.1", "2.9.0", "2.13.0"]  # 2.9 before 2.13, as numbers
    first, same, faster = torch_fm
    assert first["prev_point"] is None and first["verdict"] is None and first["median"] == 102
    assert (first["ci_low"], first["ci_high"]) == (100, 104)
    assert same["verdict"] == "within 5 %" and same["ratio"] == pytest.approx(102.5 / 102)
    assert faster["verdict"] == "faster" and faster["ratio"] == pytest.approx(152 / 102.5)
    # two comparisons: the smaller p (2/252, the exact 5-against-5 minimum) doubled, the other kept
    assert faster["p_value"] == pytest.approx(2 / 252) and faster["p_adjusted"] == pytest.approx(4 / 252)
    assert same["p_adjusted"] == pytest.approx(max(same["p_value"], 4 / 252))
    assert faster["sweeps"] == ["r2130"] and faster["env_ids"] == ["env-2130-000000000000"]


def test_a_slower_release_too_few_runs_and_the_largest_change_per_framework(warehouse: Path):
    result = history(warehouse=warehouse)
    points = _by_label(result.points)
    tf_old, tf_new = points["tensorflow lenet5 fashion-mnist cpu threads=1"]
    assert tf_new["verdict"] == "slower" and tf_new["p_adjusted"] == pytest.approx(2 / 252)  # one comparison
    mnist = points["torch lenet5 mnist cpu threads=1"]
    assert mnist[1]["verdict"] == "interval overlap" and mnist[1]["p_adjusted"] is None
    largest = {p["framework"]: p for p in result.largest_changes()}
    assert largest["tensorflow"]["point"] == "2.21.0"
    assert largest["torch"]["point"] == "2.13.0" and largest["torch"]["label"].endswith("fashion-mnist cpu threads=1")


def test_one_release_across_sweeps_is_its_drift(warehouse: Path):
    result = history(warehouse=warehouse, by="sweep", framework="torch")
    cifar = _by_label(result.points)["torch lenet5 cifar10 cpu threads=1"]
    assert [p["point"] for p in cifar] == ["d1", "d2"]  # in the order they ran
    assert cifar[1]["verdict"] == "slower" and cifar[1]["releases"] == ["2.13.0"]
    assert all(p["framework"] == "torch" for p in result.points)
    by_release = _by_label(history(warehouse=warehouse).points)["torch lenet5 cifar10 cpu threads=1"]
    assert len(by_release) == 1 and by_release[0]["n"] == 10  # one release: one point of both sweeps


def test_a_sweep_keeps_its_workloads_with_their_runs_from_every_sweep(warehouse: Path):
    result = history(warehouse=warehouse, sweep="r290")
    assert {p["label"] for p in result.points} == {"torch lenet5 fashion-mnist cpu threads=1",
                                                   "torch lenet5 mnist cpu threads=1"}
    assert len(result.points) == 5


def test_the_command_prints_tables_the_largest_changes_json_and_csv(warehouse: Path):
    runner = CliRunner()
    res = runner.invoke(app, ["history", "--warehouse", str(warehouse), "--framework", "tensorflow"])
    assert res.exit_code == 0, res.output
    assert "tensorflow lenet5 fashion-mnist cpu threads=1: throughput (img/s) by release" in res.stdout
    assert ("tensorflow: the largest change is tensorflow lenet5 fashion-mnist cpu threads=1: 2.16.1 → 2.21.0, "
            "throughput 0.81× (") in res.stdout
    assert "slower; Holm-adjusted p = 0.00794" in res.stdout
    res = runner.invoke(app, ["history", "--warehouse", str(warehouse), "--format", "json"])
    doc = json.loads(res.stdout)
    assert doc["metric"] == "throughput" and doc["by"] == "release" and len(doc["points"]) == 8
    res = runner.invoke(app, ["history", "--warehouse", str(warehouse), "--format", "csv", "--metric", "accuracy"])
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(rows) == 8 and {r["verdict"] for r in rows} >= {"", "within 5 %"}  # the factory's 0.8 everywhere


@pytest.mark.parametrize("args, message", [
    (["--metric", "speed"], "Error: --metric: expected one of throughput, train_s, test_s, accuracy, "
                            "tokens_per_second, perplexity, got 'speed'\n"),
    (["--by", "date"], "Error: --by: expected one of release, sweep, got 'date'\n"),
    (["--framework", "caffe"], "Error: --framework: no run of 'caffe' in warehouse {w} (frameworks: tensorflow, "
                               "torch)\n"),
    (["--sweep", "nope"], "Error: --sweep: no sweep named 'nope' in warehouse {w} (sweeps: d1, d2, r2130, r241, "
                          "r290, tf216, tf221)\n"),
    (["--format", "html"], "Error: --format 'html': expected table, csv or json\n"),
])
def test_bad_input_is_one_error_line_and_exit_2(warehouse: Path, args: list[str], message: str):
    res = CliRunner().invoke(app, ["history", "--warehouse", str(warehouse), *args])
    assert (res.exit_code, res.stderr) == (2, message.format(w=warehouse))


def test_a_missing_warehouse_and_an_empty_one(tmp_path: Path):
    with pytest.raises(InputError, match="does not exist"):
        history(warehouse=tmp_path / "none.duckdb")
    empty = tmp_path / "empty" / "matrun.duckdb"
    ingest([], warehouse=empty)
    assert history(warehouse=empty).points == []
    res = CliRunner().invoke(app, ["history", "--warehouse", str(empty)])
    assert res.exit_code == 0 and "no history" in res.stdout


def test_the_report_has_a_page_across_releases_with_a_figure_per_framework(warehouse: Path, tmp_path: Path):
    from matrun.reports.build import build_report

    index = build_report(warehouse=warehouse, out_dir=tmp_path / "report")
    page = (index.parent / "releases.html").read_text()
    assert 'id="fig-releases-0"' in page and 'id="fig-releases-1"' in page  # torch and tensorflow
    assert "Across framework releases" in page and 'id="releases-table"' in page
    assert "tensorflow: the largest change is tensorflow lenet5 fashion-mnist cpu threads=1: 2.16.1 → 2.21.0" in page
    rows = list(csv.DictReader(io.StringIO((index.parent / "releases.csv").read_text())))
    # the workloads with two releases or more: torch fashion-mnist (3), tensorflow (2), torch mnist (2);
    # cifar10 was measured at one release only
    assert len(rows) == 7 and [r["point"] for r in rows if "fashion" in r["label"] and r["framework"] == "torch"] \
        == ["2.4.1", "2.9.0", "2.13.0"]
    assert "releases.html" in index.read_text()  # in the site's navigation
    one = build_report(warehouse=warehouse, out_dir=tmp_path / "one", sweep="d1")
    assert not (one.parent / "releases.html").exists()  # cifar10: one release, no history


def test_a_release_cell_and_the_pins_cell_of_one_workload_share_a_history(tmp_path: Path):
    """A cell's ``version`` is its release; a cell without one (``version = ""``, today's pins)
    is the release its probe found: both are one workload, in release order."""
    results = tmp_path / "results"
    params = {"threads": 2, "model": "resnet18"}
    _point(results, "rel", "1.13.1", {**params, "version": "1.13.1"}, [80, 81, 82, 83, 84])
    _point(results, "rel", "2.13.0+cpu", {**params, "version": ""}, [100, 101, 102, 103, 104])
    path = tmp_path / "w.duckdb"
    assert not ingest([results], warehouse=path).skipped
    points = history(warehouse=path).points
    assert [(p["point"], p["n"]) for p in points] == [("1.13.1", 5), ("2.13.0+cpu", 5)]
    assert len({p["workload"] for p in points}) == 1 and points[1]["verdict"] == "faster"
