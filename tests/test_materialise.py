"""The caches of the study views (warehouse/materialise.py, migration 006, docs/WAREHOUSE.md
"Views at scale"): each ingest fills them with exactly what the views compute live, the
views read them, only what changed is computed again, a registered study's findings follow,
and a cache that does not match the warehouse's runs is refused, never read.

The warehouse is the report's study fixture (every study view has rows) with a study whose
findings use most check kinds, registered before the ingest as a sweep would.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from bundle_factory import make_bundle
from lake_client import plain_writer
from matrun.warehouse import materialise
from matrun.warehouse.db import open_warehouse, view_sql
from matrun.warehouse.findings import parse_study, register_study
from matrun.warehouse.ingest import ingest
from report_fixture import BASE, SWEEP, write_study_bundles

SENTINEL = 0.123456789
FINDINGS = [
    {"id": "over", "claim": "c", "cite": "T", "check": "oversubscription", "x": "threads", "metric": "throughput"},
    {"id": "same-accuracy", "claim": "c", "cite": "T", "check": "bounded", "x": "threads", "metric": "accuracy"},
    {"id": "longer", "claim": "c", "cite": "T", "check": "trend", "x": "epochs", "metric": "accuracy",
     "expect": "increases"},
    {"id": "layout", "claim": "c", "cite": "T", "check": "option", "x": "layout", "value": "nhwc",
     "ref": "nchw", "metric": "throughput", "expect": "increases"},
    {"id": "gpus", "claim": "c", "cite": "T", "check": "sublinear", "x": "gpus", "metric": "throughput"},
    {"id": "convs", "claim": "c", "cite": "T", "check": "largest_share", "kind": "conv"},
]
CACHED = [cache.view for cache in materialise.CACHED]


def build(root: Path) -> Path:
    results = root / "results"
    write_study_bundles(results)
    path = root / "w.duckdb"
    errors: list[Any] = []
    decl = parse_study({"study": {"id": "demo", "title": "demo"}, "findings": FINDINGS},
                       lambda where, message: errors.append((where, message)))
    assert decl is not None and not errors, errors
    cells = sorted({p.parent.parent.name for p in results.rglob("spec.json")})
    with open_warehouse(path) as wh:  # as `matrun sweep` records its study before the runs
        register_study(wh.con, decl, profile=None, matrix="demo.toml", cell_ids=cells)
    assert not ingest([results], warehouse=path).skipped
    return path


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return build(tmp_path)


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    """The rows, comparable: NaN equal to itself, and floats to 12 significant digits (a sum
    of doubles depends on the order DuckDB adds them in, which no query fixes)."""
    return [_comparable(row) for row in con.execute(sql).fetchall()]


def _comparable(value: Any) -> Any:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else float(f"{value:.12g}")
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _comparable(v)) for k, v in value.items())
    return value


def study_views() -> list[str]:
    return [name for name, sql in view_sql().items()
            if ("cell_facts" in sql or "cell_cache" in sql) and name != "cell_facts_live"]


def live_and_cached(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Every cached view's rows as it reads them and as its live view computes them (each in
    its own order: the cached view's ORDER BY must give the live view's order)."""
    cached = {name: rows(con, f"SELECT * FROM {name}") for name in CACHED}
    live = {name: rows(con, f"SELECT * FROM {name}_live") for name in CACHED}
    return cached, live


def test_the_cache_has_the_columns_of_the_computed_rows(warehouse: Path) -> None:
    with open_warehouse(warehouse, read_only=True) as wh:
        live = wh.con.execute("DESCRIBE SELECT * FROM cell_facts_live").fetchall()
        cache = wh.con.execute("DESCRIBE SELECT * FROM cell_cache").fetchall()
        facts = wh.con.execute("DESCRIBE SELECT * FROM cell_facts").fetchall()
        views = {name: (wh.con.execute(f"DESCRIBE SELECT * FROM {name}").fetchall(),
                        wh.con.execute(f"DESCRIBE SELECT * FROM {name}_live").fetchall()) for name in CACHED}
    assert [c[:2] for c in cache] == [c[:2] for c in live] + [("fingerprint", "UBIGINT")]
    assert [c[:2] for c in facts] == [c[:2] for c in cache]
    for name, (public, computed) in views.items():
        assert [c[:2] for c in public] == [c[:2] for c in computed], name


def test_the_cached_rows_are_the_computed_ones(warehouse: Path) -> None:
    with open_warehouse(warehouse, read_only=True) as wh:
        cached = rows(wh.con, "SELECT * EXCLUDE (fingerprint) FROM cell_facts ORDER BY cell_id")
        computed = rows(wh.con, "SELECT * FROM cell_facts_live ORDER BY cell_id")
        assert materialise.current(wh.con)
    assert len(cached) == 27 and cached == computed


def test_every_cached_view_reads_the_rows_it_computes_in_its_order(warehouse: Path) -> None:
    assert {"thread_sweep", "pareto_front", "findings", "epoch_convergence", "baseline"} <= set(CACHED)
    assert set(CACHED) <= set(view_sql())
    with open_warehouse(warehouse, read_only=True) as wh:
        cached, live = live_and_cached(wh.con)
    assert all(cached[name] for name in ("thread_sweep", "pareto_front", "findings", "epoch_convergence"))
    assert cached == live


def test_the_views_read_their_cache(warehouse: Path) -> None:
    """What a cached view answers is its table's: a changed cached value shows."""
    with open_warehouse(warehouse) as wh:
        wh.con.execute(f"UPDATE view_cache_thread_sweep SET p_value = {SENTINEL} WHERE p_value IS NOT NULL")
        wh.con.execute("UPDATE view_cache_findings SET claim = 'from the cache'")
    with open_warehouse(warehouse, read_only=True) as wh:
        seen = {v for (v,) in wh.con.execute("SELECT p_value FROM thread_sweep WHERE p_value IS NOT NULL").fetchall()}
        claims = {v for (v,) in wh.con.execute("SELECT claim FROM findings").fetchall()}
    assert seen == {SENTINEL} and claims == {"from the cache"}


def test_an_ingest_computes_again_only_the_cells_whose_runs_changed(warehouse: Path, tmp_path: Path) -> None:
    with open_warehouse(warehouse) as wh:
        wh.con.execute("UPDATE cell_cache SET train_s_median = -1 WHERE cell_id = 't2-b64'")
    make_bundle(tmp_path / "more", sweep=SWEEP, cell_id="t4-b64", repeat=7,
                params={**BASE, "threads": 4, "batch_size": 64}, throughput=900.0)
    assert ingest([tmp_path / "more"], warehouse=warehouse).counts["ingested"] == 1
    with open_warehouse(warehouse, read_only=True) as wh:
        got = dict(wh.con.execute("SELECT cell_id, train_s_median FROM cell_stats "
                                  "WHERE cell_id IN ('t2-b64', 't4-b64')").fetchall())
        runs = wh.con.execute("SELECT runs, throughput_median FROM cell_stats WHERE cell_id = 't4-b64'").fetchone()
        computed = rows(wh.con, "SELECT * FROM cell_facts_live WHERE cell_id = 't4-b64'")
        cached = rows(wh.con, "SELECT * EXCLUDE (fingerprint) FROM cell_facts WHERE cell_id = 't4-b64'")
    assert got["t2-b64"] == -1  # not computed again: its runs did not change
    assert runs == (5, 306.0) and cached == computed


def test_the_cached_views_follow_a_changed_cell(warehouse: Path, tmp_path: Path) -> None:
    """A much faster and more accurate run of one cell moves it in every view that shows it:
    after the ingest every cached view holds what it computes live."""
    with open_warehouse(warehouse, read_only=True) as wh:
        before_front = wh.con.execute("SELECT dominated_by FROM pareto_front WHERE cell_id = 't1-b64'").fetchone()
        before, _ = live_and_cached(wh.con)
    make_bundle(tmp_path / "more", sweep=SWEEP, cell_id="t1-b64", repeat=9,
                params={**BASE, "threads": 1, "batch_size": 64}, throughput=5000.0,
                epochs=({"train_loss": 0.1, "train_accuracy": 0.99, "test_loss": 0.1,
                         "test_accuracy": 0.99, "epoch_seconds": 1.0, "test_seconds": 1.0},))
    ingest([tmp_path / "more"], warehouse=warehouse)
    with open_warehouse(warehouse, read_only=True) as wh:
        after_front = wh.con.execute("SELECT dominated_by FROM pareto_front WHERE cell_id = 't1-b64'").fetchone()
        cached, live = live_and_cached(wh.con)
    assert after_front != before_front  # faster and more accurate: fewer dominate it
    assert cached == live
    changed = {name for name in CACHED if cached[name] != before[name]}
    assert {"thread_sweep", "pareto_front", "baseline", "epoch_convergence", "epoch_curve"} <= changed


def test_new_cells_joining_cached_groups_and_starting_new_ones_leave_every_view_as_computed(
        warehouse: Path, tmp_path: Path) -> None:
    """An ingest deletes a view's cached rows only for the keys a cell cached before it had
    (materialise.before_sql): a new cell that joins existing groups (a thread count, a batch size
    of cached configurations) has its groups' rows replaced, not doubled; one whose groups are all
    new (another model) adds its rows; and the deletes of the keys no cached cell had are not
    issued at all."""
    make_bundle(tmp_path / "join", sweep=SWEEP, cell_id="t8-b64", repeat=0,
                params={**BASE, "threads": 8, "batch_size": 64}, throughput=700.0)
    make_bundle(tmp_path / "join", sweep=SWEEP, cell_id="t2-b96", repeat=0,
                params={**BASE, "threads": 2, "batch_size": 96}, throughput=650.0)
    make_bundle(tmp_path / "new", sweep=SWEEP, cell_id="alex-t1", repeat=0,
                params={**BASE, "model": "alexnet", "threads": 1}, throughput=90.0)
    deletes: list[str] = []
    real = materialise.refresh_view

    def spy(con, cache, keys, *, empty=False, held=None):
        if keys and held is not None:
            deletes.extend(f"{cache.view}:{key}" for key in held)
        real(con, cache, keys, empty=empty, held=held)

    try:
        materialise.refresh_view = spy
        assert ingest([tmp_path / "join", tmp_path / "new"], warehouse=warehouse).counts["ingested"] == 3
    finally:
        materialise.refresh_view = real
    with open_warehouse(warehouse, read_only=True) as wh:
        cached, live = live_and_cached(wh.con)
        alex = wh.con.execute("SELECT count(*) FROM baseline WHERE cell_id = 'alex-t1'").fetchone()[0]
    assert cached == live and alex == 1
    assert any(d.startswith("thread_sweep:") for d in deletes)  # t8 joined the cached thread sweep
    assert not any(d.startswith(("baseline:", "epoch_curve:", "epoch_convergence:")) for d in deletes)  # new cells


def test_registering_a_study_fills_its_findings(warehouse: Path) -> None:
    errors: list[Any] = []
    decl = parse_study({"study": {"id": "later", "title": "later"}, "findings": FINDINGS[:2]},
                       lambda where, message: errors.append((where, message)))
    assert decl is not None and not errors
    with open_warehouse(warehouse) as wh:
        cells = [c for (c,) in wh.con.execute("SELECT cell_id FROM cell_facts").fetchall()]
        register_study(wh.con, decl, profile=None, matrix="later.toml", cell_ids=cells)
    with open_warehouse(warehouse, read_only=True) as wh:
        cached, live = live_and_cached(wh.con)
        studies = {s for (s,) in wh.con.execute("SELECT study FROM findings").fetchall()}
    assert studies == {"demo", "later"} and cached == live


def test_a_cache_that_does_not_match_the_runs_is_refused_until_a_writer_refreshes_it(warehouse: Path) -> None:
    con = plain_writer(warehouse)  # another client removes a run behind matrun's back
    try:
        con.execute("DELETE FROM runs WHERE run_id = (SELECT min(run_id) FROM runs WHERE cell_id = 't2-b64')")
    finally:
        con.close()
    with open_warehouse(warehouse, read_only=True) as wh:
        assert not materialise.current(wh.con)
        for view in ("cell_stats", "thread_sweep", "findings"):
            with pytest.raises(duckdb.InvalidInputException, match="out of date .* run `matrun ingest`"):
                wh.con.execute(f"SELECT * FROM {view}").fetchall()
        assert wh.con.execute("SELECT count(*) FROM run_overview").fetchone()[0] > 0  # the rest answers
    with open_warehouse(warehouse) as wh:
        assert materialise.ensure_current(wh.con) and not materialise.ensure_current(wh.con)
    with open_warehouse(warehouse, read_only=True) as wh:
        assert wh.con.execute("SELECT runs FROM cell_stats WHERE cell_id = 't2-b64'").fetchone() == (3,)


def test_other_views_or_macros_compute_every_cell_again(warehouse: Path) -> None:
    with open_warehouse(warehouse) as wh:
        wh.con.execute("UPDATE cell_cache SET train_s_median = -1")
        wh.con.execute("UPDATE cache_state SET digest = 'of an older matrun'")
    with open_warehouse(warehouse, read_only=True) as wh:
        with pytest.raises(duckdb.InvalidInputException, match="out of date"):
            wh.con.execute("SELECT * FROM cell_stats").fetchall()
    with open_warehouse(warehouse) as wh:
        assert materialise.ensure_current(wh.con)
        assert wh.con.execute("SELECT count(*) FROM cell_stats WHERE train_s_median = -1").fetchone() == (0,)


def test_an_empty_warehouse_answers_with_no_rows(tmp_path: Path) -> None:
    with open_warehouse(tmp_path / "w.duckdb") as wh:
        assert materialise.current(wh.con)
        for view in study_views():
            wh.con.execute(f"SELECT * FROM {view}").fetchall()
        assert wh.con.execute("SELECT count(*) FROM cell_stats").fetchone() == (0,)
