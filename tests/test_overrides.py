"""``--set KEY=VALUE`` (issue 26, item 3; docs/MATRIX.md "Overrides"): values read as TOML or
text, applied after the profile in every section, the cells and their ids exactly those of the
file edited the same way; bad, hostile and invalidating values refused with one ``Error:`` line
naming the key; a site Python (``variant = "system"``) that lacks a cell's framework refused by
name before anything runs, or left out with ``--skip-unrunnable``; ``status`` and ``cancel``
with the same ``--set`` finding the same cells.

Light: the interpreters are ``python -m venv --without-pip`` environments, a framework is "there"
as an empty package the probe finds (nothing here imports a real framework), and the one run
the sweep makes fails at once in the harness."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from matrun.errors import InputError, MatrixError
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix, parse_matrix
from matrun.runner.planning.overrides import MAX_OVERRIDE_CHARS, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
A4 = ROOT / "studies" / "A4-cpu-vs-gpu.toml"
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}

BASE = """
[sweep]
name = "over"
repeats = 2

[fixed]
dataset = "synthetic"
iterations = 20
threads = 2

[axes]
batch_size = [32, 64]
lr = [0.01, 0.1]

[[zip]]
framework = ["torch", "tensorflow", "torch"]
layout = ["nchw", "nhwc", "nhwc"]

[profiles.quick]
axes = { batch_size = [16] }
"""


# -- helpers --------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "matrix.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def ids(matrix: Any) -> list[str]:
    """The cells' ids (a fixed environment id per framework and variant: the parameters decide)."""
    return [pc.cell_id for pc in plan_cells(matrix, lambda fw, variant: f"{fw}-{variant}-test")]


def edited(path: Path, edit: Any, name: str = "edited.toml") -> Path:
    """The same file with ``edit(doc)`` applied to its TOML, written beside it."""
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    out = path.with_name(name)
    out.write_text(_toml(doc), encoding="utf-8")
    return out


def _toml(doc: dict[str, Any]) -> str:
    """A small TOML writer for the documents of these tests (tables, arrays of tables, scalars, lists)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(v)

    lines: list[str] = []
    for section, body in doc.items():
        if isinstance(body, list):
            for row in body:
                lines.append(f"[[{section}]]")
                lines.extend(f"{k} = {value(v)}" for k, v in row.items())
        elif section == "profiles":
            for name, table in body.items():
                lines.append(f"[profiles.{name}]")
                lines.extend(f"{k} = {value(v)}" for k, v in table.items())
        else:
            lines.append(f"[{section}]")
            lines.extend(f"{k} = {value(v)}" for k, v in body.items())
    return "\n".join(lines) + "\n"


def matrun(*args: object, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **NO_ENGINE, "MATRUN_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "matrun.runner.cli.main", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("Error:")]


def make_venv(where: Path, *packages: str) -> Path:
    """A real interpreter (a venv without pip) whose site-packages has an empty package for each
    of ``packages``: the probe finds them (``find_spec``), importing them would find nothing."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    for name in packages:
        (Path(purelib) / name).mkdir()
        (Path(purelib) / name / "__init__.py").write_text(f'raise ImportError("a stand-in {name}, not the framework")\n')
    return python


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $MATRUN_HOME (the probe cache of this test only)."""
    path = tmp_path / "home"
    monkeypatch.setenv("MATRUN_HOME", str(path))
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site Python that has (the modules of) PyTorch and nothing else."""
    return make_venv(tmp_path_factory.mktemp("site") / "venv", "torch")


# -- reading the flags ----------------------------------------------------------------------


def test_values_are_toml_when_they_parse_else_text() -> None:
    assert parse_overrides([
        "threads=4", "onednn=false", "synthetic_shape=[3,32,32]", "lr=0.05", "variant=system",
        "python=/opt/conda/bin/python", 'model="lenet5"', " seed = 7", "cpuset=0-3", "dataset=",
    ]) == {"threads": 4, "onednn": False, "synthetic_shape": [3, 32, 32], "lr": 0.05, "variant": "system",
           "python": "/opt/conda/bin/python", "model": "lenet5", "seed": 7, "cpuset": "0-3", "dataset": ""}
    assert parse_overrides(['variant="123"', "layout=nchw # a comment"]) == {"variant": "123", "layout": "nchw # a comment"}
    assert parse_overrides([]) == {}


@pytest.mark.parametrize("items, message", [
    (["threads"], "--set threads: expected KEY=VALUE, such as threads=4 or variant=system"),
    (["=4"], "--set =4: expected KEY=VALUE, such as threads=4 or variant=system"),
    (["foo=1"], "--set foo: unknown parameter; known: framework, variant, python, "),
    (["sweep.repeats=2"], "--set sweep.repeats: unknown parameter; known: "),
    (["threads=1", "threads=2"], "--set threads: given twice; set each parameter once"),
    (["threads=4\nvariant = \"x\""], '--set threads: expected a value without control characters, got "4\\nvariant = "x""'),
    (["model=lenet5\x1b[31m"], '--set model: expected a value without control characters, got "lenet5\\x1b[31m"'),
    (["model=" + "a" * (MAX_OVERRIDE_CHARS + 1)], f"--set model: a value of {MAX_OVERRIDE_CHARS + 1:,} characters; "
                                                  f"at most {MAX_OVERRIDE_CHARS:,}"),
    (["model=\udcff\udcfe"], "--set model: expected a value of UTF-8 text"),
    (["thr\udcffeads=4"], "--set thr\\udcffeads: expected a parameter name of docs/MATRIX.md"),
    (["x" * 5000 + "=1"], "--set " + "x" * 57 + "...: unknown parameter"),
])
def test_malformed_flags_are_refused_naming_the_key(items: list[str], message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_overrides(items)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value) and err.value.exit_code == 2


# -- where a value applies, and the identity contract ----------------------------------------


def test_an_override_of_a_fixed_key_is_the_file_with_that_value(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    over = load_matrix(path, overrides={"threads": 4})
    assert {c.values["threads"] for c in over.cells} == {4} and len(over.cells) == 12
    assert over.overrides == {"threads": 4} and over.sweep.name == "over"
    same = load_matrix(edited(path, lambda doc: doc["fixed"].update(threads=4)))
    assert ids(over) == ids(same)
    assert ids(over) != ids(load_matrix(path))


def test_an_override_of_an_axis_key_removes_the_axis(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    over = load_matrix(path, overrides={"batch_size": 128})
    assert len(over.cells) == 6 and {c.values["batch_size"] for c in over.cells} == {128}
    assert "batch_size" not in over.cells[0].varying

    def edit(doc: dict[str, Any]) -> None:
        del doc["axes"]["batch_size"]
        doc["fixed"]["batch_size"] = 128

    assert ids(over) == ids(load_matrix(edited(path, edit)))


def test_an_override_of_a_zip_key_keeps_the_rest_of_the_zip_once(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    # layout leaves the zip: framework = torch, tensorflow, torch; the two torch rows are one now
    over = load_matrix(path, overrides={"layout": "nchw"})
    assert sorted({(c.values["framework"], c.values["layout"]) for c in over.cells}) == [
        ("tensorflow", "nchw"), ("torch", "nchw")]
    assert len(over.cells) == 8

    def edit(doc: dict[str, Any]) -> None:
        doc["zip"] = [{"framework": ["torch", "tensorflow"]}]
        doc["fixed"]["layout"] = "nchw"

    assert ids(over) == ids(load_matrix(edited(path, edit)))
    # the zip's only key left: the zip is gone, the value fixed
    both = load_matrix(path, overrides={"layout": "nhwc", "framework": "torch"})
    assert len(both.cells) == 4 and {c.values["framework"] for c in both.cells} == {"torch"}


def test_an_override_applies_after_the_profile(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    quick = load_matrix(path, "quick", {"batch_size": 8, "lr": 0.5})
    assert quick.sweep.name == "over-quick" and quick.profile == "quick"
    assert {(c.values["batch_size"], c.values["lr"]) for c in quick.cells} == {(8, 0.5)}
    assert len(quick.cells) == 3

    def edit(doc: dict[str, Any]) -> None:  # the profile's own axis, and the base's, fixed
        doc["profiles"]["quick"]["axes"] = {}
        doc["profiles"]["quick"]["fixed"] = {"batch_size": 8, "lr": 0.5}

    assert ids(quick) == ids(load_matrix(edited(path, edit), "quick"))


def test_includes_take_the_value_and_excludes_are_matched_against_it(tmp_path: Path) -> None:
    text = BASE + """
[[include]]
framework = "torch"
batch_size = 512
threads = 1

[[exclude]]
threads = 2
batch_size = 32
"""
    path = write(tmp_path, text)
    base = load_matrix(path)
    assert len(base.cells) == 6 + 1  # batch 32 excluded at threads = 2, the include kept
    over = load_matrix(path, overrides={"threads": 3})
    # the include row's threads is replaced; the exclude named threads = 2: it excludes nothing now
    assert len(over.cells) == 12 + 1 and {c.values["threads"] for c in over.cells} == {3}
    assert any(c.values["batch_size"] == 512 for c in over.cells)

    def edit(doc: dict[str, Any]) -> None:
        doc["fixed"]["threads"] = 3
        doc["include"][0]["threads"] = 3

    assert ids(over) == ids(load_matrix(edited(path, edit)))
    # an override equal to the excluded value: the rule excludes what else it names
    assert len(load_matrix(path, overrides={"threads": 2}).cells) == 6 + 1
    # every combination excluded by the new value: the file's error, with the flag named
    all_out = write(tmp_path, BASE + "[[exclude]]\nthreads = 4\n", "all.toml")
    with pytest.raises(MatrixError) as err:
        load_matrix(all_out, overrides={"threads": 4})
    assert str(err.value) == ("all.toml with --set threads=4: [exclude] every combination is excluded: "
                              "the matrix expands to no cells")


def test_cells_without_overrides_keep_their_ids(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    plain = ids(load_matrix(path))
    assert ids(load_matrix(path, overrides={})) == plain
    assert ids(load_matrix(path, overrides={"threads": 2})) == plain  # the value the file fixes
    # an override of one key keeps the ids of the cells it leaves as they were
    over = ids(load_matrix(path, overrides={"framework": "torch"}))
    torch_cells = [i for i, c in zip(plain, load_matrix(path).cells) if c.values["framework"] == "torch"]
    assert set(torch_cells) <= set(over)


def test_the_a4_study_on_a_site_python_is_the_study_edited_for_it(tmp_path: Path, home: Path, site: Path) -> None:
    """The issue's example: the quick profile's zip pins variant; --set frees it."""
    sets = {"variant": "system", "python": str(site)}
    over = load_matrix(A4, "quick", sets)
    assert [(c.values["device"], c.values["onednn"], c.values["variant"]) for c in over.cells] == [
        ("gpu", True, "system"), ("cpu", True, "system"), ("cpu", False, "system")]
    doc = tomllib.loads(A4.read_text(encoding="utf-8"))
    quick = doc["profiles"]["quick"]
    quick["zip"] = [{k: v for k, v in quick["zip"][0].items() if k != "variant"}]
    quick["fixed"].update(sets)
    by_edit = parse_matrix(doc, path=A4, profile="quick")
    planned = [pc.cell_id for pc in plan_cells(over, lambda fw, variant: "unused")]
    assert planned == [pc.cell_id for pc in plan_cells(by_edit, lambda fw, variant: "unused")]
    assert len(set(planned)) == 3
    assert all(pc.env_id.startswith("torch-system-") for pc in plan_cells(over, lambda fw, variant: "unused"))


# -- values refused -------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    ({"threads": "x"}, '--set threads: expected a thread count from 1 to 1024 or "unset", got "x"'),
    ({"onednn": "maybe"}, '--set onednn: expected true or false, got "maybe"'),
    ({"synthetic_shape": [3, 32]}, "--set synthetic_shape: expected [channels, height, width], three integers"),
    ({"seed": 10**30}, "--set seed: expected a non-negative integer at most 2,147,483,647, got 1000000000000000"),
    ({"lr": float("nan")}, "--set lr: expected a positive learning rate, got nan"),
    ({"foo": 1}, "--set foo: unknown parameter; known: framework"),
    ({"threads": [[[[[[[[[1]]]]]]]]]}, "--set threads: nests tables and arrays more than 8 deep"),
    ({"model": "$(touch pwned)"}, '--set model: expected one of "lenet5", "cifar_cnn", "alexnet", "resnet18", '
                                  '"resnet50", "gpt-tiny", "gpt2-small", "vit-tiny", "vit-b16", got "$(touch pwned)"'),
])
def test_a_bad_value_is_refused_as_the_files_would_be(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, BASE), overrides=overrides)
    assert str(err.value).startswith(message), str(err.value)
    assert err.value.exit_code == 2


def test_an_override_that_makes_the_matrix_invalid_names_the_file_and_the_flags(tmp_path: Path, site: Path,
                                                                                 home: Path) -> None:
    path = write(tmp_path, BASE)
    with pytest.raises(MatrixError) as err:
        load_matrix(path, overrides={"conv_algo": "autotune"})  # a cuDNN setting on cpu cells
    first = str(err.value).splitlines()[0]
    assert first.startswith("matrix.toml with --set conv_algo=autotune: [axes] {batch_size = 32, lr = 0.01, "
                            'framework = "torch", layout = "nchw"}: conv_algo = "autotune" needs device = "gpu"')
    with pytest.raises(MatrixError) as err:
        load_matrix(path, overrides={"variant": "system"})
    assert str(err.value).startswith('matrix.toml with --set variant=system: [axes] {batch_size = 32, ')
    assert 'python is missing: a variant = "system" cell runs in the site\'s own Python' in str(err.value)
    with pytest.raises(MatrixError) as err:
        load_matrix(path, overrides={"python": str(site)})
    # a value over 60 characters is shown cut ("…/bin/p...": pytest's tmp path varies in length)
    shown = str(site) if len(str(site)) <= 60 else f"{str(site)[:57]}..."
    assert str(err.value).startswith(f"matrix.toml with --set python={shown}: [axes] {{batch_size = 32, ")
    assert 'python is only for variant = "system"' in str(err.value)
    with pytest.raises(MatrixError) as err:
        load_matrix(path, overrides={"workers": 2, "mode": "inference"})
    assert 'a multi-worker cell trains: mode = "inference" runs in one process' in str(err.value)


def test_a_python_that_is_not_an_interpreter_is_refused(tmp_path: Path, home: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    script = tmp_path / "not-python"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    path = write(tmp_path, BASE)
    cases = [
        (str(tmp_path), f'--set python: "{tmp_path}" is a directory, not a Python interpreter (name its bin/python)'),
        ("/nonexistent/matrun-test/python", '--set python: "/nonexistent/matrun-test/python": no such file'),
        ("../../bin/python", "--set python: expected the absolute path of a Python interpreter, such as "
                             '"/usr/bin/python3" (a relative path would depend on where matrun runs), got "../../bin/python"'),
        ("/" + "a" * 5000, "--set python: expected the absolute path of a Python interpreter, such as "
                           '"/usr/bin/python3", of at most 4,096 bytes'),
        ("/usr/bin/python3; rm -rf /", '--set python: "/usr/bin/python3; rm -rf /": no such file'),
    ]
    if not os.access(text, os.X_OK):
        cases.append((str(text), f'--set python: "{text}" is not executable, not a Python interpreter'))
    for value, message in cases:
        with pytest.raises(MatrixError) as err:
            load_matrix(path, overrides={"variant": "system", "python": value})
        assert str(err.value).startswith(message), str(err.value)
    # an executable that is not a Python: the probe says so when the cells are planned
    matrix = load_matrix(path, overrides={"variant": "system", "python": str(script)})
    with pytest.raises(InputError) as err:
        ids(matrix)
    assert str(err.value).startswith(f'python = "{script}": not a Python interpreter matrun can probe (exit 0)')


# -- through the command line ---------------------------------------------------------------


def test_bad_flags_are_one_error_line_and_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    home = tmp_path / "home"
    cases = [
        ("plan", ["--set", "threads=x"], 'Error: --set threads: expected a thread count from 1 to 1024 or "unset", got "x"'),
        ("plan", ["--set", "nope=1"], "Error: --set nope: unknown parameter; known: framework, "),
        ("plan", ["--set", "threads"], "Error: --set threads: expected KEY=VALUE"),
        ("sweep", ["--set", "model=$(touch pwned)"], "Error: --set model: expected one of "),
        ("sweep", ["--set", "threads=4\n[sweep]"], 'Error: --set threads: expected a value without control characters'),
        ("status", ["--set", "python=/tmp"], 'Error: --set python: "/tmp" is a directory, not a Python interpreter'),
        ("cancel", ["--set", "threads=1", "--set", "threads=2"], "Error: --set threads: given twice"),
    ]
    for command, args, words in cases:
        proc = matrun(command, path, *args, cwd=tmp_path, home=home)
        assert proc.returncode == 2, (command, args, proc.stderr)
        assert proc.stderr.startswith(words), (command, args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "results").exists()
    # a command line that is not UTF-8: named, escaped, no traceback
    proc = subprocess.run([sys.executable, "-m", "matrun.runner.cli.main", "plan", str(path), "--set",
                           os.fsdecode(b"model=\xff")], cwd=tmp_path, capture_output=True, env={**os.environ, **NO_ENGINE})
    assert proc.returncode == 2 and proc.stderr == b"Error: --set model: expected a value of UTF-8 text\n"


def test_plan_status_and_cancel_show_the_overridden_cells(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    home = tmp_path / "home"
    sets = ["--set", "threads=4", "--set", "batch_size=16"]
    plan = matrun("plan", path, "--profile", "quick", *sets, cwd=tmp_path, home=home)
    assert plan.returncode == 0, plan.stderr
    words = " ".join(plan.stdout.split())  # the title wraps to the table's width
    assert "matrix.toml --profile quick --set threads=4 --set batch_size=16: 6 cells × 2 repeats" in words
    assert "12 runs: 0 done, 12 to run" in plan.stdout
    matrix = load_matrix(path, "quick", {"threads": 4, "batch_size": 16})
    expected = [pc.cell_id for pc in plan_cells(matrix, LocalExecutor().env_id)]  # what `auto` picks here
    assert all(cell in plan.stdout for cell in expected)
    status = matrun("status", path, "--profile", "quick", *sets, cwd=tmp_path, home=home)
    assert status.returncode == 0, status.stderr
    assert sorted(line.split()[1] for line in status.stdout.splitlines() if line.startswith("│")) == sorted(expected)
    cancel = matrun("cancel", path, "--profile", "quick", *sets, cwd=tmp_path, home=home)
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == "sweep over-quick: no queued or running Slurm job; nothing to cancel"


def test_a_site_python_without_a_framework_is_refused_by_name_or_skipped(tmp_path: Path, site: Path) -> None:
    """The site Python has torch (a stand-in): the jax and tensorflow cells cannot run there."""
    path = write(tmp_path, """
[sweep]
name = "site"
timeout = 120

[fixed]
dataset = "synthetic"
iterations = 20
threads = 1

[axes]
framework = ["torch", "jax", "tensorflow"]
variant = ["cpu"]
""")
    home = tmp_path / "home"
    sets = ["--set", "variant=system", "--set", f"python={site}"]
    over = load_matrix(path, overrides={"variant": "system", "python": str(site)})
    torch_id, jax_id, tf_id = ids(over)

    plan = matrun("plan", path, *sets, cwd=tmp_path, home=home)
    assert plan.returncode == 0, plan.stderr
    notes = plan.stderr.splitlines()
    assert [line.split()[4] for line in notes[:2]] == [jax_id, tf_id]
    assert notes[0].startswith(f"cannot run here: cell {jax_id} (framework=jax): python = \"{site}\"")
    assert notes[0].endswith("cannot import jax, flax, optax: JAX is not installed there; install it into that "
                             "interpreter, or name one that has it")
    assert notes[2].startswith("note: `matrun sweep` refuses these 2 cell(s) before anything runs")

    refused = matrun("sweep", path, "--executor", "local", *sets, cwd=tmp_path, home=home)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Error:"))
    assert len(error_lines(refused)) == 1
    assert lines[start].startswith(f"Error: cell {jax_id} (framework=jax): python = \"{site}\"")
    assert lines[start + 1].startswith(f"cell {tf_id} (framework=tensorflow): ")
    assert "cannot import tensorflow: TensorFlow is not installed there" in lines[start + 1]
    assert lines[start + 2] == ("nothing ran: 2 of 3 cells cannot run here; --skip-unrunnable skips them and "
                                "runs the other 1")
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("spec.json"))

    # the others run (the stand-in torch fails at once in the harness: exit 1, the run recorded)
    skipped = matrun("sweep", path, "--executor", "local", "--skip-unrunnable", *sets, cwd=tmp_path, home=home)
    assert skipped.returncode == 1, skipped.stderr
    assert f"skipped, cannot run here (--skip-unrunnable): cell {jax_id} (framework=jax): " in skipped.stderr
    assert f"not run, cannot run here (--skip-unrunnable): cell {tf_id} (framework=tensorflow): " in skipped.stderr
    assert "sweep site: 1 runs (1 failed); 0 already done" in skipped.stdout
    ran = {spec.parent.parent.name for spec in (tmp_path / "results").rglob("spec.json")}
    assert ran == {torch_id}

    # status with the same --set finds that run; without it, the file's own (cpu) cells, none run
    status = matrun("status", path, *sets, cwd=tmp_path, home=home)
    rows = {line.split()[1]: line for line in status.stdout.splitlines() if line.startswith("│")}
    assert set(rows) == {torch_id, jax_id, tf_id}
    assert "failed" in rows[torch_id] and "│ -" in rows[jax_id].replace("  ", " ")
    plain = matrun("status", path, cwd=tmp_path, home=home)
    assert not {torch_id, jax_id, tf_id} & {line.split()[1] for line in plain.stdout.splitlines()
                                            if line.startswith("│")}
    # a site Python that can run none of the selection: an error, --skip-unrunnable or not
    none = matrun("sweep", path, "--executor", "local", "--skip-unrunnable", "--where", "framework=jax", *sets,
                  cwd=tmp_path, home=home)
    assert none.returncode == 2 and len(error_lines(none)) == 1
    assert none.stderr.strip().splitlines()[-1] == "--skip-unrunnable: no cell of the selection is left to run"
