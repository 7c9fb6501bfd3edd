"""matrun's DuckDB instances load its two extensions by path, unsigned-checked, and nothing else
(warehouse/catalog.py LAKE_CONFIG; docs/WAREHOUSE.md "Extensions"): DuckDB's signature check of
the extension files matrun's own pip packages installed is skipped, autoloading and installing
known extensions is off, and a reader's user SQL can load no extension (matrun refuses LOAD and
INSTALL before DuckDB runs them, and DuckDB refuses them too: external access is off)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bundle_factory import make_bundle
from matrun.errors import QueryError
from matrun.warehouse import catalog
from matrun.warehouse.db import forget_instances, open_warehouse
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import run_query

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
SETTINGS = ("SELECT current_setting('allow_unsigned_extensions'), current_setting('autoload_known_extensions'), "
            "current_setting('autoinstall_known_extensions')")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ext")
    path = root / "w.duckdb"
    assert ingest([make_bundle(root / "results", cell_id="e" * 16)], warehouse=path).counts["ingested"] == 1
    return path


@pytest.fixture(scope="module")
def unsigned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file with an extension's name that no one signed (and that is no library either)."""
    path = tmp_path_factory.mktemp("unsigned") / "evil.duckdb_extension"
    path.write_bytes(b"\x7fELF" + b"\0" * 4096)
    return path


def test_writer_and_reader_instances_skip_the_check_and_autoload_nothing(lake: Path) -> None:
    forget_instances(lake)
    with open_warehouse(lake) as wh:
        assert wh.con.execute(SETTINGS).fetchone() == (True, False, False)
        loaded = {name for (name,) in wh.con.execute(
            "SELECT extension_name FROM duckdb_extensions() WHERE loaded AND install_mode <> 'STATICALLY_LINKED'").fetchall()}
        assert loaded == {"ducklake", "sqlite_scanner"}
    with open_warehouse(lake, read_only=True) as wh:
        assert wh.con.execute(SETTINGS).fetchone() == (True, False, False)


def test_an_extension_in_the_users_duckdb_directory_is_never_autoloaded(lake: Path, unsigned: Path,
                                                                        tmp_path: Path) -> None:
    """A file planted where DuckDB autoloads the tpch extension from (a plain ``duckdb.connect()``
    tries to load it for ``tpch_queries()`` and fails on the file): matrun's writer names the
    missing function, and the planted file was never opened."""
    home = tmp_path / "home"
    folder = home / ".duckdb" / "extensions" / f"v{duckdb.__version__}" / "linux_amd64"
    folder.mkdir(parents=True)
    (folder / "tpch.duckdb_extension").write_bytes(unsigned.read_bytes())
    script = ("import sys\nfrom matrun.warehouse.db import open_warehouse\n"
              "with open_warehouse(sys.argv[1]) as wh:\n"
              "    try:\n        wh.con.execute('SELECT * FROM tpch_queries()')\n"
              "    except Exception as exc:\n        print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(lake)], capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("CatalogException") and "tpch extension" in proc.stdout, proc.stdout
    assert "Failed to load" not in proc.stdout and "automatically" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("sql", ["LOAD '{file}'", "LOAD spatial", "INSTALL spatial", "FORCE INSTALL ducklake",
                                 "INSTALL '{file}'", "load   '{file}'; SELECT 1"])
def test_user_sql_may_not_load_or_install_an_extension(lake: Path, unsigned: Path, sql: str) -> None:
    with pytest.raises(QueryError) as err:
        run_query(sql.format(file=unsigned), warehouse=lake)
    assert str(err.value) == ("query refused: a read-only query may not LOAD or INSTALL an extension (a reader "
                              "runs only the extensions matrun loaded itself)")


def test_duckdb_itself_refuses_a_load_in_a_reader(lake: Path, unsigned: Path) -> None:
    """Past matrun's check, the reader's own configuration stops an unsigned file."""
    with open_warehouse(lake, read_only=True) as wh:
        with pytest.raises(duckdb.PermissionException, match="Loading external extensions is disabled"):
            wh.con.execute(f"LOAD '{unsigned}'")
        with pytest.raises(duckdb.Error):
            wh.con.execute("SET allow_unsigned_extensions = false")  # the configuration is locked


def test_matrun_query_load_exits_2_with_the_error_line(lake: Path, unsigned: Path, tmp_path: Path) -> None:
    proc = subprocess.run([*MATRUN, "query", f"LOAD '{unsigned}'", "--warehouse", str(lake)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("Error: query refused: a read-only query may not LOAD or INSTALL an extension (a "
                           "reader runs only the extensions matrun loaded itself)\n")
