"""Ingest: finding and validating bundles, idempotence, conflicts, bad bundles, rollback.

Bundles come from bundle_factory (events.jsonl of a default bundle: line 1 header, 2 probe,
3 data, 4 model, 5-10 six steps, 11-12 two epochs, 13 summary, 14 end).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import duckdb
import pytest

import matrun.warehouse.bundles.read as bundles_module
import matrun.warehouse.ingest as ingest_module
from bundle_factory import make_bundle, read_json
from matrun.errors import InputError, WarehouseError
from matrun.warehouse.bundles.read import BadBundle, Bundle, BundleIncomplete, Rows, find_bundles, load_bundle
from matrun.warehouse.db import open_warehouse, shown
from matrun.warehouse.ingest import IngestReport, ingest

TABLES = ("runs", "steps", "epochs", "monitor_samples")
RUN = "c0ffee0000000001/0-1"


def counts(path: Path) -> dict[str, int]:
    with open_warehouse(path, read_only=True) as wh:
        return {t: wh.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def rows(path: Path, sql: str) -> list[tuple]:
    with open_warehouse(path, read_only=True) as wh:
        return wh.con.execute(sql).fetchall()


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = read_json(path)
    change(data)
    path.write_text(json.dumps(data))


def edit_line(path: Path, number: int, change: Callable[[dict[str, Any]], None]) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[number - 1])
    change(record)
    lines[number - 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def records_of(rows: Rows) -> list[dict[str, Any]]:
    """Records read in bulk (``Bundle.steps``, ``Bundle.monitor_samples``) as dicts."""
    return [r for chunk in rows for r in (chunk if isinstance(chunk, list) else chunk.to_pylist())]


def as_records(bundle: Bundle, attr: str) -> list[dict[str, Any]]:
    """Turn a loaded bundle's rows under ``attr`` into one list of dicts, to be changed in place."""
    records = records_of(getattr(bundle, attr))
    setattr(bundle, attr, [records])
    return records


# -- finding and loading -----------------------------------------------------------------


def test_find_bundles_sorted_root_itself_and_no_symlinks(tmp_path: Path) -> None:
    results = tmp_path / "results"
    b = make_bundle(results, cell_id="bbbb", repeat=0)
    a2 = make_bundle(results, cell_id="aaaa", repeat=1)
    a1 = make_bundle(results, cell_id="aaaa", repeat=0)
    outside = make_bundle(tmp_path / "elsewhere", cell_id="cccc")
    (results / "fixture" / "link").symlink_to(outside.parent, target_is_directory=True)
    (results / "not-a-bundle").mkdir()
    assert list(find_bundles(results)) == [a1, a2, b]
    assert list(find_bundles(a1)) == [a1]
    with pytest.raises(InputError) as err:
        list(find_bundles(tmp_path / "missing"))
    assert str(err.value) == f"{tmp_path / 'missing'}: no such directory"


def test_load_bundle_parses_every_record(tmp_path: Path) -> None:
    directory = make_bundle(tmp_path, mismatches=["threads: asked 2, in force 1"])
    bundle = load_bundle(directory)
    assert bundle.run_id == RUN and bundle.status == "ok"
    assert bundle.key.sweep == "fixture" and bundle.key.repeat == 0 and bundle.key.attempt == 1
    assert bundle.spec["params"]["model"] == "lenet5"
    assert bundle.probe is not None and bundle.probe["mismatches"] == ["threads: asked 2, in force 1"]
    assert bundle.data is not None and bundle.data["train_size"] == 60000
    assert bundle.model is not None and bundle.model["parameters"] == 61706
    assert [s["phase"] for s in records_of(bundle.steps)] == ["warmup"] * 2 + ["timed"] * 4
    assert [e["test_accuracy"] for e in bundle.epochs] == [0.7, 0.8]
    assert bundle.summary is not None and bundle.summary["throughput"] == 6400.0
    assert bundle.monitor_header["interval_s"] == 0.2
    assert [s["rss_bytes"] for s in records_of(bundle.monitor_samples)] == [100_000_000, 300_000_000]
    assert bundle.warnings == []
    assert len(bundle.digest) == 64
    assert load_bundle(directory).digest == bundle.digest
    (directory / "stdout.log").write_text("logs are not part of the digest\n")
    assert load_bundle(directory).digest == bundle.digest
    edit_json(directory / "result.json", lambda r: r.update(wall_seconds=31.0))
    assert load_bundle(directory).digest != bundle.digest


def test_load_bundle_error_names_the_file(tmp_path: Path) -> None:
    directory = make_bundle(tmp_path)
    edit_json(directory / "result.json", lambda r: r.update(schema_version=7))
    with pytest.raises(BadBundle) as err:
        load_bundle(directory)
    assert str(err.value) == (f"{directory / 'result.json'}: has schema_version 7; "
                              "this matrun reads 1: upgrade matrun")


# -- ingesting good bundles --------------------------------------------------------------


def test_ingest_writes_every_table(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    first = make_bundle(results, repeat=0)
    second = make_bundle(results, repeat=1)
    report = ingest([results], warehouse=wh)
    assert report.ingested == [first.resolve(), second.resolve()]
    assert report.unchanged == [] and report.skipped == [] and report.incomplete == []
    assert counts(wh) == {"runs": 2, "steps": 12, "epochs": 4, "monitor_samples": 4}
    assert rows(wh, "SELECT run_id, sweep, status, exit_code, executor, throughput, "
                    "train_seconds, accuracy, timed_steps, rss_peak_bytes, bundle_path "
                    "FROM runs ORDER BY run_id") == [
        (RUN, "fixture", "ok", 0, "local", 6400.0, 20.0, 0.8, 4, 300_000_000,
         str(first.resolve())),
        ("c0ffee0000000001/1-1", "fixture", "ok", 0, "local", 6400.0, 20.0, 0.8, 4,
         300_000_000, str(second.resolve())),
    ]
    assert rows(wh, f"SELECT step, phase, seconds, images FROM steps WHERE run_id = '{RUN}' "
                    "ORDER BY step") == [
        (0, "warmup", 0.02, 64), (1, "warmup", 0.02, 64), (2, "timed", 0.01, 64),
        (3, "timed", 0.01, 64), (4, "timed", 0.01, 64), (5, "timed", 0.01, 64)]
    assert rows(wh, f"SELECT epoch, steps, train_loss, test_accuracy, epoch_seconds FROM epochs "
                    f"WHERE run_id = '{RUN}' ORDER BY epoch") == [
        (0, 6, 1.0, 0.7, 10.0), (1, 6, 0.5, 0.8, 10.0)]
    assert rows(wh, f"SELECT t, cpu_user, cpu_system, iowait, rss_bytes, nprocs "
                    f"FROM monitor_samples WHERE run_id = '{RUN}' ORDER BY t") == [
        (0.2, 90.0, 10.0, 0.0, 100_000_000, 1), (0.4, 110.0, 10.0, 0.0, 300_000_000, 1)]
    assert rows(wh, f"SELECT params->>'model', probe->>'framework_version', "
                    f"model->>'parameters', harness_version FROM runs WHERE run_id = '{RUN}'") == [
        ("lenet5", "2.13.0+cpu", "61706", "1")]


def test_ingest_twice_changes_nothing(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    made = [make_bundle(results, repeat=r) for r in range(3)]
    ingest([results], warehouse=wh)
    before = counts(wh)
    stamps = rows(wh, "SELECT run_id, CAST(ingested_at AS VARCHAR) FROM runs ORDER BY run_id")
    report = ingest([results, made[0]], warehouse=wh)  # overlapping paths count once
    assert report.ingested == [] and report.skipped == []
    assert report.unchanged == [m.resolve() for m in made]
    assert counts(wh) == before == {"runs": 3, "steps": 18, "epochs": 6, "monitor_samples": 6}
    assert rows(wh, "SELECT run_id, CAST(ingested_at AS VARCHAR) FROM runs ORDER BY run_id") == stamps


def test_same_run_with_different_content_is_a_conflict(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    original = make_bundle(tmp_path / "a", wall_seconds=30.0)
    ingest([tmp_path / "a"], warehouse=wh)
    digest = load_bundle(original).digest
    changed = make_bundle(tmp_path / "b", wall_seconds=99.0)
    new_digest = load_bundle(changed).digest
    report = ingest([tmp_path / "b"], warehouse=wh)
    assert report.ingested == [] and report.unchanged == []
    assert report.skipped == [(changed.resolve(), (
        f"conflict: run {RUN} is already in the warehouse with different content (digest "
        f"{digest[:12]}, this bundle {new_digest[:12]}); a run is never overwritten: rebuild "
        "the warehouse from bundles to replace it"))]
    assert rows(wh, "SELECT wall_seconds, bundle_digest FROM runs") == [(30.0, digest)]
    assert counts(wh)["runs"] == 1


def test_conflict_inside_one_ingest(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    first = make_bundle(tmp_path / "a", wall_seconds=30.0)
    second = make_bundle(tmp_path / "b", wall_seconds=99.0)
    report = ingest([tmp_path / "a", tmp_path / "b"], warehouse=wh)
    assert report.ingested == [first.resolve()]
    assert [(p, r.split(" is ")[0]) for p, r in report.skipped] == [
        (second.resolve(), f"conflict: run {RUN}")]
    assert counts(wh)["runs"] == 1


def test_failed_run_is_ingested_with_status_and_error_tail(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    tail = "Traceback (most recent call last):\nRuntimeError: out of cheese\n"
    failed = make_bundle(results, status="failed", exit_code=3, error_tail=tail)
    events = failed / "events.jsonl"
    events.write_bytes(events.read_bytes()[:-25])  # the harness died mid-write
    report = ingest([results], warehouse=wh)
    assert report.ingested == [failed.resolve()]
    assert report.warnings == [(failed.resolve(), "events.jsonl: ignored truncated line 12")]
    assert rows(wh, "SELECT status, exit_code, error_tail, events_truncated, throughput, "
                    "summary FROM runs") == [("failed", 3, tail, True, None, None)]
    assert counts(wh) == {"runs": 1, "steps": 6, "epochs": 1, "monitor_samples": 2}


def test_failed_run_without_events_or_monitor(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    crashed = make_bundle(results, status="oom", exit_code=-9, error_tail="Killed")
    (crashed / "events.jsonl").unlink()
    (crashed / "monitor.jsonl").write_text("")
    report = ingest([results], warehouse=wh)
    assert report.ingested == [crashed.resolve()]
    assert rows(wh, "SELECT status, exit_code, probe, mismatches, harness_version FROM runs") == [
        ("oom", -9, None, None, None)]
    assert counts(wh) == {"runs": 1, "steps": 0, "epochs": 0, "monitor_samples": 0}


# -- bad bundles are reported and skipped, good ones still go in --------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def _symlink_events(directory: Path) -> None:
    (directory / "events.jsonl").unlink()
    (directory / "events.jsonl").symlink_to("/etc/passwd")


def _rename_dir(directory: Path) -> None:
    directory.rename(directory.with_name("0-2"))


BAD_BUNDLES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (how to break the bundle, the bundle directory's name afterwards, the reason)
    "corrupt spec": (
        lambda d: (d / "spec.json").write_text('{"schema_version": 1, "sweep": }'),
        "0-1", "spec.json: invalid JSON at line 1, column 32: Expecting value"),
    "spec not an object": (
        lambda d: (d / "spec.json").write_text("[1, 2]"),
        "0-1", "spec.json: is not a JSON object"),
    "truncated events of an ok run": (
        lambda d: _truncate(d / "events.jsonl"),
        "0-1", "events.jsonl: line 14 is truncated (the file ends mid-record) but result.json "
               "says status ok"),
    "truncated monitor of an ok run": (
        lambda d: _truncate(d / "monitor.jsonl"),
        "0-1", "monitor.jsonl: line 3 is truncated (the file ends mid-record) but result.json "
               "says status ok"),
    "corrupt line inside events": (
        lambda d: edit_line_raw(d / "events.jsonl", 3, '{"type": "data", '),
        "0-1", "events.jsonl: invalid JSON at line 3: Expecting property name enclosed in "
               "double quotes"),
    "unknown result schema_version": (
        lambda d: edit_json(d / "result.json", lambda r: r.update(schema_version=7)),
        "0-1", "result.json: has schema_version 7; this matrun reads 1: upgrade matrun"),
    "unknown events schema_version": (
        lambda d: edit_line(d / "events.jsonl", 1, lambda r: r.update(schema_version=2)),
        "0-1", "events.jsonl: has schema_version 2; this matrun reads 1: upgrade matrun"),
    "events without header": (
        lambda d: edit_line(d / "events.jsonl", 1, lambda r: r.update(type="probe")),
        "0-1", "events.jsonl: line 1 is not a header record"),
    "missing status": (
        lambda d: edit_json(d / "result.json", lambda r: r.pop("status")),
        "0-1", "result.json: is missing required key 'status'"),
    "missing schema_version": (
        lambda d: edit_json(d / "spec.json", lambda r: r.pop("schema_version")),
        "0-1", "spec.json: is missing required key 'schema_version'"),
    "unknown status": (
        lambda d: edit_json(d / "result.json", lambda r: r.update(status="crashed")),
        "0-1", "result.json: status 'crashed' is not one of ok, failed, timeout, oom, cancelled"),
    "wrong type": (
        lambda d: edit_json(d / "result.json", lambda r: r.update(repeat="zero")),
        "0-1", "result.json: key 'repeat' should be an integer, got \"zero\""),
    "naive time": (
        lambda d: edit_json(d / "result.json", lambda r: r.update(started_at="2026-11-22 01:50")),
        "0-1", "result.json: key 'started_at' should be an ISO 8601 time with a UTC offset, "
               "got \"2026-11-22 01:50\""),
    "spec and result disagree": (
        lambda d: edit_json(d / "result.json", lambda r: r.update(cell_id="0000000000000bad")),
        "0-1", "result.json: cell_id is \"0000000000000bad\" but spec.json says "
               "\"c0ffee0000000001\""),
    "directory name disagrees": (
        _rename_dir, "0-2",
        "0-2: directory name does not match spec.json (repeat 0, attempt 1: expected '0-1')"),
    "bad step record": (
        lambda d: edit_line(d / "events.jsonl", 5, lambda r: r.update(seconds="fast")),
        "0-1", "events.jsonl: line 5: step record key 'seconds' should be a number, got \"fast\""),
    "bad step phase": (
        lambda d: edit_line(d / "events.jsonl", 6, lambda r: r.update(phase="cooldown")),
        "0-1", "events.jsonl: line 6: step phase 'cooldown' is not 'warmup', 'timed' or 'sampled'"),
    "unknown phase name": (
        lambda d: edit_line(d / "events.jsonl", 6, lambda r: (r.clear(), r.update({"type": "phases", "step": 6, "seconds": 0.01,
                                                   "phases": {"forward": 0.004, "coffee": 0.001}}))),
        "0-1", "events.jsonl: line 6: phases record names \"coffee\", not a phase (input, h2d, forward, "
               "backward, exchange, update, or several joined by '+')"),
    "phases out of order": (
        lambda d: edit_line(d / "events.jsonl", 6, lambda r: (r.clear(), r.update({"type": "phases", "step": 6, "seconds": 0.01,
                                                   "phases": {"update+forward": 0.004}}))),
        "0-1", "events.jsonl: line 6: phases record names \"update+forward\", not a phase (input, h2d, "
               "forward, backward, exchange, update, or several joined by '+')"),
    "negative phase time": (
        lambda d: edit_line(d / "events.jsonl", 6, lambda r: (r.clear(), r.update({"type": "phases", "step": 6, "seconds": 0.01,
                                                   "phases": {"forward": -1}}))),
        "0-1", "events.jsonl: line 6: phases record's 'forward' should be a finite number of seconds >= 0, got -1"),
    "phases not an object": (
        lambda d: edit_line(d / "events.jsonl", 6, lambda r: (r.clear(), r.update({"type": "phases", "step": 6, "seconds": 0.01, "phases": [1]}))),
        "0-1", "events.jsonl: line 6: phases record key 'phases' should be an object, got [1]"),
    "ok run without summary": (
        lambda d: edit_line_raw(d / "events.jsonl", 13, '{"type": "note"}'),
        "0-1", "events.jsonl: has no summary record, but result.json says status ok"),
    "ok run without events": (
        lambda d: (d / "events.jsonl").unlink(),
        "0-1", "events.jsonl: is missing or empty, but result.json says status ok"),
    "symlinked file": (
        _symlink_events, "0-1",
        "events.jsonl: is a symbolic link; bundle files must be regular files"),
}


def edit_line_raw(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def test_each_bad_bundle_is_skipped_with_its_own_reason_and_the_good_ones_land(tmp_path: Path) -> None:
    # every case of BAD_BUNDLES in one results directory (a sweep each), between two good runs:
    # one ingest, and each bad bundle is named with exactly its reason
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    first = make_bundle(results, sweep="aaa-good", cell_id="900d000000000001")
    expected = []
    for n, case in enumerate(sorted(BAD_BUNDLES)):
        break_it, name, reason = BAD_BUNDLES[case]
        bad = make_bundle(results, sweep=f"bad-{n:02d}")
        break_it(bad)
        expected.append((bad.with_name(name).resolve(), reason))
    last = make_bundle(results, sweep="zzz-good", cell_id="900d000000000002")
    report = ingest([results], warehouse=wh)
    assert sorted(report.skipped) == sorted(expected)
    assert report.ingested == [first.resolve(), last.resolve()]
    assert report.incomplete == [] and report.unchanged == []
    assert rows(wh, "SELECT run_id FROM runs ORDER BY run_id") == [("900d000000000001/0-1",),
                                                                   ("900d000000000002/0-1",)]
    assert counts(wh) == {"runs": 2, "steps": 12, "epochs": 4, "monitor_samples": 4}


def test_incomplete_bundle_is_reported_apart(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    good = make_bundle(results, cell_id="900d000000000001")
    unfinished = make_bundle(results, with_result=False)
    with pytest.raises(BundleIncomplete) as err:
        load_bundle(unfinished)
    assert err.value.short() == ("result.json: missing: the run never finished "
                                 "(or is still running)")
    report = ingest([results], warehouse=wh)
    assert report.incomplete == [unfinished.resolve()]
    assert report.skipped == [] and report.ingested == [good.resolve()]
    assert counts(wh)["runs"] == 1
    make_bundle(results)  # the run finishes later: the next ingest picks it up
    report = ingest([results], warehouse=wh)
    assert report.ingested == [unfinished.resolve()]
    assert counts(wh)["runs"] == 2


def test_oversized_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    bad = make_bundle(results)
    size = (bad / "events.jsonl").stat().st_size
    monkeypatch.setattr(bundles_module, "MAX_FILE_BYTES", 1200)
    report = ingest([results], warehouse=wh)
    assert report.skipped == [(bad.resolve(), f"events.jsonl: is {size} bytes, over the "
                                              "1200 bytes limit for a bundle file")]


def test_missing_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        ingest([tmp_path / "nowhere"], warehouse=tmp_path / "w.duckdb")
    assert str(err.value) == (f"{tmp_path / 'nowhere'}: no such directory; give a results "
                              "directory or a bundle")
    assert not (tmp_path / "w.duckdb").exists()


def test_report_summary() -> None:
    report = IngestReport(ingested=[Path("/r/a/0-1"), Path("/r/a/1-1")],
                          unchanged=[Path("/r/b/0-1")],
                          skipped=[(Path("/r/c/0-1"), "result.json: is not a JSON object")],
                          incomplete=[Path("/r/d/0-1")])
    assert report.summary() == "ingested 2 run(s), 1 unchanged, 1 skipped, 1 incomplete"
    assert report.counts == {"ingested": 2, "unchanged": 1, "skipped": 1, "incomplete": 1}
    assert not report.clean
    assert IngestReport(ingested=[Path("/r/a/0-1")], incomplete=[Path("/r/d/0-1")]).clean


# -- one bad bundle never stops the others --------------------------------------------------


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


# What a bundle may hold once read (whatever bundles.read lets through, now or later) that
# no warehouse column can: each is put into the loaded bundle, so these test ingest alone.
HOSTILE: dict[str, tuple[Callable[[Bundle], None], str]] = {
    "exit code 10^30": (
        lambda b: b.result.update(exit_code=10**30),
        "cannot be stored: runs.exit_code: 1000000000000000000000000000000 does not fit its type "
        "int32 (OverflowError)"),
    "exit code 3e9": (
        lambda b: b.result.update(exit_code=3 * 10**9),
        "cannot be stored: runs.exit_code: 3000000000 does not fit its type int32 (ArrowInvalid)"),
    "repeat 3e9": (
        lambda b: setattr(b, "key", dataclasses.replace(b.key, repeat=3 * 10**9)),
        "cannot be stored: runs.repeat: 3000000000 does not fit its type int32 (ArrowInvalid)"),
    "params nested 100,000 deep": (
        lambda b: b.spec["params"].update(deep=_nested(100_000)),
        "cannot be stored: runs.params: nested too deeply (RecursionError)"),
    "step images 2^40": (
        lambda b: as_records(b, "steps")[0].update(images=2**40),
        "cannot be stored: steps.images: 1099511627776 does not fit its type int32 (ArrowInvalid)"),
    "step seconds a string": (
        lambda b: as_records(b, "steps")[0].update(seconds="fast"),
        "cannot be stored: steps.seconds: 'fast' does not fit its type double (ArrowInvalid)"),
    "rss 10^20": (
        lambda b: as_records(b, "monitor_samples")[0].update(rss_bytes=10**20),
        "cannot be stored: monitor_samples.rss_bytes: 100000000000000000000 does not fit its type "
        "int64 (OverflowError)"),
    "epoch without number": (
        lambda b: b.epochs[0].update(epoch=None),
        "cannot be stored: epochs.epoch: a record has no value, and the column needs one"),
    "layer without name": (
        lambda b: b.layers.append({"kind": "conv", "index": 0}),
        "cannot be stored: layers.name: a record has no value, and the column needs one"),
    "lone surrogate in a text column": (
        lambda b: b.result.update(error_tail="\ud800"),
        "cannot be stored: runs.error_tail: '\\ud800' does not fit its type string (UnicodeEncodeError)"),
    "time that is not one": (
        lambda b: b.result.update(started_at="yesterday"),
        "cannot be stored: Invalid isoformat string: 'yesterday' (ValueError)"),
    # Arrow takes this one; the warehouse refuses it (JSON with a lone surrogate), so the
    # bulk transaction rolls back and each bundle goes in on its own.
    "lone surrogate in JSON": (
        lambda b: b.spec["params"].update(model="\ud800"),
        "the warehouse refused it: Conversion Error: Malformed JSON at byte "),
}


def _inject(monkeypatch: pytest.MonkeyPatch, changes: dict[Path, Callable[[Bundle], None]]) -> None:
    """Make ingest's loader return these bundles changed after they were read."""
    real = ingest_module.load_bundle

    def load(directory: Path) -> Bundle:
        bundle = real(directory)
        change = changes.get(Path(directory).resolve())
        if change is not None:
            change(bundle)
        return bundle

    monkeypatch.setattr(ingest_module, "load_bundle", load)


def test_a_value_no_column_can_hold_skips_that_bundle_alone_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every case of HOSTILE in one ingest, among good runs before, between and after them
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    good = [make_bundle(results, cell_id=f"{prefix}00000000000{n}") for n, prefix in enumerate(("0000", "5555", "ffff"))]
    bad = {}
    for n, case in enumerate(sorted(HOSTILE)):
        cell = f"{'0bad' if n % 2 else 'abad'}{n:012x}"
        bad[make_bundle(results, cell_id=cell).resolve()] = HOSTILE[case]
    _inject(monkeypatch, {path: change for path, (change, _) in bad.items()})
    report = ingest([results], warehouse=wh)
    assert sorted(path for path, _ in report.skipped) == sorted(bad)
    for path, given in report.skipped:
        reason = bad[path][1]  # a reason ending in a space is a prefix (DuckDB's text follows)
        assert given.startswith(reason) if reason.endswith(" ") else given == reason, (path, given)
    assert report.ingested == [g.resolve() for g in good]
    assert counts(wh) == {"runs": 3, "steps": 18, "epochs": 6, "monitor_samples": 6}
    assert rows(wh, "SELECT count(*) FROM layers") == [(0,)]
    monkeypatch.undo()
    assert ingest([results], warehouse=wh).counts == {  # the bundles on disk are fine: they go in now
        "ingested": len(bad), "unchanged": 3, "skipped": 0, "incomplete": 0}


@pytest.mark.parametrize("error", [RecursionError("maximum recursion depth exceeded"),
                                   PermissionError(13, "Permission denied"),
                                   MemoryError()])
def test_whatever_reading_one_bundle_raises_skips_it_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    good = make_bundle(results, cell_id="900d000000000001")
    bad = make_bundle(results)
    real = ingest_module.load_bundle

    def load(directory: Path) -> Bundle:
        if Path(directory) == bad.resolve():
            raise error
        return real(directory)

    monkeypatch.setattr(ingest_module, "load_bundle", load)
    report = ingest([results], warehouse=wh)
    assert report.skipped == [(bad.resolve(), {
        RecursionError: "cannot be read: nested too deeply (RecursionError)",
        PermissionError: "cannot be read: [Errno 13] Permission denied (PermissionError)",
        MemoryError: "cannot be read: MemoryError"}[type(error)])]
    assert report.ingested == [good.resolve()]


# -- transactions ------------------------------------------------------------------------


def test_failure_mid_transaction_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wh = tmp_path / "w.duckdb"
    make_bundle(tmp_path / "first")
    ingest([tmp_path / "first"], warehouse=wh)
    before = counts(wh)
    for repeat in range(1, 4):
        make_bundle(tmp_path / "second", repeat=repeat)

    real_insert = ingest_module._insert_table
    inserted: list[str] = []

    def insert_then_fail(con: duckdb.DuckDBPyConnection, name: str, table: Any) -> None:
        if name == "epochs":  # runs and steps are already written inside the transaction
            raise duckdb.IOException("IO Error: disk full")
        real_insert(con, name, table)
        inserted.append(name)

    monkeypatch.setattr(ingest_module, "_insert_table", insert_then_fail)
    with pytest.raises(WarehouseError) as err:
        ingest([tmp_path / "second"], warehouse=wh)
    assert str(err.value) == (f"ingest into warehouse {wh} failed and was rolled back, nothing "
                              "was written: IO Error: disk full")
    assert inserted == ["runs", "steps"]
    assert counts(wh) == before == {"runs": 1, "steps": 6, "epochs": 2, "monitor_samples": 2}

    monkeypatch.setattr(ingest_module, "_insert_table", real_insert)
    report = ingest([tmp_path / "second"], warehouse=wh)
    assert len(report.ingested) == 3
    assert counts(wh) == {"runs": 4, "steps": 24, "epochs": 8, "monitor_samples": 8}


def test_non_database_error_also_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wh = tmp_path / "w.duckdb"
    make_bundle(tmp_path / "results")
    real_insert = ingest_module._insert_table

    def insert_then_crash(con: duckdb.DuckDBPyConnection, name: str, table: Any) -> None:
        real_insert(con, name, table)
        if name == "monitor_samples":
            raise KeyboardInterrupt

    monkeypatch.setattr(ingest_module, "_insert_table", insert_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ingest([tmp_path / "results"], warehouse=wh)
    assert counts(wh) == {"runs": 0, "steps": 0, "epochs": 0, "monitor_samples": 0}


# -- volume ------------------------------------------------------------------------------


def test_hundred_bundles_of_a_thousand_steps(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    seconds = [0.02] * 10 + [0.01] * 990
    for cell in range(20):
        for repeat in range(5):
            make_bundle(results, cell_id=f"{cell:016x}", repeat=repeat, step_seconds=seconds,
                        warmup_steps=10)
    report = ingest([results], warehouse=wh)
    assert len(report.ingested) == 100 and report.skipped == []
    assert counts(wh) == {"runs": 100, "steps": 100_000, "epochs": 200, "monitor_samples": 200}
    assert rows(wh, "SELECT phase, count(*), sum(images) FROM steps GROUP BY phase "
                    "ORDER BY phase") == [("timed", 99_000, 99_000 * 64), ("warmup", 1_000, 64_000)]
    assert rows(wh, "SELECT count(DISTINCT run_id), min(throughput), max(throughput) "
                    "FROM runs") == [(100, 6400.0, 6400.0)]
    assert rows(wh, "SELECT count(*) FROM (SELECT run_id FROM steps GROUP BY run_id "
                    "HAVING count(*) = 1000 AND max(step) = 999)") == [(100,)]


def test_the_harness_writes_the_file_names_the_bundle_layout_declares():
    # The harness cannot import warehouse/bundles/layout.py (stdlib + framework only): the names
    # it writes are checked against the layout here instead.
    import inspect

    from matrun.runner.harness import cell, launch
    from matrun.warehouse.bundles import layout

    assert (launch.STDOUT_LOG, launch.STDERR_LOG) == (layout.STDOUT, layout.STDERR)
    assert f'out_dir / "{layout.EVENTS}"' in inspect.getsource(cell.run_cell)


# -- the command line: what it prints and the exit codes a script can trust ------------------

MATRUN = [sys.executable, "-m", "matrun.runner.cli.main"]


def matrun(*args: object, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *MATRUN, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd="/")


def test_cli_exits_0_when_nothing_was_skipped(tmp_path: Path) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    make_bundle(results, repeat=0)
    unfinished = make_bundle(results, repeat=1, with_result=False)
    res = matrun("ingest", results, "--warehouse", wh)
    assert (res.returncode, res.stdout) == (0, "ingested 1 run(s), 0 unchanged, 0 skipped, 1 incomplete\n")
    assert res.stderr == f"incomplete (no result.json yet): {unfinished.resolve()}\n"
    res = matrun("ingest", results, "--warehouse", wh)
    assert (res.returncode, res.stdout) == (0, "ingested 0 run(s), 1 unchanged, 0 skipped, 1 incomplete\n")


@pytest.mark.parametrize("allow", [False, True])
def test_cli_exits_1_when_a_bundle_was_skipped_unless_allowed(tmp_path: Path, allow: bool) -> None:
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    good = make_bundle(results, cell_id="900d000000000001")
    bad = make_bundle(results)
    edit_json(bad / "result.json", lambda r: r.update(schema_version=7))
    res = matrun("ingest", results, "--warehouse", wh, *(["--allow-skipped"] if allow else []))
    assert res.stdout == "ingested 1 run(s), 0 unchanged, 1 skipped, 0 incomplete\n"
    skipped = (f"skipped {bad.resolve()}: result.json: has schema_version 7; this matrun reads 1: "
               "upgrade matrun\n")
    if allow:
        assert (res.returncode, res.stderr) == (0, skipped)
    else:
        assert (res.returncode, res.stderr) == (1, skipped + (
            "Error: 1 bundle(s) skipped (reasons above); they stay on disk and are not in the "
            "warehouse (--quarantine sets them aside, --allow-skipped exits 0 all the same)\n"))
    assert rows(wh, "SELECT bundle_path FROM runs") == [(str(good.resolve()),)]


def test_cli_exits_1_when_every_bundle_was_skipped_or_conflicts(tmp_path: Path) -> None:
    wh = tmp_path / "w.duckdb"
    make_bundle(tmp_path / "one")
    assert matrun("ingest", tmp_path / "one", "--warehouse", wh).returncode == 0
    make_bundle(tmp_path / "two", wall_seconds=99.0)  # the same run, other content: a conflict
    res = matrun("ingest", tmp_path / "two", "--warehouse", wh)
    assert res.returncode == 1
    assert res.stdout == "ingested 0 run(s), 0 unchanged, 1 skipped, 0 incomplete\n"
    assert "conflict: run c0ffee0000000001/0-1 is already in the warehouse" in res.stderr
    assert res.stderr.endswith("Error: 1 bundle(s) skipped (reasons above); they stay on disk and are "
                               "not in the warehouse (--quarantine sets them aside, --allow-skipped exits 0 "
                               "all the same)\n")


def _unreadable(path: Path) -> list[str]:
    """Make ``path`` unreadable; return the command prefix under which that holds (root reads
    everything, so it runs without the capabilities that let it)."""
    path.chmod(0)
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("as root, an unreadable directory needs setpriv to drop the capabilities")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("case", ["missing", "a file", "unreadable", "name too long", "path too long"])
def test_cli_refuses_a_path_it_cannot_read_with_exit_2(tmp_path: Path, case: str) -> None:
    wh, prefix = tmp_path / "w.duckdb", []
    if case == "missing":
        path = tmp_path / "nowhere"
        reason = "no such directory; give a results directory or a bundle"
    elif case == "a file":
        path = tmp_path / "notes.txt"
        path.write_text("not results\n")
        reason = "is not a directory; give a results directory or a bundle"
    elif case == "unreadable":
        path = tmp_path / "locked"
        make_bundle(path)
        prefix = _unreadable(path)
        reason = "cannot be read: Permission denied"
    elif case == "name too long":
        path = tmp_path / ("r" * 300)
        reason = "cannot be read: file name too long"
    else:
        path = Path("/".join([str(tmp_path)] + ["d" * 200] * 25))
        reason = "cannot be read: file name too long"
    try:
        res = matrun("ingest", path, "--warehouse", wh, prefix=prefix)
    finally:
        if case == "unreadable":
            path.chmod(0o755)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == f"Error: {shown(path)}: {reason}\n"
    assert not wh.exists()


def test_cli_refuses_a_warehouse_name_too_long_with_exit_2(tmp_path: Path) -> None:
    make_bundle(tmp_path / "results")
    wh = tmp_path / ("w" * 300 + ".duckdb")
    res = matrun("ingest", tmp_path / "results", "--warehouse", wh)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == f"Error: warehouse {shown(wh)}: file name too long\n"


def test_a_bundle_read_in_many_bulk_blocks_is_ingested_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps and samples read in bulk, block by block (a few hundred lines each), reach the
    warehouse as the rows written, in one run."""
    results, wh = tmp_path / "results", tmp_path / "w.duckdb"
    seconds = [0.01 + n / 10**6 for n in range(5000)]
    make_bundle(results, step_seconds=seconds, warmup_steps=10,
                monitor=[(0.5 * k, 50.0, 5.0, 0.0, 10**8 + k) for k in range(1, 1001)])
    monkeypatch.setattr(bundles_module, "BLOCK_BYTES", 32 * 1024)
    assert ingest([results], warehouse=wh).ingested
    assert rows(wh, "SELECT run_id, count(*), min(step), max(step), sum(images), "
                    "count(*) FILTER (WHERE phase = 'warmup'), round(sum(seconds), 6) FROM steps "
                    "GROUP BY run_id") == [(RUN, 5000, 0, 4999, 5000 * 64, 10, round(sum(seconds), 6))]
    assert rows(wh, "SELECT count(*), max(rss_bytes), sum(t) FROM monitor_samples") == [
        (1000, 10**8 + 1000, 0.5 * 1000 * 1001 / 2)]


def test_an_unchanged_bundle_is_recognised_without_reading_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w.duckdb"
    first = make_bundle(tmp_path / "results", cell_id="a" * 16)
    second = make_bundle(tmp_path / "results", cell_id="b" * 16)
    assert len(ingest([tmp_path / "results"], warehouse=path).ingested) == 2
    read: list[Path] = []
    real = ingest_module.load_bundle
    monkeypatch.setattr(ingest_module, "load_bundle", lambda d: read.append(Path(d)) or real(d))
    again = ingest([tmp_path / "results"], warehouse=path)
    assert again.counts == {"ingested": 0, "unchanged": 2, "skipped": 0, "incomplete": 0}
    assert read == []  # recognised by their stat fingerprint alone
    # A bundle touched since (same content, new mtime) is read again, and found unchanged by
    # its digest; one whose content changed is a conflict, never an overwrite.
    os.utime(first / "events.jsonl", ns=(1, 1))
    events = second / "events.jsonl"
    events.write_text(events.read_text(encoding="utf-8").replace('"images": 64', '"images": 32', 1),
                      encoding="utf-8")
    third = ingest([tmp_path / "results"], warehouse=path)
    assert sorted(read) == sorted([first.resolve(), second.resolve()])
    assert third.unchanged == [first.resolve()]
    assert [p for p, _ in third.skipped] == [second.resolve()]
    assert third.skipped[0][1].startswith(f"conflict: run {'b' * 16}/0-1 is already in the warehouse")
