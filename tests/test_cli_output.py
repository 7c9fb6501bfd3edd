"""What a person and a script read on the terminal: ``matrun query``'s table, CSV and JSON,
the JSON of ``compare`` and ``advise``, and cell labels, through the real ``matrun`` script
on real DuckDB warehouses (issue 11).

The warehouses are built from real bundles (``bundle_factory``) and then given non-finite
numbers with an ``UPDATE``, as a warehouse written before ingest refused them holds them.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lake_client import plain_writer
from bundle_factory import make_bundle, read_json
from matrun.errors import QueryError
from matrun.reports.shape import label_parts
from matrun.runner.planning.matrix import load_matrix
from matrun.warehouse.ingest import ingest
from matrun.warehouse.query import csv_value, json_value, run_query, short_float, table_text, visible

MATRUN = str(Path(sys.executable).with_name("matrun"))
ROOT = Path(__file__).resolve().parents[1]
# `--executor auto` (plan, status) must find no Docker engine here.
ENV = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock", "COLUMNS": "200"}


def matrun(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([MATRUN, *args], cwd=cwd, input=stdin, capture_output=True, env=ENV, timeout=300)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                                      proc.stderr.decode("utf-8", "replace"))
    assert "Traceback" not in out.stderr, out.stderr
    return out


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses the ``NaN`` / ``Infinity`` Python's json writes but JSON lacks."""
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _epochs(accuracy: float) -> tuple[dict[str, Any], ...]:
    return ({"train_loss": 0.5, "train_accuracy": accuracy, "test_loss": 0.5, "test_accuracy": accuracy,
             "epoch_seconds": 10.0, "test_seconds": 1.0},)


@pytest.fixture(scope="module")
def nonfinite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sweeps "a" and "b": the same cell in two environments, two ok runs each; then sweep b's
    throughput and accuracies made NaN and one of a's throughputs +Infinity."""
    root = tmp_path_factory.mktemp("nonfinite")
    for sweep, env in (("a", "torch-cpu-aaaa00000000"), ("b", "torch-cpu-bbbb00000000")):
        for repeat in range(2):
            run = make_bundle(root / "results", sweep=sweep, cell_id=sweep * 16, repeat=repeat,
                              params={"epochs": 1}, throughput=100.0 + repeat, epochs=_epochs(0.8))
            for name in ("spec.json", "result.json"):
                doc = read_json(run / name)
                doc["env_id"] = env
                (run / name).write_text(json.dumps(doc), encoding="utf-8")
    path = root / "w.duckdb"
    assert not ingest([root / "results"], warehouse=path).skipped
    con = plain_writer(path)
    try:
        b_runs = "SELECT run_id FROM runs WHERE sweep = 'b'"
        con.execute(f"UPDATE runs SET throughput = 'nan'::DOUBLE, accuracy = 'nan'::DOUBLE WHERE run_id IN ({b_runs})")
        con.execute(f"UPDATE epochs SET test_accuracy = 'nan'::DOUBLE WHERE run_id IN ({b_runs})")
        con.execute("UPDATE runs SET throughput = 'inf'::DOUBLE WHERE run_id = "
                    "(SELECT min(run_id) FROM runs WHERE sweep = 'a')")
    finally:
        con.close()
    return path


# -- 1. --format json is JSON -----------------------------------------------------------------


def test_query_json_writes_nan_and_infinity_as_null(nonfinite: Path) -> None:
    before = run_query("SELECT sweep, throughput FROM runs ORDER BY sweep, throughput", warehouse=nonfinite)[1]
    assert any(v != v for _, v in before) and float("inf") in [v for _, v in before]  # they are in the warehouse
    proc = matrun("query", "SELECT sweep, throughput, 'inf'::DOUBLE AS inf, '-inf'::DOUBLE AS minus, "
                  "['nan'::DOUBLE, 1.5] AS list, {'x': 'nan'::DOUBLE} AS struct FROM runs ORDER BY sweep, throughput",
                  "--warehouse", str(nonfinite), "--format", "json", cwd=nonfinite.parent)
    assert proc.returncode == 0, proc.stderr
    assert "NaN" not in proc.stdout and "Infinity" not in proc.stdout
    rows = strict_json(proc.stdout)
    assert [(r["sweep"], r["throughput"]) for r in rows] == [("a", 101.0), ("a", None), ("b", None), ("b", None)]
    assert all(r["inf"] is None and r["minus"] is None and r["list"] == [None, 1.5] and r["struct"] == {"x": None}
               for r in rows)
    # a view over them: max() of a NaN median is NaN
    proc = matrun("query", "SELECT * FROM baseline", "--warehouse", str(nonfinite), "-f", "json", cwd=nonfinite.parent)
    assert proc.returncode == 0, proc.stderr
    assert len(strict_json(proc.stdout)) >= 1


def test_compare_and_advise_json_write_nan_as_null(nonfinite: Path) -> None:
    proc = matrun("compare", "a", "b", "--warehouse", str(nonfinite), "--format", "json", cwd=nonfinite.parent)
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    (cell,) = doc["cells"]
    assert cell["b_throughput"] is None and cell["throughput_ratio"] is None
    assert cell["accuracy_change"] is None
    proc = matrun("advise", "--warehouse", str(nonfinite), "--format", "json", cwd=nonfinite.parent)
    assert proc.returncode == 0, proc.stderr
    strict_json(proc.stdout)


def test_json_keeps_every_column_and_exact_numbers(nonfinite: Path) -> None:
    proc = matrun("query", "SELECT 1 AS a, 2 AS a, 0.1::DOUBLE AS tenth, 1.5 AS dec, "
                  "123456789012345678901234567890::HUGEINT AS huge, TIMESTAMPTZ '2026-01-02 03:04:05+00' AS t, "
                  "NULL AS nothing, true AS yes", "--warehouse", str(nonfinite), "-f", "json", cwd=nonfinite.parent)
    assert strict_json(proc.stdout) == [{"a": 1, "a_1": 2, "tenth": 0.1, "dec": 1.5,
                                         "huge": 123456789012345678901234567890,
                                         "t": "2026-01-02T03:04:05+00:00", "nothing": None, "yes": True}]
    empty = matrun("query", "SELECT 1 AS a WHERE false", "--warehouse", str(nonfinite), "-f", "json",
                   cwd=nonfinite.parent)
    assert strict_json(empty.stdout) == []


def test_json_value() -> None:
    assert json_value(float("nan")) is None and json_value(float("-inf")) is None
    assert json_value([1.0, {"k": (float("inf"), "s")}]) == [1.0, {"k": [None, "s"]}]


# -- 2. the table rounds, CSV and JSON keep every digit; CSV neutralises formulas ---------------

NUMBERS = ("SELECT pi() AS pi, 12345.6789::DOUBLE AS big, 0.0000123456::DOUBLE AS tiny, "
           "9999.96::DOUBLE AS edge, -2.0/3 AS neg, 42 AS whole, 'nan'::DOUBLE AS nan")


def test_query_table_rounds_floats_to_four_significant_digits(nonfinite: Path) -> None:
    table = matrun("query", NUMBERS, "--warehouse", str(nonfinite), cwd=nonfinite.parent).stdout
    row = [cell.strip() for cell in table.splitlines()[3].split("│")[1:-1]]
    assert row == ["3.142", "12346", "1.235e-05", "10000", "-0.6667", "42", "nan"]
    assert table.splitlines()[-1] == "1 row"
    as_csv = list(csv.reader(io.StringIO(matrun("query", NUMBERS, "--warehouse", str(nonfinite), "-f", "csv",
                                                cwd=nonfinite.parent).stdout)))
    assert as_csv[1] == ["3.141592653589793", "12345.6789", "1.23456e-05", "9999.96", "-0.6666666666666666",
                         "42", "nan"]
    (as_json,) = strict_json(matrun("query", NUMBERS, "--warehouse", str(nonfinite), "-f", "json",
                                    cwd=nonfinite.parent).stdout)
    assert as_json["pi"] == 3.141592653589793 and as_json["neg"] == -2.0 / 3 and as_json["nan"] is None


@pytest.mark.parametrize("value, text", [
    (3.141592653589793, "3.142"), (0.5, "0.5"), (1.0, "1"), (100.0, "100"), (1234.5678, "1235"),
    (9999.96, "10000"), (12345.6789, "12346"), (-98765.4, "-98765"), (0.000123456, "0.0001235"),
    (0.0000123456, "1.235e-05"), (1e20, "1e+20"), (0.0, "0"), (-0.0, "0"),
    (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"),
])
def test_short_float(value: float, text: str) -> None:
    assert short_float(value) == text


def test_query_csv_neutralises_formulas(nonfinite: Path) -> None:
    sql = ("SELECT '=HYPERLINK(\"http://x\")' AS f1, '+1+1' AS f2, '-2+3' AS f3, '@SUM(A1)' AS f4, "
           "chr(9) || '=1' AS f5, chr(13) || '=1' AS f6, -2 AS n1, -2.5::DOUBLE AS n2, 'a=b' AS plain, "
           "NULL AS nothing, true AS yes, [1, 2] AS list, 'a,\"b' || chr(13) || chr(10) || 'c' AS quoted, "
           "1 AS \"=evil\"")
    proc = matrun("query", sql, "--warehouse", str(nonfinite), "-f", "csv", cwd=nonfinite.parent)
    assert proc.stdout.startswith("f1,f2,f3,f4,f5,f6,n1,n2,plain,nothing,yes,list,quoted,'=evil\n")
    header, row = list(csv.reader(io.StringIO(proc.stdout, newline="")))
    assert header[-1] == "'=evil"
    assert row == ["'=HYPERLINK(\"http://x\")", "'+1+1", "'-2+3", "'@SUM(A1)", "'\t=1", "'\r=1", "-2", "-2.5",
                   "a=b", "", "true", "[1, 2]", "a,\"b\r\nc", "1"]
    assert csv_value(-3) == "-3" and csv_value("-3") == "'-3" and csv_value(0.1) == "0.1"


# -- hostile text in a table: shown, never interpreted --------------------------------------------


def test_table_shows_markup_and_control_characters_as_text(nonfinite: Path) -> None:
    sql = ("SELECT '[/]' AS \"[bold]col\", '[red]x[/red] [link=file:///etc/passwd]y[/link]' AS markup, "
           "chr(27) || '[2J' || chr(27) || ']0;title' || chr(7) AS esc, 'a' || chr(13) || 'b' AS cr, "
           "'x' || chr(8238) || 'y' AS bidi")
    proc = matrun("query", sql, "--warehouse", str(nonfinite), cwd=nonfinite.parent)
    assert proc.returncode == 0, proc.stderr
    assert "[bold]col" in proc.stdout and "[/]" in proc.stdout
    assert "[red]x[/red] [link=file:///etc/passwd]y[/link]" in proc.stdout
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b[2J\\x1b]0;title\\x07" in proc.stdout and "a\\rb" in proc.stdout and "x\\u202ey" in proc.stdout
    assert visible("ok\nline") == "ok\nline" and table_text(None) == "NULL" and table_text(False) == "false"


# -- 5. very long SQL, NUL characters, huge results ------------------------------------------------


def test_sql_of_a_megabyte_from_stdin(nonfinite: Path) -> None:
    ok = matrun("query", "-", "--warehouse", str(nonfinite), "-f", "json", cwd=nonfinite.parent,
                stdin=("SELECT 7 AS seven" + " " * 2**20 + "\n").encode())
    assert ok.returncode == 0 and strict_json(ok.stdout) == [{"seven": 7}]
    bad = matrun("query", "-", "--warehouse", str(nonfinite), cwd=nonfinite.parent,
                 stdin=("SELECT * FROM " + "x" * 2**20).encode())
    assert bad.returncode == 2
    assert bad.stderr.startswith("Error: query failed: Catalog Error: Table with name xxx")
    assert len(bad.stderr) < 500 and bad.stderr.rstrip().endswith("characters)")


@pytest.mark.parametrize("sql, message", [
    (b"SELECT 1\0; SELECT 2", "Error: query has a NUL character (at character 9); "),
    (b"\0", "Error: query has a NUL character (at character 1); "),
    (b"SELECT '\xff'", "Error: SQL from stdin: not UTF-8 text (byte 9)"),
    (b"", "Error: query is empty: "),
    (b"  \n\t ", "Error: query is empty: "),
])
def test_bad_sql_from_stdin(nonfinite: Path, sql: bytes, message: str) -> None:
    proc = matrun("query", "-", "--warehouse", str(nonfinite), cwd=nonfinite.parent, stdin=sql)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(message), proc.stderr


def test_nul_in_sql_is_refused_by_the_library_too(nonfinite: Path) -> None:
    with pytest.raises(QueryError, match="NUL character"):
        run_query("SELECT 'a\0b'", warehouse=nonfinite)


MILLION = "SELECT range AS i, range / 3 AS third FROM range(1000000)"


def test_a_million_rows_cut_in_the_table_whole_in_csv_and_json(nonfinite: Path) -> None:
    table = matrun("query", MILLION, "--warehouse", str(nonfinite), cwd=nonfinite.parent)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert len(lines) == 1000 + 5  # header (3 lines), 1000 rows, bottom line, the note
    assert lines[-1].startswith("the first 1000 rows; the result has more: ")
    as_csv = matrun("query", MILLION, "--warehouse", str(nonfinite), "-f", "csv", cwd=nonfinite.parent)
    csv_lines = as_csv.stdout.splitlines()
    assert len(csv_lines) == 1_000_001 and csv_lines[-1] == "999999,333333.0"
    as_json = strict_json(matrun("query", MILLION, "--warehouse", str(nonfinite), "-f", "json",
                                 cwd=nonfinite.parent).stdout)
    assert len(as_json) == 1_000_000 and as_json[-1] == {"i": 999999, "third": 333333.0}


def test_a_reader_that_stops_early_gets_no_traceback(nonfinite: Path) -> None:
    proc = subprocess.Popen([MATRUN, "query", MILLION, "--warehouse", str(nonfinite), "-f", "csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout.readline() == b"i,third\n"
    proc.stdout.close()  # as `| head -1` does
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert stderr == ""


def test_an_error_while_rows_stream_is_an_error_line(nonfinite: Path) -> None:
    sql = "SELECT CASE WHEN range > 20000 THEN error('boom') ELSE range END AS x FROM range(25000)"
    for fmt in ("csv", "json", "table"):
        proc = matrun("query", sql, "--warehouse", str(nonfinite), "-f", fmt, cwd=nonfinite.parent)
        assert proc.returncode == 2
        assert proc.stderr == "Error: query failed: Invalid Input Error: boom\n"


# -- 3. cell labels name only the parameters a cell uses ----------------------------------------


@pytest.fixture()
def frameworks(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "matrix.toml", tmp_path / "matrix.toml")  # torch, tensorflow, mxnet, jax: kvstore varies
    return tmp_path


def test_plan_and_status_leave_unused_parameters_out(frameworks: Path) -> None:
    cells = load_matrix(frameworks / "matrix.toml").cells
    assert "kvstore" in cells[0].varying
    labels = {c.values["framework"]: c.label for c in cells if c.values["threads"] == 1}
    common = "optimizer=sgd lr={lr} momentum=0.9 threads=1 layout={layout} preset=none"
    assert labels == {
        "torch": "framework=torch batch_size=64 " + common.format(lr=0.01, layout="nchw"),
        "tensorflow": "framework=tensorflow batch_size=128 " + common.format(lr=0.05, layout="nhwc"),
        "mxnet": "framework=mxnet kvstore=device batch_size=64 " + common.format(lr=0.05, layout="nchw"),
        "jax": "framework=jax batch_size=64 " + common.format(lr=0.05, layout="nhwc")}
    plan = matrun("plan", cwd=frameworks)
    assert plan.returncode == 0, plan.stderr
    assert "None" not in plan.stdout
    torch_row = next(line for line in plan.stdout.splitlines() if "torch-cpu" in line)
    assert [c.strip() for c in torch_row.split("│")[2:4]] == ["torch", "-"]  # framework, kvstore
    status = matrun("status", cwd=frameworks)
    assert status.returncode == 0, status.stderr
    assert "None" not in status.stdout and "kvstore=device" in status.stdout
    assert "framework=torch batch_size=64" in status.stdout


def test_report_labels_leave_null_parameters_out() -> None:
    rows = [{"framework": "torch", "gpus": None, "threads": 1}, {"framework": "torch", "gpus": 2, "threads": 1},
            {"framework": "torch", "gpus": None, "threads": 2}]
    assert label_parts(rows, ["gpus", "threads"]) == [["threads=1"], ["gpus=2", "threads=1"], ["threads=2"]]
    # compact labels (more than four varying parameters) stay distinct and never show a null
    params = ["gpus", "threads", "batch_size", "lr", "epochs"]
    many = [{"gpus": g, "threads": t, "batch_size": 64, "lr": 0.1, "epochs": 1} for g in (None, 2) for t in (1, 2)]
    many += [{"gpus": 2, "threads": 1, "batch_size": b, "lr": lr, "epochs": e}
             for b, lr, e in ((128, 0.1, 1), (64, 0.2, 1), (64, 0.1, 3))]
    parts = label_parts(many, params)
    assert len({" ".join(p) for p in parts}) == len(many)
    assert not any("None" in part or part.endswith("=-") for p in parts for part in p)
