"""The import layering of matrun, checked from the source with ``ast``.

Rules (docs/ARCHITECTURE.md "Layers"):

- no import cycles between modules (imports inside functions and under TYPE_CHECKING count);
- the harness (``matrun.runner.harness``) imports nothing of matrun outside itself: it runs in
  images that have nothing but the standard library and the framework;
- each layer imports only the layers below it (``ALLOWED``): the harness, ``matrun.errors``
  and ``matrun.tomltext`` (the TOML reader, standard library only) at the bottom, the framework registry (``matrun.frameworks``), the
  warehouse, the reports, the host side of the runner, and the CLI on top;
- no module imports another module's ``_private`` names.

``python tests/test_layering.py`` prints the counts (modules, imports inside functions,
cycles, private imports) and every offending edge.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# importer prefix -> the prefixes it may import (first matching importer prefix wins: the
# most specific first).  Every module may import its own package's modules.
ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    ("matrun.errors", ()),
    ("matrun.tomltext", ()),
    ("matrun.frameworks", ("matrun.errors", "matrun.tomltext", "matrun.runner.harness")),
    ("matrun.runner.harness", ("matrun.runner.harness",)),
    ("matrun.warehouse", ("matrun.errors", "matrun.tomltext", "matrun.frameworks", "matrun.warehouse",
                          "matrun.runner.harness")),
    ("matrun.reports", ("matrun.errors", "matrun.frameworks", "matrun.reports", "matrun.warehouse")),
    ("matrun.runner.cli", ("matrun",)),
    ("matrun.runner", ("matrun.errors", "matrun.tomltext", "matrun.frameworks", "matrun.warehouse",
                       "matrun.runner")),
    ("matrun.images", ()),
    ("matrun", ("matrun.errors",)),
]


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    in_function: bool
    names: tuple[str, ...]


def package_dirs() -> dict[str, Path]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {pkg: ROOT / folder for pkg, folder in doc["tool"]["setuptools"]["package-dir"].items()}


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name, from the source folders pyproject maps."""
    dirs = package_dirs()
    found: dict[str, Path] = {}
    for pkg, folder in dirs.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            # a sub-folder mapped on its own (matrun.runner inside matrun's src) is found once
            owner = max((p for p in dirs if name == p or name.startswith(p + ".")), key=len)
            if owner == pkg:
                found[name] = path
    return found


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def edges() -> tuple[dict[str, Path], list[Edge]]:
    mods = modules()
    found: list[Edge] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            up, in_function = node, False
            while up in parents:
                up = parents[up]
                in_function |= isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef))
            targets: list[tuple[str, tuple[str, ...]]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, ()) for alias in node.names]
            else:
                source = _resolve(name, path.name == "__init__.py", node)
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append((sub, ()) if sub in mods else (source, (alias.name,)))
            for target, names in targets:
                if not (target == "matrun" or target.startswith("matrun.")):
                    continue
                owner = _owner(target, mods)
                if owner and owner != name:
                    found.append(Edge(name, owner, node.lineno, in_function, names))
    return mods, found


def cycles(mods: dict[str, Path], found: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for e in found:
        graph[e.importer].add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(mods)))
    for v in sorted(mods):
        if v not in index:
            visit(v)
    return comps


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(found: list[Edge]) -> list[Edge]:
    bad = []
    for e in found:
        rule = next(allowed for prefix, allowed in ALLOWED if _within(e.importer, prefix))
        if e.imported == "matrun":
            continue  # the root package is import-free (__version__ only)
        own_package = e.importer.rpartition(".")[0]
        if _within(e.imported, own_package) and own_package.count(".") >= 2:
            continue  # a sibling in the same sub-package
        if not any(_within(e.imported, p) for p in rule):
            bad.append(e)
    return bad


def private_imports(found: list[Edge]) -> list[Edge]:
    return [e for e in found if any(n.startswith("_") and not n.startswith("__") for n in e.names)]


def _show(edges_: list[Edge]) -> str:
    return "\n".join(f"  {e.importer} (line {e.line}) -> {e.imported}"
                     f"{' ' + ', '.join(e.names) if e.names else ''}" for e in edges_)


def test_no_import_cycles():
    mods, found = edges()
    comps = cycles(mods, found)
    detail = []
    for comp in comps:
        inside = [e for e in found if e.importer in comp and e.imported in comp]
        detail.append(f"cycle {comp}:\n{_show(inside)}")
    assert not comps, "\n".join(detail)


def test_each_layer_imports_only_the_layers_below():
    _, found = edges()
    bad = layer_violations(found)
    assert not bad, "imports that cross the layering (docs/ARCHITECTURE.md \"Layers\"):\n" + _show(bad)


def test_the_harness_imports_nothing_of_matrun_outside_itself():
    _, found = edges()
    bad = [e for e in found if _within(e.importer, "matrun.runner.harness")
           and not _within(e.imported, "matrun.runner.harness")]
    assert not bad, _show(bad)


def test_no_module_imports_another_modules_private_names():
    _, found = edges()
    bad = private_imports(found)
    assert not bad, "imports of another module's _private names:\n" + _show(bad)


def test_the_checker_sees_a_cycle_and_a_private_import(tmp_path: Path):
    # The rules above must be able to fail: a two-module cycle and a private import, built here.
    found = [Edge("matrun.runner.a", "matrun.runner.b", 1, False, ("_hidden",)),
             Edge("matrun.runner.b", "matrun.runner.a", 1, True, ()),
             Edge("matrun.warehouse.x", "matrun.reports.y", 3, False, ())]
    mods = {"matrun.runner.a": tmp_path, "matrun.runner.b": tmp_path, "matrun.warehouse.x": tmp_path,
            "matrun.reports.y": tmp_path}
    assert cycles(mods, found) == [["matrun.runner.a", "matrun.runner.b"]]
    assert private_imports(found) == found[:1]
    assert layer_violations(found) == found[2:]


def test_every_package_says_what_it_owns_and_may_import():
    missing = []
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if len(doc) < 40 or "TODO" in doc:
            missing.append(name)
    assert not missing, f"packages without a docstring saying what they own: {missing}"


def test_every_module_is_described_in_the_architecture_doc():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = [str(path.relative_to(ROOT)) for path in modules().values()
               if path.name != "__init__.py" and str(path.relative_to(ROOT)) not in doc
               and f"`{path.name}`" not in doc]
    assert not missing, f"docs/ARCHITECTURE.md does not mention {missing}"


if __name__ == "__main__":
    mods, found = edges()
    print(f"modules: {len(mods)}")
    print(f"imports of matrun modules: {len(found)}, inside functions: {sum(e.in_function for e in found)}")
    comps = cycles(mods, found)
    print(f"import cycles: {len(comps)}")
    for comp in comps:
        print("  ", " <-> ".join(comp))
    priv = private_imports(found)
    print(f"imports of another module's private names: {len(priv)}")
    print(_show(priv))
    bad = layer_violations(found)
    print(f"layer violations: {len(bad)}")
    print(_show(bad))
