"""Docs that cannot rot: every CLI command has help text and a section in docs/CLI.md."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main
from typer.testing import CliRunner

from matrun.runner.cli.main import app
from matrun.runner.planning.params import PARAMS

ROOT = Path(__file__).resolve().parents[1]


def commands() -> dict:
    return typer.main.get_command(app).commands


def test_there_are_commands():
    assert {"plan", "sweep", "status", "ingest", "query", "report"} <= set(commands())


def test_every_command_has_help_and_every_option_too():
    for name, cmd in commands().items():
        assert cmd.help and len(cmd.help.strip()) > 20, f"matrun {name} has no help text"
        for param in cmd.params:
            if param.param_type_name == "option" and param.name != "help":
                assert getattr(param, "help", None), f"matrun {name} {param.opts[0]} has no help text"


def _command_paths(group=None, prefix=()):
    """Every command and group as the words that name it: (), ("plan",), ("data",), ("data", "import"), …"""
    group = group or typer.main.get_command(app)
    yield prefix
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _command_paths(cmd, (*prefix, name))


# What Typer (``<str>``, ``--force <bool>``) or Click (``TEXT``, ``INTEGER``) writes for a
# value whose option or argument names no metavar.
RAW_TYPE = re.compile(r"<[a-z][\w\[\], |]*>|\b(TEXT|INTEGER|FLOAT|BOOLEAN|PATH|FILENAME|DIRECTORY)\b")


def test_help_names_every_value_in_words():
    runner = CliRunner()
    paths = list(_command_paths())
    assert ("data", "import") in paths and ("query",) in paths
    for words in paths:
        result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, (words, result.output)
        raw = [m.group() for m in RAW_TYPE.finditer(result.output)]
        assert not raw, f"matrun {' '.join(words)} --help shows {raw}:\n{result.output}"
    query = runner.invoke(app, ["query", "--help"], env={"COLUMNS": "250"}).output
    assert re.search(r"Usage: matrun query \[OPTIONS\] \{?SQL\}?", query)
    assert re.search(r"--warehouse +DIR ", query) and re.search(r"--format +-f +FORMAT ", query)
    assert re.search(r"--help +Show this message", query)
    sweep = runner.invoke(app, ["sweep", "--help"], env={"COLUMNS": "250"}).output
    assert re.search(r"--where +-w +KEY=V\[,V…\] ", sweep) and re.search(r"--force +Run again", sweep)


def test_every_command_is_documented():
    doc = (ROOT / "docs" / "CLI.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^## `matrun (\w+)", doc, flags=re.M))
    assert documented == set(commands()), f"docs/CLI.md sections {sorted(documented)} != commands {sorted(commands())}"


def test_every_matrix_parameter_is_documented():
    doc = (ROOT / "docs" / "MATRIX.md").read_text(encoding="utf-8")
    missing = [name for name in PARAMS if f"`{name}`" not in doc]
    assert not missing, f"docs/MATRIX.md does not describe {missing}"


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test$", ci, flags=re.M)


def test_the_complete_example_in_the_matrix_docs_expands_as_described(tmp_path):
    from matrun.runner.planning.matrix import load_matrix

    doc = (ROOT / "docs" / "MATRIX.md").read_text(encoding="utf-8")
    example = re.search(r"## A complete example\n\n```toml\n(.*?)```", doc, flags=re.S).group(1)
    path = tmp_path / "matrix.toml"
    path.write_text(example, encoding="utf-8")
    m = load_matrix(path)
    assert "11 cells, 33 runs" in doc
    assert (len(m.cells), len(m.cells) * m.sweep.repeats) == (11, 33)
    assert m.cells[-1].values["timeout"] == 1800.0 and m.cells[0].values["timeout"] == 900.0


def test_every_framework_has_its_adapter_and_its_pins():
    from matrun.frameworks import frameworks
    from matrun.runner.harness.adapters import ADAPTERS

    # A framework is a folder: images/<name>/ (framework.toml, pins), the adapter named by the
    # framework value, and its notes; the harness finds the adapter by that name.
    assert sorted(frameworks()) == sorted(ADAPTERS)
    for name in frameworks():
        assert (ROOT / "images" / name / "requirements-cpu.txt").is_file()
        assert (ROOT / "runner" / "harness" / "adapters" / f"{name}.py").is_file()
        assert (ROOT / "docs" / "frameworks" / f"{name}.md").is_file()
