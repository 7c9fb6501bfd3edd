"""The caches the study views read, refreshed in each ingest's transaction (docs/WAREHOUSE.md
"Views at scale").

The study views group and compare cells.  Computed at every read, that meant every cell's
statistics from all the runs (each run's JSON records parsed again), a Mann-Whitney test per
row and a quadratic Pareto count: seconds per view with 100,000 runs.  So they are kept, and
:func:`refresh` brings them up to date with the runs just written, inside the same
transaction, so a reader sees runs and caches together:

- ``cell_cache`` (migration 006): the rows of view ``cell_facts_live`` (every cell's
  statistics and what the views read beside them), each with the fingerprint of the cell's
  runs it was computed from: only cells whose fingerprint changed are computed again;
- ``view_cache_<view>``, one per view of :data:`CACHED`: that view's rows, as its live
  definition (view ``<view>_live``, the SQL of ``views/<view>.sql``) gives them.  Each row
  belongs to one key (a cell, a configuration, a group of cells, a study), and an ingest
  computes again only the rows of the keys its changed cells touch;
- ``cache_state``: the runs and the view digest the caches were filled from.  The cached
  views refuse to answer while it does not match the warehouse (:func:`current`).

A cached view's name stays the view users read (``thread_sweep``); db.create_views makes it
``SELECT * FROM view_cache_thread_sweep`` in the order of :data:`CACHED` once the cache is
checked.  Needs the views and macros of this matrun (a writer connection has them).  Imports
nothing of matrun, so that any writer may call it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources

import duckdb


@dataclass(frozen=True)
class Cached:
    """A view kept in ``view_cache_<view>``: ``key``, an expression over the view's rows, names
    the part a row belongs to; ``changed``, a query over ``_matrun_changed`` (the cell_cache
    rows of the changed cells, before and after), gives the keys whose rows may change with
    those cells; ``order`` is the view's ORDER BY, over its columns."""

    view: str
    key: str
    changed: str
    order: str
    #: (text of views/<view>.sql, what replaces it given the keys): the keys' rows computed
    #: from only what they read, where DuckDB would not push the keys down itself
    narrow: tuple[str, str] | None = None
    #: whether every row comes from cells (so the cache is empty while cell_cache is), and
    #: belongs to a key of those cells
    from_cells: bool = True
    #: the expressions over a cell's group keys that give the keys its rows belong to, where
    #: ``changed`` is not ``SELECT DISTINCT <expression> FROM _matrun_changed``
    cell_keys: tuple[str, ...] = ()

    @property
    def table(self) -> str:
        return f"view_cache_{self.view}"

    @property
    def live(self) -> str:
        return f"{self.view}_live"


def _by(column: str) -> str:
    return f"SELECT DISTINCT {column} FROM _matrun_changed"


_FMDD = "concat_ws('|', framework, model, dataset, device)"
_MDD = "concat_ws('|', model, dataset, device)"

#: The cached views, in dependency order (best_vs_default reads default_cells).
CACHED: tuple[Cached, ...] = (
    Cached("baseline", "cell_id", _by("cell_id"), "sweep, framework, model, dataset, cell_id"),
    Cached("epoch_curve", "cell_id", _by("cell_id"), "sweep, cell_id, epoch"),
    Cached("epoch_convergence", "cell_id", _by("cell_id"), "framework, model, dataset, cell_id, epoch"),
    Cached("thread_sweep", "config", _by("config_threads"),
           "framework, model, dataset, config, threads_n NULLS LAST, cell_id"),
    Cached("batch_sweep", "config", _by("config_batch"),
           "framework, model, dataset, mode, config, batch_size, cell_id"),
    Cached("batch_resources", "config", _by("config_batch"),
           "framework, model, dataset, mode, config, batch_size, cell_id"),
    Cached("batch_lr_grid", "config", _by("config_lr_grid"),
           "framework, model, dataset, config, batch_size, iterations, epochs, lr, cell_id"),
    Cached("epoch_sweep", "config", _by("config_length"),
           "framework, model, dataset, config, unit, length, cell_id"),
    Cached("library_comparison", "config", _by("config_library"),
           "framework, model, dataset, config, variant, onednn DESC, cell_id"),
    Cached("worker_scaling", "config", _by("config_workers"),
           "framework, model, dataset, config, workers, global_batch, cell_id"),
    Cached("option_effect", "config",
           "SELECT DISTINCT unnest([config_conv_algo, config_layout, config_precision, config_onednn]) "
           "FROM _matrun_changed",
           "option, framework, model, dataset, device, config, value",
           cell_keys=("config_conv_algo", "config_layout", "config_precision", "config_onednn")),
    Cached("default_cells", _FMDD, _by(_FMDD), "framework, model, dataset, device, mode"),
    Cached("best_vs_default", _FMDD, _by(_FMDD), "framework, model, dataset, device"),
    Cached("pareto_front", _MDD, _by(_MDD),
           "model, dataset, device, train_s_median, accuracy_median DESC, cell_id"),
    Cached("findings", "study",
           "SELECT DISTINCT study FROM study_cells WHERE cell_id IN (SELECT cell_id FROM _matrun_changed)",
           "study, position, config NULLS LAST, cell_id",
           narrow=("SELECT * FROM study_cells  -- materialise.py reads only the studies it computes again",
                   "SELECT * FROM study_cells WHERE study IN ({keys})"),
           from_cells=False),  # a registered study has findings before it has runs
)
CACHED_BY_VIEW = {cache.view: cache for cache in CACHED}

#: More changed cells than this (or other views, or an empty cache): every cached view is
#: computed again whole.
MANY_CELLS = 1000

#: More keys than this for one view: its whole cache is computed again (one query over
#: everything is faster than a filter naming thousands of keys).
MANY_KEYS = 200

#: What places a cell in the views' groups (what the ``changed`` queries read).
_GROUP_KEYS = ("cell_id, framework, model, dataset, device, config_threads, config_batch, config_lr_grid, "
               "config_length, config_library, config_workers, config_conv_algo, config_layout, "
               "config_precision, config_onednn")

#: The runs view cell_facts_live reads, and what refresh reads instead.
_ALL_RUNS = "SELECT * FROM runs  -- materialise.py reads only the runs of the cells it computes again"
_STALE_RUNS = "SELECT * FROM runs WHERE cell_id IN (SELECT cell_id FROM _matrun_stale)"

_DIGEST = "matrun_views_digest()"  # the macro db.create_views writes: these views' digest

# What a cell's statistics are computed from, per cell: its runs' columns the statistics
# read (their JSON records never change after an ingest; bundle_digest stands for them; the
# run id holds the repeat, busy_start which runs are set aside, design_level their level) and the BLAS of their images.
_FINGERPRINTS = """
    CREATE OR REPLACE TEMP TABLE _matrun_fingerprints AS
    SELECT r.cell_id,
        hash(count(*), bit_xor(hash(r.run_id, r.sweep, r.env_id, r.status, r.train_seconds,
                                    r.test_seconds, r.accuracy, r.throughput, r.diverged,
                                    r.cpu_user_avg, r.cpu_system_avg, r.cpu_total_avg, r.iowait_avg,
                                    r.rss_avg_bytes, r.rss_peak_bytes, r.mismatches, r.busy_start, r.design_level,
                                    r.bundle_digest, i.blas))) AS fingerprint
    FROM runs AS r
    LEFT JOIN images AS i ON i.tag = r.image_tag
    GROUP BY r.cell_id
"""

_STALE_CELLS = """
    CREATE OR REPLACE TEMP TABLE _matrun_stale AS
    SELECT f.cell_id, f.fingerprint
    FROM _matrun_fingerprints AS f
    LEFT JOIN cell_cache AS c ON c.cell_id = f.cell_id AND c.fingerprint = f.fingerprint
    WHERE c.cell_id IS NULL
"""

_TEMP_TABLES = ("_matrun_fingerprints", "_matrun_stale", "_matrun_changed", "_matrun_before")


def _cell_keys(cache: Cached) -> tuple[str, ...]:
    """The expressions over a cell's group keys whose values are the keys of ``cache``'s rows
    that cell belongs to (what its ``changed`` query selects from ``_matrun_changed``)."""
    if cache.cell_keys:
        return cache.cell_keys
    prefix, suffix = "SELECT DISTINCT ", " FROM _matrun_changed"
    if not (cache.changed.startswith(prefix) and cache.changed.endswith(suffix)):
        raise RuntimeError(f"the cached view {cache.view} must name its cell_keys")
    return (cache.changed[len(prefix):-len(suffix)],)


@functools.lru_cache(maxsize=1)
def before_sql() -> str:
    """``_matrun_before``: the group keys of the cells the cache held before this refresh that
    share a key of some cached view with a changed cell (the changed cells' old rows included).
    A row of a view made from cells (``Cached.from_cells``) belongs to a key only while a cell
    of that key is cached, so a key none of these cells has holds no row to delete: most keys
    of new cells are new, and a DuckLake DELETE costs ~30 ms even when it matches nothing."""
    shares = dict.fromkeys(f"{expr} IN ({cache.changed})" for cache in CACHED if cache.from_cells
                           for expr in _cell_keys(cache) if expr != "cell_id")
    return (f"CREATE OR REPLACE TEMP TABLE _matrun_before AS\n"
            f"SELECT {_GROUP_KEYS} FROM _matrun_changed WHERE was_cached\n"
            f"UNION ALL\n"
            f"SELECT {_GROUP_KEYS} FROM cell_cache\n"
            f"WHERE cell_id NOT IN (SELECT cell_id FROM _matrun_changed)\n"
            f"  AND ({chr(10).join(('' if i == 0 else '    OR ') + share for i, share in enumerate(shares))})")


def current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the cell cache holds what the warehouse's runs give with these views."""
    return bool(con.execute("SELECT caches_match()").fetchone()[0])


def ensure_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Refresh the caches in a transaction of their own when they are out of date (a writer
    connection with no transaction open); returns whether it did."""
    if current(con):
        return False
    con.execute("BEGIN TRANSACTION")
    try:
        refresh(con)
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # DuckDB rolled it back already
        raise
    return True


def refresh(con: duckdb.DuckDBPyConnection, *, everything: bool = False) -> None:
    """Bring the caches up to date with the warehouse ``con`` writes, inside its open
    transaction: the cells whose runs changed, the state, then the rows of each cached view
    whose keys the changed cells touch (every row when many changed, with other views, or
    with ``everything``)."""
    digest = con.execute(f"SELECT {_DIGEST}").fetchone()[0]
    everything = everything or con.execute("SELECT digest FROM cache_state").fetchall() != [(digest,)]
    # No cell yet: the caches made from cells are empty too, so their rows need no deleting
    # (a DuckLake DELETE costs ~10 ms even so)
    empty = not con.execute("SELECT count(*) FROM cell_cache").fetchone()[0]
    if everything and not empty:  # other views or macros, or never filled
        con.execute("DELETE FROM cell_cache")
    try:
        changed = _refresh_cells(con)
        _write_state(con, digest)
        everything = everything or changed > MANY_CELLS
        if not everything and not empty:
            con.execute(before_sql())
        for cache in CACHED:  # in dependency order: a view may read one before it
            _refresh_view(con, cache, everything=everything, empty=empty and cache.from_cells)
    finally:
        for table in _TEMP_TABLES:
            _drop_temp(con, table)


def _refresh_cells(con: duckdb.DuckDBPyConnection) -> int:
    """Compute again the cells whose fingerprint changed, drop those without runs; keep the
    groups of their old and new rows in ``_matrun_changed``; return how many cells changed."""
    con.execute(_FINGERPRINTS)
    con.execute(_STALE_CELLS)
    gone = ("cell_id IN (SELECT cell_id FROM _matrun_stale) "
            "OR cell_id NOT IN (SELECT cell_id FROM _matrun_fingerprints)")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _matrun_changed AS SELECT {_GROUP_KEYS}, true AS was_cached "
                f"FROM cell_cache WHERE {gone}")
    con.execute(f"DELETE FROM cell_cache WHERE {gone}")
    if con.execute("SELECT count(*) FROM _matrun_stale").fetchone()[0]:
        con.execute(f"""
            INSERT INTO cell_cache BY NAME
            SELECT f.*, s.fingerprint
            FROM ({stale_cells_sql()}) AS f
            JOIN _matrun_stale AS s USING (cell_id)""")
        con.execute(f"INSERT INTO _matrun_changed SELECT {_GROUP_KEYS}, false FROM cell_cache "
                    "WHERE cell_id IN (SELECT cell_id FROM _matrun_stale)")
    return con.execute("SELECT count(DISTINCT cell_id) FROM _matrun_changed").fetchone()[0]


@functools.lru_cache(maxsize=None)
def _view_file(view: str) -> str:
    sql = resources.files("matrun.warehouse").joinpath("views", f"{view}.sql").read_text(encoding="utf-8")
    return sql.strip().rstrip(";")


@functools.lru_cache(maxsize=1)
def stale_cells_sql() -> str:
    """View cell_facts_live's SELECT, reading only the runs of the cells in ``_matrun_stale``."""
    sql = _view_file("cell_facts_live")
    if sql.count(_ALL_RUNS) != 1:
        raise RuntimeError(f"views/cell_facts_live.sql must read the runs once, as {_ALL_RUNS!r}")
    return sql.replace(_ALL_RUNS, _STALE_RUNS)


def _write_state(con: duckdb.DuckDBPyConnection, digest: str) -> None:
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    con.execute("DELETE FROM cache_state")
    con.execute("INSERT INTO cache_state SELECT $digest, count(*), max(ingested_at), $now FROM runs",
                {"digest": digest, "now": now})


def is_cache(table: str) -> bool:
    """Whether ``table`` is one of these caches (what an export leaves out unless named)."""
    return table in ("cell_cache", "cache_state") or table.startswith("view_cache_")


def is_live_view(view: str) -> bool:
    """Whether ``view`` is the live definition of a cached view (``<view>_live``)."""
    return any(view == cache.live for cache in CACHED)


def public_sql(cache: Cached) -> str:
    """The SELECT of the view users read: the cached rows, once the caches are checked."""
    return (f"SELECT c.* FROM {cache.table} AS c\n"
            f"WHERE caches_current()\n"
            f"ORDER BY {cache.order}")


def fill_sql(cache: Cached) -> str:
    return f"INSERT INTO {cache.table} SELECT * FROM {cache.live}"


def refresh_view(con: duckdb.DuckDBPyConnection, cache: Cached, keys: list[str] | None, *,
                 empty: bool = False, held: list[str] | None = None) -> None:
    """Compute again the rows of ``keys`` (None: every row) of one cached view (``empty``:
    its table is known to hold no row; ``held``: of ``keys``, those that may hold rows, when
    known)."""
    if keys is None:
        if not empty:
            con.execute(f"DELETE FROM {cache.table}")
        con.execute(fill_sql(cache))
        return
    if not keys:
        return
    # Literal keys, not a parameter: DuckDB pushes a literal IN list down into the view's
    # groups, so only their cells are read; the keys are the warehouse's own values, quoted.
    listed = _listed(keys)
    if not empty and (held is None or held):
        con.execute(f"DELETE FROM {cache.table} WHERE {cache.key} IN ({_listed(keys if held is None else held)})")
    if cache.narrow is None:
        con.execute(f"{fill_sql(cache)} WHERE {cache.key} IN ({listed})")
        return
    marker, narrowed = cache.narrow
    sql = _view_file(cache.view)
    if sql.count(marker) != 1:
        raise RuntimeError(f"views/{cache.view}.sql must read {marker!r} once")
    sql = sql.replace(marker, narrowed.format(keys=listed))
    con.execute(f"INSERT INTO {cache.table} SELECT * FROM (\n{sql}\n) AS v WHERE {cache.key} IN ({listed})")


def _listed(keys: list[str]) -> str:
    return ", ".join("'" + key.replace("'", "''") + "'" for key in keys)


def _refresh_view(con: duckdb.DuckDBPyConnection, cache: Cached, *, everything: bool, empty: bool) -> None:
    if everything:
        refresh_view(con, cache, None, empty=empty)
        return
    keys = [key for (key,) in con.execute(cache.changed).fetchall() if key is not None]
    if len(keys) > MANY_KEYS:
        refresh_view(con, cache, None, empty=empty)
        return
    held = None
    if cache.from_cells and not empty and keys:  # the keys a cell cached before this refresh had
        before = {key for (key,) in con.execute(cache.changed.replace("_matrun_changed", "_matrun_before")).fetchall()}
        held = [key for key in keys if key in before]
    refresh_view(con, cache, keys, empty=empty, held=held)


def refresh_studies(con: duckdb.DuckDBPyConnection, studies: list[str]) -> None:
    """Compute again the findings of ``studies`` (just registered), inside the open transaction
    of a writer whose caches are otherwise current."""
    if current(con):
        refresh_view(con, CACHED_BY_VIEW["findings"], studies)
    else:
        refresh(con)


def _drop_temp(con: duckdb.DuckDBPyConnection, table: str) -> None:
    try:
        con.execute(f"DROP TABLE IF EXISTS temp.main.{table}")
    except duckdb.Error:
        pass  # an aborted transaction: its rollback drops the table
