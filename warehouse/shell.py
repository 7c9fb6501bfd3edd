"""``matrun shell``: DuckDB's own command-line client on a warehouse, read-only, from any
directory (docs/WAREHOUSE.md "Any DuckDB client").

The client is the ``duckdb`` program (pip package ``duckdb-cli``) of matrun's DuckDB release,
whose extensions matrun loads: the one ``$MATRUN_DUCKDB_CLI`` names, else ``duckdb`` on
``PATH``, else the one installed beside matrun's Python.  It starts with a matrun reader's
statements (:func:`matrun.warehouse.db.reader_statements`): the extensions loaded from
matrun's install, the lake attached read-only by the warehouse's absolute paths where it is
now, at the snapshot that was newest, and only that snapshot's files open to it, with
external access off and the configuration locked.  Nothing typed at its prompt can change a
byte of the warehouse (``CHECKPOINT`` and DuckLake's maintenance calls fail before they write
a file) or write a file anywhere else; ``.output FILE`` and ``.once FILE`` still save results.

The statements go to the client in a file it reads first (``-no-init -cmd ".read FILE"``: no
``~/.duckdbrc``, and after the ``-cmd`` the pip package's ``duckdb`` script adds), in a private
temporary directory removed when the client exits; matrun waits for it (Ctrl-C reaches the
client alone) and exits with its exit status.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Sequence

import duckdb

from matrun.errors import MatrunError
from matrun.warehouse import catalog
from matrun.warehouse.db import open_warehouse, reader_statements, shown

#: Names the DuckDB command-line client to use, ahead of ``PATH``.
CLI_ENV = "MATRUN_DUCKDB_CLI"
_INSTALL = f"pip install duckdb-cli=={duckdb.__version__}"


def find_cli() -> Path:
    """The DuckDB command-line client: ``$MATRUN_DUCKDB_CLI``, else ``duckdb`` on ``PATH``,
    else ``duckdb`` in the directory of this Python's scripts; checked to be of matrun's DuckDB
    release.  A :class:`MatrunError` says what to install when there is none."""
    named = os.environ.get(CLI_ENV)
    if named:
        cli = Path(named)
        if not (cli.is_file() and os.access(cli, os.X_OK)):
            raise MatrunError(f"{CLI_ENV} names {shown(named)}, which is not an executable file; point it "
                              f"at the DuckDB command-line client ({_INSTALL}) or unset it")
    else:
        beside = Path(sysconfig.get_path("scripts")) / "duckdb"
        found = shutil.which("duckdb") or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)
        if found is None:
            raise MatrunError(f"no DuckDB command-line client found: no `duckdb` on PATH or in {beside.parent}; "
                              f"install it ({_INSTALL}) or point {CLI_ENV} at one")
        cli = Path(found)
    _check_version(cli)
    return cli


def _check_version(cli: Path) -> None:
    """``cli --version`` must name matrun's DuckDB release: the extensions are built for it."""
    try:
        done = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MatrunError(f"the DuckDB command-line client {shown(cli)} does not run: {exc}") from None
    words = done.stdout.split()
    version = words[0] if done.returncode == 0 and words else None
    if version != f"v{duckdb.__version__}":
        what = f"is DuckDB {version}" if version else "did not say its version"
        raise MatrunError(f"the DuckDB command-line client {shown(cli)} {what}; matrun shell needs DuckDB "
                          f"v{duckdb.__version__}, the release of matrun's extensions: {_INSTALL}, or point "
                          f"{CLI_ENV} at one")


def shell_statements(warehouse: Path | str) -> list[str]:
    """The statements that open ``warehouse`` read-only in a DuckDB client, as a matrun reader
    is opened; a path that is not a warehouse, or one matrun cannot read, raises as
    ``open_warehouse`` does."""
    with open_warehouse(warehouse, read_only=True) as wh:  # a warehouse, its schema, its views
        layout = catalog.layout(wh.path)
    con = catalog.lake_connect()
    try:
        statements, _ = reader_statements(layout, con)
    except duckdb.Error as exc:
        raise MatrunError(f"could not open warehouse {shown(layout.path)}: "
                          f"{str(exc).strip().splitlines()[0]}") from None
    finally:
        con.close()
    return statements


def run_shell(warehouse: Path | str, *, args: Sequence[str] = ()) -> int:
    """Run the DuckDB client on ``warehouse`` (read-only; ``args`` passed on to it, e.g.
    ``-csv -c "SELECT …"``) until it exits; return its exit status."""
    cli = find_cli()
    statements = shell_statements(warehouse)
    home = Path(tempfile.mkdtemp(prefix="matrun-shell-"))
    try:
        init = home / "init.sql"
        init.write_text("".join(f"{statement};\n" for statement in statements), encoding="utf-8")
        read = '.read "' + str(init).replace('"', '\\"') + '"'
        try:
            child = subprocess.Popen([str(cli), "-no-init", "-cmd", read, *args])
        except OSError as exc:
            raise MatrunError(f"the DuckDB command-line client {shown(cli)} does not run: {exc}") from None
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the client's
        try:
            return child.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        shutil.rmtree(home, ignore_errors=True)
