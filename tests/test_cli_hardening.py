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


# -- 5. a damaged bundle is set aside once: `matrun ingest --quarantine` ----------------------------


MATRIX = """[sweep]
name = "s"
[fixed]
dataset = "synthetic"
synthetic_train = 64
synthetic_test = 32
epochs = 1
batch_size = 32
threads = 1
onednn_check = false
seed = 1
"""


def damaged(results: Path, cell_id: str, *, sweep: str = "s", attempt: int = 1) -> Path:
    bundle = make_bundle(results, sweep=sweep, cell_id=cell_id, attempt=attempt)
    (bundle / "result.json").write_text('{"schema_version": 1, "status": ')
    return bundle


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def the_cell(tmp_path: Path) -> str:
    from matrun.runner.executors.registry import get_executor
    from matrun.runner.planning.identity import plan_cells

    runner, _ = get_executor("local")
    (pc,) = plan_cells(load_matrix(tmp_path / "matrix.toml"), runner.env_id)
    return pc.cell_id


def test_a_skipped_bundle_fails_every_sweep_until_quarantined_once(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    results = tmp_path / "results"
    good = make_bundle(results, sweep="s", cell_id=the_cell(tmp_path))  # the one cell: done, nothing runs
    bad = damaged(results, "b" * 16)
    unfinished = make_bundle(results, sweep="s", cell_id="c" * 16, with_result=False)
    for _ in range(2):  # every sweep of the folder fails on it, and says how to set it aside
        proc = matrun("sweep", cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert f"skipped {bad}: result.json: invalid JSON" in proc.stderr
        command = (f"matrun ingest --quarantine --warehouse {tmp_path / 'matrun.duckdb'} {results / 's'}")
        assert proc.stderr.splitlines()[-1] == (
            "Error: 1 bundle(s) skipped (reasons above); they stay on disk and are not in the warehouse, and every "
            f"later sweep skips them again: `{command}` sets them aside (--allow-skipped exits 0 all the same)")
    good_files, unfinished_files = files_of(good), files_of(unfinished)
    moved = matrun(*command.split()[1:], cwd=tmp_path)  # the command the error names
    assert moved.returncode == 0, moved.stderr
    target = bad.parent / ".quarantine" / bad.name
    assert moved.stdout == ("ingested 0 run(s), 1 unchanged, 1 skipped, 1 incomplete\n"
                            "quarantined 1 bundle(s), 0 could not be moved\n")
    assert f"quarantined {bad} -> {target}\n" in moved.stderr
    assert not bad.exists() and target.is_dir()
    note = json.loads((target / "quarantine.json").read_text())
    assert note["from"] == str(bad) and note["reason"].startswith("result.json: invalid JSON at line 1")
    assert files_of(good) == good_files and files_of(unfinished) == unfinished_files  # never moved
    again = matrun("sweep", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "skipped" not in again.stderr and "warehouse: ingested 0 run(s), 1 unchanged, 0 skipped" in again.stdout
    assert matrun("ingest", str(results), cwd=tmp_path).returncode == 0  # the results directory: not entered


def test_a_quarantined_attempt_keeps_its_run_id_and_a_name_clash_replaces_nothing(tmp_path: Path) -> None:
    from matrun.warehouse.bundles.write import next_attempt

    results = tmp_path / "results"
    bad = damaged(results, "b" * 16)
    earlier = bad.parent / ".quarantine" / bad.name
    earlier.mkdir(parents=True)
    (earlier / "note.txt").write_text("set aside by hand")
    proc = matrun("ingest", "--quarantine", str(results), "--warehouse", str(tmp_path / "w.duckdb"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    target = bad.parent / ".quarantine" / f"{bad.name}.2"
    assert f"quarantined {bad} -> {target}" in proc.stderr
    assert (earlier / "note.txt").read_text() == "set aside by hand" and sorted(p.name for p in earlier.iterdir()) == [
        "note.txt"]
    assert (target / "spec.json").is_file() and not bad.exists()
    assert next_attempt(results, "b" * 16, 0) == 2  # attempt 1 is taken, in quarantine
    # a bundle fixed in quarantine loads from there; an ingest of the quarantine folder moves nothing
    fixed = make_bundle(tmp_path / "fresh", sweep="s", cell_id="b" * 16)
    again = matrun("ingest", "--quarantine", str(bad.parent / ".quarantine"), "--warehouse",
                   str(tmp_path / "w.duckdb"), cwd=tmp_path)
    assert again.returncode == 0 and f"already in quarantine: {target}" in again.stderr
    assert fixed.is_dir()


@pytest.mark.parametrize("blocker", ["file", "symlink"])
def test_a_quarantine_folder_that_cannot_be_used_leaves_the_bundle_where_it_was(tmp_path: Path, blocker: str) -> None:
    results = tmp_path / "results"
    bad = damaged(results, "b" * 16)
    before = files_of(bad)
    folder = bad.parent / ".quarantine"
    if blocker == "file":
        folder.write_text("not a folder")
        why = "is not a directory"
    else:
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
        why = "is a symbolic link (a quarantine folder is a real directory beside the bundle)"
    proc = matrun("ingest", "--quarantine", str(results), "--warehouse", str(tmp_path / "w.duckdb"), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "quarantined 0 bundle(s), 1 could not be moved"
    assert proc.stderr.splitlines()[-1] == f"Error: cannot quarantine {bad}: {folder}: {why}; the bundle stays where it was"
    assert files_of(bad) == before  # untouched, where it was
    if blocker == "symlink":
        assert not any((tmp_path / "elsewhere").iterdir())  # nothing went through the link


def test_several_bundles_that_cannot_be_moved_are_each_named(tmp_path: Path) -> None:
    results = tmp_path / "results"
    bad = [damaged(results, c * 16) for c in "ab"]
    movable = damaged(results, "d" * 16)
    for bundle in bad:
        (bundle.parent / ".quarantine").write_text("")
    proc = matrun("ingest", "--quarantine", str(results), "--warehouse", str(tmp_path / "w.duckdb"), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "quarantined 1 bundle(s), 2 could not be moved"
    lines = proc.stderr.splitlines()
    for bundle in bad:
        assert (f"cannot quarantine {bundle}: {bundle.parent / '.quarantine'}: is not a directory; the bundle "
                "stays where it was") in lines
        assert (bundle / "spec.json").is_file()
    assert lines[-1] == "Error: 2 skipped bundle(s) could not be quarantined (reasons above); they stay where they were"
    assert not movable.exists() and (movable.parent / ".quarantine" / movable.name / "quarantine.json").is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_read_only_or_foreign_quarantine_folder_is_named_and_nothing_is_lost(tmp_path: Path) -> None:
    from test_sweep_faults import tmpfs

    with tmpfs(tmp_path / "results", "16m") as results:
        bad = damaged(results, "b" * 16)
        before = files_of(bad)
        folder = bad.parent / ".quarantine"
        folder.mkdir()
        with tmpfs(folder, "1m"):  # another file system: a bundle is renamed, never copied
            proc = matrun("ingest", "--quarantine", str(results), "--warehouse", str(tmp_path / "w.duckdb"),
                          cwd=tmp_path)
            assert proc.returncode == 1
            assert proc.stderr.splitlines()[-1] == (
                f"Error: cannot quarantine {bad}: {folder}: on another file system than the bundle (it is moved "
                "with one rename, never copied); the bundle stays where it was")
            assert files_of(bad) == before and not any(folder.iterdir())
        folder.rmdir()
        subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True)
        proc = matrun("ingest", "--quarantine", str(results), "--warehouse", str(tmp_path / "w.duckdb"),
                      cwd=tmp_path)
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1] == (f"Error: cannot quarantine {bad}: {folder}: Read-only file system; "
                                                "the bundle stays where it was")
        assert files_of(bad) == before and not folder.exists()


def test_ingest_without_quarantine_names_it(tmp_path: Path) -> None:
    bad = damaged(tmp_path / "results", "b" * 16)
    proc = matrun("ingest", str(tmp_path / "results"), "--warehouse", str(tmp_path / "w.duckdb"), cwd=tmp_path)
    assert proc.returncode == 1 and bad.is_dir()
    assert proc.stderr.splitlines()[-1] == (
        "Error: 1 bundle(s) skipped (reasons above); they stay on disk and are not in the warehouse "
        "(--quarantine sets them aside, --allow-skipped exits 0 all the same)")


# -- 6. wide query results: elided on a terminal, whole when piped or --wide ---------------------


WIDE_SQL = "SELECT " + ", ".join(f"{i} * 1000003 AS column_number_{i:02d}" for i in range(30)) + " FROM range(3)"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real warehouse holding one run."""
    from matrun.warehouse.ingest import ingest

    root = tmp_path_factory.mktemp("wide")
    ingest([make_bundle(root / "results")], warehouse=root / "w.duckdb")
    return root / "w.duckdb"


def test_a_wide_result_on_a_terminal_hides_middle_columns_and_says_how_many(warehouse: Path) -> None:
    code, text = on_terminal("query", WIDE_SQL, "--warehouse", str(warehouse), cwd=warehouse.parent, columns=100)
    assert code == 0, text
    lines = [line for line in screen_lines(text) if line.strip()]
    assert all(len(line) <= 100 for line in lines[:-2]), lines  # the table fits the terminal
    header = [cell.strip() for cell in lines[1].split("┃")[1:-1]]
    assert header[0] == "column_number_00" and header[-1] == "column_number_29" and "…" in header
    shown = len(header) - 1
    assert header == [*[f"column_number_{i:02d}" for i in range(header.index("…"))], "…",
                      *[f"column_number_{i:02d}" for i in range(30 - (shown - header.index("…")), 30)]]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert len(rows) == 3 and all(row[header.index("…")] == "…" for row in rows)  # one line per row: nothing folded
    assert rows[2][-1] == str(29 * 1000003)
    assert lines[-2] == (f"{30 - shown} of 30 columns hidden at …: --wide shows every column, --format vertical "
                         "one per line")
    assert lines[-1] == "3 rows"


def test_a_narrow_result_on_a_terminal_is_shown_whole(warehouse: Path) -> None:
    code, text = on_terminal("query", "SELECT 1 AS a, 'two' AS b", "--warehouse", str(warehouse), cwd=warehouse.parent,
                             columns=100)
    assert code == 0
    lines = [line for line in screen_lines(text) if line.strip()]
    assert [cell.strip() for cell in lines[1].split("┃")[1:-1]] == ["a", "b"] and lines[-1] == "1 row"
    assert "hidden" not in text


def _every_column_whole(stdout: str) -> None:
    lines = stdout.splitlines()
    header = [cell.strip() for cell in lines[1].split("┃")[1:-1]]
    assert header == [f"column_number_{i:02d}" for i in range(30)]
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 3 and [c.strip() for c in rows[2].split("│")[1:-1]] == [str(i * 1000003 * 1) for i in range(30)]
    assert "hidden" not in stdout and lines[-1] == "3 rows"


def test_piped_or_wide_shows_every_column_at_full_width(warehouse: Path) -> None:
    piped = matrun("query", WIDE_SQL, "--warehouse", str(warehouse), cwd=warehouse.parent, env={"COLUMNS": "80"})
    assert piped.returncode == 0, piped.stderr
    _every_column_whole(piped.stdout)
    code, text = on_terminal("query", WIDE_SQL, "--wide", "--warehouse", str(warehouse), cwd=warehouse.parent,
                             columns=100)
    assert code == 0
    _every_column_whole("\n".join(line for line in screen_lines(text) if line.strip()))


def test_vertical_writes_one_line_per_column(warehouse: Path) -> None:
    proc = matrun("query", "SELECT 1 AS a, 'x' || chr(10) || 'y' AS long_name, NULL AS c FROM range(2)",
                  "--format", "vertical", "--warehouse", str(warehouse), cwd=warehouse.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "── row 1 ──", "a         │ 1", "long_name │ x", "          │ y", "c         │ NULL", "",
        "── row 2 ──", "a         │ 1", "long_name │ x", "          │ y", "c         │ NULL", "2 rows"]
    bad = matrun("query", "SELECT 1", "--format", "csv", "--wide", "--warehouse", str(warehouse), cwd=warehouse.parent)
    assert bad.returncode == 2 and bad.stderr == "Error: --wide: only for --format table (--format csv shows every column)\n"
    bad = matrun("query", "SELECT 1", "--format", "xml", "--warehouse", str(warehouse), cwd=warehouse.parent)
    assert bad.returncode == 2 and bad.stderr == "Error: --format 'xml': expected table, vertical, csv or json\n"


def test_fit_columns_keeps_both_ends_and_folds_only_the_widest() -> None:
    from matrun.runner.cli.tables import FOLD_WIDTH, fit_columns, table_width

    assert fit_columns([5, 5, 5], 100) == [0, 1, 2]
    widths = [10] * 10
    kept = fit_columns(widths, 60)
    assert kept == [0, 1, None, 8, 9] and table_width([10, 10, 1, 10, 10]) <= 60
    assert fit_columns([200, 10], 60) == [0, 1]  # the wide one counts FOLD_WIDTH: folded, not hidden
    assert fit_columns([FOLD_WIDTH] * 3, 10) == [0, None]  # the first column always


# -- 8. a sweep's progress: a live line on a terminal, plain lines when piped; --version -------------


# The sweep's display fed the events of a real plan, as a sweep emits them: what the terminal
# and the pipe show without running any cell (the real sweep on a terminal: the test after).
DRIVE = """
import sys
from pathlib import Path
from rich.console import Console
from matrun.runner.cli.progress import SweepDisplay
from matrun.runner.executors.protocol import RunOutcome
from matrun.runner.executors.registry import get_executor
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.sweep.records import SweepEvent

known = sys.argv[1] == "known"
runner, _ = get_executor("local")
cells = plan_cells(load_matrix(Path("matrix.toml")), runner.env_id)
todo = [(pc, r) for pc in cells for r in range(2)]
expected = {pc.cell_id: 60.0 for pc in cells} if known else {}
display = SweepDisplay(Console(stderr=True))
display(SweepEvent("plan", f"{len(todo)} runs to do, 0 already done", total=len(todo),
                   estimate_s=60.0 * len(todo) if known else None, expected=expected))
for pc, repeat in todo:
    display(SweepEvent("run-start", cell=pc, repeat=repeat))
    display(SweepEvent("run-end", cell=pc, repeat=repeat, outcome=RunOutcome(
        status="ok", exit_code=0, error_tail="", started_at="", ended_at="", wall_seconds=42.0)))
display.stop()
"""

PROGRESS_MATRIX = MATRIX.replace("seed = 1\n", "[axes]\nseed = [1, 2, 3]\n")


def _drive(tmp_path: Path, known: str, *, columns: int | None) -> tuple[int, str]:
    (tmp_path / "matrix.toml").write_text(PROGRESS_MATRIX)
    args = [sys.executable, "-c", DRIVE, known]
    if columns is None:
        proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=120)
        return proc.returncode, proc.stderr
    leader, follower = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=follower, stderr=follower,
                            env={**ENV, "COLUMNS": str(columns), "TERM": "xterm"})
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


LIVE = re.compile(r"^(\d+) of 6 ━{20} (about \d+m\d\ds left|time left unknown|all ended)"
                  r"( · cell [0-9a-f]{8} repeat [01], \d+m\d\ds: seed=\d)?\s*$")


def test_the_live_progress_line_on_a_terminal(tmp_path: Path) -> None:
    code, text = _drive(tmp_path, "known", columns=120)
    assert code == 0, text
    assert "\x1b[2K" in text  # redrawn in place
    frames = [frame for frame in re.split(r"\r|\n", ANSI.sub("", text)) if " of 6 " in frame]
    assert frames and all(LIVE.match(frame) for frame in frames), frames
    counts = [int(LIVE.match(frame).group(1)) for frame in frames]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    running = [frame for frame in frames if " · cell " in frame]
    assert {int(LIVE.match(f).group(1)) for f in running} == set(range(6))  # each run shown while it runs
    assert "about 6m00s left" in frames[0] and frames[-1].rstrip().endswith("all ended")
    ended = [line for line in screen_lines(text) if line.lstrip().startswith("ok ")]
    assert len(ended) == 6 and all(len(line.split()) == 6 for line in ended)  # status, cell, repeat, s, label
    narrow_code, narrow = _drive(tmp_path, "unknown", columns=60)
    assert narrow_code == 0
    narrow_frames = [f for f in re.split(r"\r|\n", ANSI.sub("", narrow)) if " of 6 " in f]
    assert narrow_frames and all(len(f.rstrip()) <= 60 for f in narrow_frames)
    assert narrow_frames[0].startswith("0 of 6 ━") and "time left unknown" in narrow_frames[0]


def test_plain_progress_lines_when_piped(tmp_path: Path) -> None:
    code, err = _drive(tmp_path, "unknown", columns=None)
    assert code == 0, err
    assert "\x1b" not in err and "\r" not in err
    lines = err.splitlines()
    assert lines[0] == "6 runs to do, 0 already done"
    starts = [line for line in lines if line.startswith("run ")]
    pattern = re.compile(r"^run (\d) of 6: cell [0-9a-f]{16} repeat [01] \(seed=\d\); "
                         r"(time left unknown|about \d+m\d\ds left)$")
    assert [int(pattern.match(line).group(1)) for line in starts] == [1, 2, 3, 4, 5, 6], starts
    assert starts[0].endswith("time left unknown")  # nothing ran before: no estimate until a run ends
    assert all(line.endswith("s left") for line in starts[1:])
    assert len([line for line in lines if line.lstrip().startswith("ok ")]) == 6


def test_the_estimate_counts_down_with_the_runs_and_never_reads_a_clock() -> None:
    from matrun.runner.sweep.progress import SweepProgress

    known = SweepProgress(total=3, expected={"a": 10.0, "b": 20.0}, estimate_s=40.0)  # a, b, b
    assert known.left() == 40.0
    known.started("a")
    assert known.left(running_s=4.0) == 36.0 and known.left(running_s=99.0) == 30.0  # never below the rest
    known.ended("a", 12.0)
    assert (known.done, known.left()) == (1, 30.0)
    known.ended("b", None)  # done by another sweep meanwhile
    assert (known.done, known.left()) == (2, 10.0)
    fresh = SweepProgress(total=4, expected={})  # nothing ran before
    assert fresh.left() is None
    fresh.started("a")
    fresh.ended("a", 30.0)
    assert fresh.left() == 90.0
    fresh.started("b")
    assert fresh.left(running_s=10.0) == 80.0
    assert SweepProgress(total=4, expected=None).left() is None  # Slurm: runs in parallel


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    proc = matrun("--version", cwd=ROOT)
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert proc.returncode == 0 and proc.stdout == f"matrun {pinned}\n" and proc.stderr == ""
    assert version("matrun") == pinned


@pytest.mark.slow
def test_a_real_sweep_shows_its_progress_on_a_terminal_and_in_a_pipe(tmp_path: Path) -> None:
    from matrun.runner.environments.venvs import built_env

    if not built_env("torch", "cpu")[1]:
        pytest.skip("the PyTorch environment is not built here (`matrun envs --build`)")
    (tmp_path / "matrix.toml").write_text(MATRIX.replace("seed = 1\n", "[axes]\nseed = [1, 2]\n"))
    piped = matrun("sweep", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    starts = [line for line in piped.stderr.splitlines() if line.startswith("run ")]
    assert [line.split(":")[0] for line in starts] == ["run 1 of 2", "run 2 of 2"]
    assert starts[0].endswith("time left unknown") and re.search(r"; about \d+m\d\ds left$", starts[1])
    code, text = on_terminal("sweep", "--force", cwd=tmp_path, columns=120, timeout=600)
    assert code == 0, text
    frames = [f for f in re.split(r"\r|\n", ANSI.sub("", text)) if re.match(r"\d of 2 ━", f)]
    assert any(re.search(r"about \d+m\d\ds left · cell [0-9a-f]{8} repeat 0, \d+m\d\ds: seed=\d", f) for f in frames)
    assert "run 1 of 2" not in text  # no plain lines on a terminal
