"""Docs that cannot rot: every CLI command has help text and a section in docs/CLI.md."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

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
