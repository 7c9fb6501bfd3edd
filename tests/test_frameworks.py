"""A framework is a folder: ``images/<name>/`` + ``runner/harness/adapters/<name>.py`` +
``docs/frameworks/<name>.md``, and nothing else (docs/FRAMEWORKS.md).

- No other module of the installed package names a framework in its code (a string or an
  identifier; comments and docstrings are prose and may), but for the documented debts in
  ``STILL_NAMED``.
- A new framework folder is picked up with its display name, presets, defaults and
  multi-worker description, and reaches the SQL macros.
- A malformed framework.toml is an InputError that names the file and the key.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
from pathlib import Path

import duckdb
import pytest

import matrun
from matrun.errors import InputError
from matrun.frameworks import (
    PLACEHOLDERS, Workers, display_name, frameworks, host_env_prefixes, load_framework,
)
from matrun.runner.planning import presets
from matrun.runner.planning.params import PARAMS
from matrun.warehouse.framework_sql import framework_macros

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(matrun.__file__).resolve().parent  # the installed package, not the checkout
#: Every spelling of a framework a module could use: the values, the display names, and the
#: names of their APIs that are not the framework's own.
NAMES = sorted({*frameworks(), *(fw.display_name.lower() for fw in frameworks().values()),
                "torch", "pytorch", "tensorflow", "mxnet", "gluon"})
_NAMED = re.compile(r"(?<![a-z0-9])(" + "|".join(map(re.escape, NAMES)) + r")(?![a-z0-9])", re.I)
#: Where a framework may be named: its own adapter and its own folder.
OWN_PLACES = ("runner/harness/adapters/", "images/")

#: Framework names still written outside the framework's folder: (file, the start of the
#: string or identifier that names one) -> why, and what removes it.  Empty: keep it so.
STILL_NAMED: dict[tuple[str, str], str] = {}


def named_in_python(text: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal or identifier that names a framework; docstrings
    and comments are prose and are not looked at."""
    tree = ast.parse(text)
    prose = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
             and isinstance(node.value.value, str)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            words = [node.value]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.keyword):
            words = [node.arg or ""]
        elif isinstance(node, ast.alias):
            words = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or ""]
        else:
            continue
        found += [(node.lineno, w) for w in words if _NAMED.search(w)]
    return sorted(found)


def named_in_sql(text: str) -> list[tuple[int, str]]:
    """(line, code) of each line whose SQL, comments left out, names a framework."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code, quoted = [], False
        for i, ch in enumerate(line):
            if ch == "'":
                quoted = not quoted
            if not quoted and line.startswith("--", i):
                break
            code.append(ch)
        if _NAMED.search("".join(code)):
            found.append((number, "".join(code).strip()))
    return found


def package_findings(skip: tuple[str, ...] | None = None) -> list[tuple[str, int, str]]:
    """(file, line, text) of every framework named in a .py or .sql module of the installed
    package outside the frameworks' own places; file paths as in the repository."""
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.suffix not in (".py", ".sql") or rel.startswith(OWN_PLACES if skip is None else skip):
            continue
        if not rel.startswith(("runner/", "warehouse/", "reports/")):
            rel = f"src/matrun/{rel}"
        text = path.read_text(encoding="utf-8")
        named = named_in_python(text) if path.suffix == ".py" else named_in_sql(text)
        found += [(rel, line, what) for line, what in named]
    return found


def _debt(rel: str, what: str) -> tuple[str, str] | None:
    return next((key for key in STILL_NAMED if key[0] == rel and what.startswith(key[1])), None)


def test_no_module_outside_a_frameworks_folder_names_a_framework():
    found = package_findings()
    # The scan must see the package: unfiltered, it finds the adapters' own names.
    assert package_findings(skip=()), "the scan found nothing at all: is the package where it looks?"
    bad = [f"{rel}:{line}: {what[:100]!r}" for rel, line, what in found if _debt(rel, what) is None]
    assert not bad, ("a framework is named outside images/<name>/ and runner/harness/adapters/<name>.py; "
                     "make it data in framework.toml (docs/FRAMEWORKS.md):\n" + "\n".join(bad))


def test_every_documented_debt_is_still_owed():
    found = package_findings()
    paid = [key for key in STILL_NAMED if not any(_debt(rel, what) == key for rel, _, what in found)]
    assert not paid, f"no longer named there, remove from STILL_NAMED: {paid}"


def test_the_scan_sees_code_and_leaves_prose_alone():
    source = '''"""A docstring may say PyTorch."""
# and a comment may say mxnet
MXNET_SERVERS = 1
def f(framework):
    """So may this one: TensorFlow."""
    if framework == "tensorflow":
        return framework.torch_thing
    return f"{framework} is not Gluon"
'''
    assert [line for line, _ in named_in_python(source)] == [3, 6, 7, 8]
    sql = "SELECT 1 -- torch\n, CASE WHEN framework = 'mxnet' THEN 1 END\n, '--' || 'PyTorch'\n"
    assert [line for line, _ in named_in_sql(sql)] == [2, 3]


# --- a new framework is a new folder -----------------------------------------------------------

def new_framework(tmp_path: Path, name: str = "newfw") -> Path:
    """images/torch copied as a framework called ``name``."""
    folder = tmp_path / name
    shutil.copytree(ROOT / "images" / "torch", folder)
    toml = folder / "framework.toml"
    toml.write_text(toml.read_text(encoding="utf-8")
                    .replace('name = "torch"', f'name = "{name}"')
                    .replace('display_name = "PyTorch"', 'display_name = "New Framework"')
                    .replace("batch_size = 64\n", "batch_size = 32\n", 1), encoding="utf-8")
    return folder


def test_a_new_framework_folder_is_picked_up_with_its_data(tmp_path: Path):
    fw = load_framework(new_framework(tmp_path))
    assert fw is not None and (fw.name, fw.display_name) == ("newfw", "New Framework")
    assert fw.presets["mnist"] == {"optimizer": "adadelta", "lr": 1.0, "batch_size": 32, "epochs": 14,
                                   "eval_batch_size": 1000}
    assert fw.presets["cifar10"] == frameworks()["torch"].presets["cifar10"]
    assert fw.defaults == {"layout": "nchw", "conv_algo": "heuristic"}
    assert fw.variants.keys() == frameworks()["torch"].variants.keys()
    assert fw.workers == frameworks()["torch"].workers
    # ... and reaches the warehouse's macros with the others
    con = duckdb.connect()
    for _, sql in framework_macros({**frameworks(), fw.name: fw}):
        con.execute(sql)
    row = con.execute("SELECT framework_preset_hyperparams('newfw', 'mnist'), framework_default_layout('newfw'), "
                      "framework_default_conv_algo('newfw', 'gpu'), framework_builtin_blas('newfw')").fetchone()
    assert row == ({"optimizer": "adadelta", "lr": 1.0, "batch_size": 32}, "nchw", "heuristic", None)
    assert con.execute("SELECT framework_default_layout('tensorflow'), framework_builtin_blas('tensorflow'), "
                       "framework_default_layout('unknown')").fetchone() == ("nhwc", "eigen", None)


def test_the_macros_render_without_any_framework():
    con = duckdb.connect()
    for _, sql in framework_macros({}):
        con.execute(sql)
    assert con.execute("SELECT framework_default_layout('x'), framework_default_conv_algo('x', 'cpu'), "
                       "framework_builtin_blas('x'), framework_preset_hyperparams('x', 'mnist')"
                       ).fetchone() == (None, "heuristic", None, None)


def test_the_shipped_frameworks_data_is_consistent():
    for fw in frameworks().values():
        assert fw.display_name and set(fw.defaults) == {"layout", "conv_algo"}, fw.name
        for key, value in fw.defaults.items():  # each a value the parameter accepts as it is
            assert PARAMS[key].check(value) == value, (fw.name, key)
        for family, values in fw.presets.items():
            assert family in presets.FAMILY.values(), (fw.name, family)
            for key, value in values.items():
                assert PARAMS[key].check(value) == value, (fw.name, family, key)
    assert display_name("torch") == "PyTorch" and display_name("nope") == "nope"
    assert set(host_env_prefixes()) == {"GLOO_", "NCCL_", "TF_", "MXNET_", "DMLC_", "JAX_", "XLA_", "TF_CPP_",
                                          "THEANO", "CHAINER_"}


def test_presets_come_from_the_framework_data():
    assert presets.PRESET_VALUES == {(fw.name, family): dict(values) for fw in frameworks().values()
                                     for family, values in fw.presets.items()}
    filled = presets.apply_preset({**{k: p.default for k, p in PARAMS.items()}, "framework": "tensorflow",
                                   "dataset": "fashion-mnist", "preset": "framework-default", "epochs": 3},
                                  explicit={"epochs"})
    assert (filled["optimizer"], filled["lr"], filled["batch_size"], filled["epochs"]) == ("adam", 0.001, 128, 3)


def test_a_preset_of_an_unknown_parameter_names_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    folder = new_framework(tmp_path)
    toml = folder / "framework.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("epochs = 14\n", "epochz = 14\n"), encoding="utf-8")
    monkeypatch.setattr(presets, "frameworks", lambda: {"newfw": load_framework(folder)})
    with pytest.raises(InputError) as err:
        presets.preset_values()
    assert str(err.value) == "images/newfw/framework.toml [presets.mnist]: unknown parameter(s) epochz"


# --- the multi-worker description -------------------------------------------------------------

def test_workers_templates_fill_text_and_json():
    w = Workers(ports=("workers",), env={"worker": {
        "ADDRS": "{worker_addresses}", "ME": "{addr}:{port}",
        "CONF": {"json": {"all": "{worker_addresses}", "me": {"index": "{rank}", "name": "w{rank}"}}}}})
    values = {"worker_addresses": ["a:1", "b:2"], "addr": "a", "port": 1, "rank": 0}
    assert w.environment("worker", values) == {
        "ADDRS": "a:1,b:2", "ME": "a:1", "CONF": '{"all":["a:1","b:2"],"me":{"index":0,"name":"w0"}}'}
    assert w.ports_needed(3) == 3 and w.port([5, 6, 7], "workers", 2, 3) == 7 and w.port([5], "servers", 0, 1) is None
    ps = frameworks()["mxnet"].workers
    assert ps.ports_needed(2) == 4 and ps.port([10, 11, 12, 13], "workers", 1, 2) == 13


# --- malformed descriptions --------------------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    (('name = "torch"', 'name = "torch"\nadapter = "torch"'),
     "images/torch/framework.toml: unknown key(s) adapter"),
    (("default = true", 'default = "yes"'),
     "images/torch/framework.toml: default must be true or false, got 'yes'"),
    (('ports = ["rendezvous"]', 'ports = ["rendezvous"]\nserver_code = "import torch"'),
     "images/torch/framework.toml [workers]: server_code (what the scheduler and servers run) is needed "
     "exactly when parameter_servers > 0"),
    (('display_name = "PyTorch"', "display_name = 3"),
     "images/torch/framework.toml: display_name must be a string, got 3"),
    (("[env]\n", "[env]\nthraeds = []\n"),
     "images/torch/framework.toml [env]: unknown key(s) thraeds"),
    (('layout = "nchw"', 'layout = "nchw"\nprecision = "fp32"'),
     "images/torch/framework.toml [defaults]: unknown key(s) precision"),
    (("batch_size = 64\n", "batch_size = [64]\n"),
     "images/torch/framework.toml [presets.mnist]: batch_size must be a string, a number or a boolean, got [64]"),
    (('ports = ["rendezvous"]', 'ports = ["rendezvous"]\nservers = 2'),
     "images/torch/framework.toml [workers]: unknown key(s) servers"),
    (('ports = ["rendezvous"]', 'ports = ["store"]'),
     "images/torch/framework.toml [workers]: ports lists each of rendezvous, servers, workers at most once, "
     "got ['store']"),
    (("[workers.env.worker]", "[workers.env.server]"),
     "images/torch/framework.toml [workers.env.server]: a framework without parameter servers has no server "
     "process"),
    (("[workers.env.worker]", "[workers.env.chief]"),
     "images/torch/framework.toml [workers.env]: unknown key(s) chief"),
    (('RANK = "{rank}"', 'RANK = "{global_rank}"'),
     "images/torch/framework.toml [workers.env.worker]: RANK names {global_rank}; a template may name "
     + ", ".join("{" + p + "}" for p in PLACEHOLDERS)),
    (('RANK = "{rank}"', 'RANK = "{rank:03d}"'),
     "images/torch/framework.toml [workers.env.worker]: RANK names {rank:03d}; a template may name "
     + ", ".join("{" + p + "}" for p in PLACEHOLDERS)),
    (('RANK = "{rank}"', 'RANK = "{worker_addresses}"'),
     'images/torch/framework.toml [workers.env.worker]: RANK names {worker_addresses}, which needs "workers" '
     "in [workers] ports"),
    (('RANK = "{rank}"', 'RANK = { jsn = "{rank}" }'),
     "images/torch/framework.toml [workers.env.worker] RANK: unknown key(s) jsn"),
    (("[workers.env.worker]", '[workers.env.all]\nPORT = "{port}"\n[workers.env.worker]'),
     "images/torch/framework.toml [workers.env.all]: PORT names {port}, each role's own port: set it in "
     "[workers.env.<role>]"),
    (("[[unsupported]]\nwhen", "[[unsupported]]\nwhy = 1\nwhen"),
     "images/torch/framework.toml [[unsupported]] 1: unknown key(s) why"),
    (('when = { device = "cpu", precision = "fp16" }', 'when = { device = "cpu", precison = "fp16" }'),
     "images/torch/framework.toml [[unsupported]] 1: precison is neither a cell parameter nor one of "
     "model_family, several_processes, several_gpus"),
])
def test_a_malformed_description_names_the_file_and_the_key(tmp_path: Path, edit: tuple[str, str], message: str):
    folder = tmp_path / "torch"
    shutil.copytree(ROOT / "images" / "torch", folder)
    toml = folder / "framework.toml"
    text = toml.read_text(encoding="utf-8")
    assert edit[0] in text
    toml.write_text(text.replace(edit[0], edit[1], 1), encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_framework(folder)
    assert str(err.value) == message


def test_a_description_that_is_not_toml_names_the_file(tmp_path: Path):
    folder = tmp_path / "torch"
    folder.mkdir()
    (folder / "framework.toml").write_text('name = "torch\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"framework\.toml: not valid TOML: "):
        load_framework(folder)


def test_exactly_one_framework_is_the_default(tmp_path, monkeypatch):
    from matrun import frameworks as registry

    assert registry.default_framework() == "torch"
    assert registry.parameter_server_frameworks() == ("mxnet",)
    two = {**registry.frameworks()}
    two["tensorflow"] = dataclasses.replace(two["tensorflow"], default=True)
    monkeypatch.setattr(registry, "frameworks", lambda: two)
    with pytest.raises(InputError, match="exactly one images/\\*/framework.toml must say default = true; "
                                         "tensorflow, torch do"):
        registry.default_framework()


def test_an_unsupported_rule_may_name_the_facts_derived_from_the_parameters():
    from matrun.frameworks import Unsupported, derived

    lm = {"model": "gpt-tiny", "device": "gpu", "gpus": 2, "workers": 1, "nodes": None, "kvstore": None}
    assert derived(lm) == {"model_family": "transformer", "several_processes": False, "several_gpus": True}
    assert derived({**lm, "model": "lenet5", "gpus": 1, "workers": 2}) == {
        "model_family": "cnn", "several_processes": True, "several_gpus": False}
    assert derived({**lm, "device": "cpu", "gpus": None, "nodes": 2})["several_processes"] is True
    assert derived({**lm, "kvstore": "dist_sync", "gpus": 1})["several_processes"] is True
    fw = dataclasses.replace(frameworks()["jax"], unsupported=(
        Unsupported({"model_family": "transformer", "several_gpus": True}, "one GPU"),))
    assert fw.refusal(lm) == "one GPU"
    assert fw.refusal({**lm, "gpus": 1}) is None and fw.refusal({**lm, "model": "lenet5"}) is None
