"""Hardening of the command line (issue 25): damaged bundles set aside once (``matrun ingest
--quarantine``), wide query results on a terminal, a sweep's progress line and ``matrun
--version``, and TOML errors at the end of a file that name the line where the unclosed
value opened.

Everything runs the real ``matrun`` script on real files and real DuckDB warehouses; what a
terminal shows is read from a real pseudo-terminal (``pty``), what a script reads from a pipe.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bundle_factory import make_bundle
from matrun.errors import InputError, MatrixError
from matrun.frameworks import load_framework
from matrun.runner.planning.matrix import load_matrix
from matrun.tomltext import Opening, TomlError, TomlTooDeep, loads, unclosed

ROOT = Path(__file__).resolve().parents[1]
MATRUN = str(Path(sys.executable).with_name("matrun"))
# `--executor auto` must find no Docker engine here.
ENV = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}


def matrun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real ``matrun`` script, its stdout and stderr on pipes."""
    proc = subprocess.run([MATRUN, *args], cwd=cwd, capture_output=True, text=True, env={**ENV, **(env or {})},
                          timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def on_terminal(*args: str, cwd: Path, columns: int = 80, env: dict[str, str] | None = None,
                timeout: float = 120) -> tuple[int, str]:
    """Run ``matrun`` with stdout and stderr on a real pseudo-terminal ``columns`` wide; its
    exit code and everything the terminal received (escape sequences included)."""
    import fcntl
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([MATRUN, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env={**ENV, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm", **(env or {})},
                            close_fds=True)
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout)
            if not ready:
                raise AssertionError(f"matrun {' '.join(args)}: no output for {timeout} s")
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed, the command has ended
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert "Traceback" not in text, text
    return code, text


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def screen_lines(text: str) -> list[str]:
    """The lines a terminal shows, escape sequences removed (a carriage return starts a line over)."""
    lines = []
    for line in ANSI.sub("", text).replace("\r\n", "\n").split("\n"):
        lines.append(line.rsplit("\r", 1)[-1])
    return lines


# -- 9. a TOML error at the end of a file names the line where the value opened ------------------


UNCLOSED_ARRAY = """[sweep]
name = "toml"
[axes]
threads = [1,
  2,
"""


def test_an_unclosed_array_at_the_end_of_the_matrix_names_where_it_opened(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(UNCLOSED_ARRAY)
    proc = matrun("plan", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == ("Error: matrix.toml: invalid TOML: Invalid value (at end of document: the array "
                           "opened at line 4, column 11 is not closed)\n")
    (tmp_path / "matrix.toml").write_text(UNCLOSED_ARRAY.rstrip(",\n"))  # ends right after the 2
    proc = matrun("sweep", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == ("Error: matrix.toml: invalid TOML: Unclosed array (at end of document: the array "
                           "opened at line 4, column 11 is not closed)\n")


@pytest.mark.parametrize("text, message", [
    ('[fixed]\nthreads = {a = 1', "Unclosed inline table (at end of document: the inline table opened at "
                                  "line 2, column 11 is not closed)"),
    ('[sweep]\nname = "abc', "Unterminated string (at end of document: the string opened at line 2, "
                             "column 8 is not closed)"),
    ("[sweep]\nname = 'abc\n[fixed]\n", "Expected \"'\" (at end of document: the string opened at line 2, "
                                        "column 8 is not closed)"),
    ('[study]\nabout = """one\ntwo ""\n', "Unterminated string (at end of document: the multi-line string "
                                          "opened at line 2, column 9 is not closed)"),
    ("[study]\nabout = '''one\n''", "Expected \"'''\" (at end of document: the multi-line string opened at "
                                    "line 2, column 9 is not closed)"),
    ("[sweep]\n[[include", "Expected ']]' at the end of an array declaration (at end of document: the table "
                           "header opened at line 2, column 1 is not closed)"),
    ("[sweep]\nname =", "Invalid value (at end of document, line 2, column 7)"),  # nothing open: the end
    # brackets, braces and quotes inside strings and comments open nothing
    ('[sweep]\nname = "a[{#"  # ]] "\n[axes]\nthreads = [ # [ {\n  1, \'x]\' , """]\n""",\n',
     "Invalid value (at end of document: the array opened at line 4, column 11 is not closed)"),
    ('[axes]\nthreads = [[1, 2], [3, "\\"]"\n', "Unclosed array (at end of document: the array opened at "
                                                "line 2, column 20 is not closed)"),
])
def test_every_unclosed_value_is_named_by_where_it_opened(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    with pytest.raises(MatrixError) as err:
        load_matrix(path)
    assert str(err.value) == f"matrix.toml: invalid TOML: {message}"


def test_errors_elsewhere_keep_tomllib_s_own_position() -> None:
    with pytest.raises(TomlError) as err:
        loads("a = 1\nb = [1,, 2]\nc = 3\n")
    assert str(err.value) == "Invalid value (at line 2, column 8)"
    with pytest.raises(TomlTooDeep):
        loads("a = " + "[" * 100_000 + "]" * 100_000)
    assert loads('a = """x""""\nb = \'\'\'y\'\'\'\'\'\n') == {"a": 'x"', "b": "y''"}


OPENERS = {"array": "[", "table header": "[", "inline table": "{", "string": "\"'",
           "multi-line string": "\"'"}


def _cuts(text: str) -> list[int]:
    """Every place worth cutting ``text`` at: after each bracket, brace, quote and line."""
    return sorted({i + 1 for i, c in enumerate(text) if c in "[]{}\"'\n="} | {len(text) // 2})


@pytest.mark.parametrize("path", [ROOT / "matrix.toml", *sorted((ROOT / "studies").glob("*.toml"))[:8],
                                  ROOT / "images" / "torch" / "framework.toml"],
                         ids=lambda p: p.name)
def test_every_cut_of_a_real_file_names_a_line(path: Path) -> None:
    """Cut real matrix, study and framework files anywhere: an error at the end of the cut text
    always names a line, and an unclosed value is named by its own opening character."""
    text = path.read_text(encoding="utf-8")
    tomllib.loads(text)  # whole, it is valid
    seen_open = 0
    for cut in _cuts(text):
        part = text[:cut]
        try:
            loads(part)
        except TomlError as exc:
            message = str(exc)
            assert "line " in message and not message.endswith("(at end of document)"), (cut, message)
            opening = unclosed(part) if "(at end of document" in message else None
            if opening is not None:
                seen_open += 1
                line = part.split("\n")[opening.line - 1]
                assert line[opening.column - 1] in OPENERS[opening.kind], (cut, opening)
    assert seen_open > 0


def test_unclosed_scans_a_table_header_line_and_crlf() -> None:
    assert unclosed("[a]\r\nb = [\r\n  1,\r\n") == Opening("array", 2, 5)
    assert unclosed('[a]\nb = ["x", {c = 1}, [2]]\n[[d]]\ne = 1\n') is None
    assert unclosed("[[a.b]]\nc = {d = [1") == Opening("array", 2, 10)


def test_a_study_file_s_error_names_the_line(tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "X1-broken.toml").write_text('[study]\nid = "X1"\nfindings = ["a",\n')
    proc = matrun("studies", str(studies), "--warehouse", str(tmp_path / "none.duckdb"), cwd=tmp_path)
    assert proc.returncode == 1
    assert ("X1-broken.toml: invalid TOML: Invalid value (at end of document: the array opened at line 3, "
            "column 12 is not closed)") in proc.stderr


def test_warehouse_toml_error_names_the_line(tmp_path: Path) -> None:
    warehouse = tmp_path / "team.duckdb"
    warehouse.mkdir()
    (warehouse / "warehouse.toml").write_text('[catalog]\npostgres = "host=db dbname=matrun\n')
    proc = matrun("query", "SELECT 1", "--warehouse", str(warehouse), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"Error: {warehouse / 'warehouse.toml'}: invalid TOML: Illegal character '\\n' "
                           "(at line 2, column 34)\n")
    (warehouse / "warehouse.toml").write_text('[catalog]\npostgres = "host=db"\ndata = ["/lake"')
    proc = matrun("query", "SELECT 1", "--warehouse", str(warehouse), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"Error: {warehouse / 'warehouse.toml'}: invalid TOML: Unclosed array (at end of "
                           "document: the array opened at line 3, column 8 is not closed)\n")


def test_framework_toml_error_names_the_line(tmp_path: Path) -> None:
    folder = tmp_path / "torch"
    folder.mkdir()
    (folder / "framework.toml").write_text('name = "torch"\n[env]\nthreads = ["OMP_NUM_THREADS",\n')
    with pytest.raises(InputError) as err:
        load_framework(folder)
    assert str(err.value).endswith("framework.toml: not valid TOML: Invalid value (at end of document: the "
                                   "array opened at line 3, column 11 is not closed)")
