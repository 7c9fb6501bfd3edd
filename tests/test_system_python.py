"""The site's own Python (``variant = "system"``, ``python = "/path"``; issue 15): real
interpreters made here (virtual environments, one of them with the PyTorch environment's
packages), their environment ids from a real probe, its cache, the refusals (no framework, an
old Python, the docker and slurm-docker executors, bad ``python`` values) and a real LeNet-5
cell run through ``matrun sweep --executor local`` into the warehouse."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from lake_client import plain_connect
from matrun.errors import InputError, MatrixError
from matrun.frameworks import frameworks
from matrun.runner.environments import system
from matrun.runner.environments.system import (
    MIN_PYTHON, executor_refusal, framework_modules, probe_python, system_env_id, system_refusal,
)
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.executors.protocol import RunRequest
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.slurm.executor import SlurmExecutor
from matrun.runner.slurm.settings import SlurmSettings

ROOT = Path(__file__).resolve().parents[1]
MATRUN = [str(Path(sys.executable).with_name("matrun"))]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/matrun-test/docker.sock"}


# -- helpers --------------------------------------------------------------------------------


def make_venv(where: Path, base: Path | str = sys.executable) -> Path:
    """A real virtual environment without pip (fast): its interpreter."""
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    return where / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def add_distribution(python: Path, name: str, version: str) -> Path:
    """Install a (module-less) distribution the way pip leaves one: a ``*.dist-info`` directory."""
    info = site_packages(python) / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


def matrix(tmp_path: Path, body: str, name: str = "matrix.toml") -> Path:
    path = tmp_path / name
    path.write_text('[sweep]\nname = "site"\ntimeout = 300\n' + body)
    return path


def system_cell(python: Path | str, extra: str = "") -> str:
    return f'[fixed]\nvariant = "system"\npython = "{python}"\ndataset = "synthetic"\n{extra}'


def matrun(*args: str, cwd: Path, home: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, **NO_ENGINE, "MATRUN_HOME": str(home)}
    proc = subprocess.run([*MATRUN, *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"matrun {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $MATRUN_HOME: the probe cache of these tests only."""
    path = tmp_path / "home"
    monkeypatch.setenv("MATRUN_HOME", str(path))
    return path


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real interpreter without any framework: ``python -m venv``."""
    return make_venv(tmp_path_factory.mktemp("bare") / "venv")


def plan_of(path: Path) -> list:
    return plan_cells(load_matrix(path), lambda fw, variant: f"{fw}-{variant}-venv")


# -- the python key -------------------------------------------------------------------------


def test_system_needs_python_and_python_needs_system(tmp_path: Path, bare: Path) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(matrix(tmp_path, '[fixed]\nvariant = "system"\ndataset = "synthetic"\n'))
    assert str(err.value) == ('matrix.toml: [fixed] python is missing: a variant = "system" cell runs in the '
                              'site\'s own Python, named by python = "/absolute/path/to/python"')
    assert err.value.exit_code == 2
    with pytest.raises(MatrixError) as err:
        load_matrix(matrix(tmp_path, f'[fixed]\npython = "{bare}"\ndataset = "synthetic"\n'))
    assert str(err.value) == ('matrix.toml: [fixed] python is only for variant = "system" (the site\'s own '
                              'Python); variant "cpu" runs in the environment matrun builds for it')
    # on an axis: the combination is named
    with pytest.raises(MatrixError) as err:
        load_matrix(matrix(tmp_path, f'[fixed]\npython = "{bare}"\ndataset = "synthetic"\n'
                                     '[axes]\nvariant = ["system", "cpu"]\n'))
    assert str(err.value).startswith('matrix.toml: [axes] {variant = "cpu"}: python is only for variant = "system"')


@pytest.mark.parametrize("value, words", [
    ('"bin/python"', 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3" (a relative '
                     'path would depend on where matrun runs), got "bin/python"'),
    ('"~/python"', 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3" (a relative '
                   'path would depend on where matrun runs), got "~/python"'),
    ('"/nonexistent/matrun-test/python"', '"/nonexistent/matrun-test/python": no such file (expected the '
                                          'absolute path of a Python interpreter)'),
    ('"/"', '"/" is a directory, not a Python interpreter (name its bin/python)'),
    ('"/dev/null"', '"/dev/null" is not a regular file, not a Python interpreter'),
    ('"/usr/bin/python3\\n"', 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3", '
                              'without control characters, got "/usr/bin/python3\\n"'),
    ('"/usr/bin/python3\\u0000x"', 'expected the absolute path of a Python interpreter, such as '
                                   '"/usr/bin/python3", without control characters, got "/usr/bin/python3\\x00x"'),
    ('"/' + "a" * 5000 + '"', 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3", '
                              'of at most 4,096 bytes, got "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'),
    ("42", 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3", got 42'),
    ('["/usr/bin/python3"]', 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3", '
                             "got ['/usr/bin/python3']"),
    ("true", 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3", got true'),
])
def test_malformed_and_hostile_python_values_are_refused_naming_the_key(tmp_path: Path, value: str,
                                                                        words: str) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(matrix(tmp_path, f'[fixed]\nvariant = "system"\ndataset = "synthetic"\npython = {value}\n'))
    assert str(err.value) == f"matrix.toml: [fixed -> python] {words}"
    assert err.value.exit_code == 2


def test_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "python"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    if os.access(plain, os.X_OK):
        pytest.skip("this user may execute any file")
    with pytest.raises(MatrixError) as err:
        load_matrix(matrix(tmp_path, system_cell(plain)))
    assert str(err.value) == f'matrix.toml: [fixed -> python] "{plain}" is not executable, not a Python interpreter'


def test_bad_python_values_are_an_error_line_of_the_cli(tmp_path: Path) -> None:
    path = matrix(tmp_path, '[fixed]\nvariant = "system"\ndataset = "synthetic"\n[axes]\n'
                            'python = ["relative/python", "/nonexistent/matrun-test/python"]\n')
    proc = matrun("plan", str(path), cwd=tmp_path, home=tmp_path / "home", check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[:2] == [
        'Error: matrix.toml: [axes -> python -> 0] expected the absolute path of a Python interpreter, such as '
        '"/usr/bin/python3" (a relative path would depend on where matrun runs), got "relative/python"',
        'matrix.toml: [axes -> python -> 1] "/nonexistent/matrun-test/python": no such file (expected the '
        'absolute path of a Python interpreter)']


def test_an_executable_that_is_not_python_is_refused_at_plan_time(tmp_path: Path, home: Path) -> None:
    for text, words in [("#!/bin/sh\nexit 0\n", "not a Python interpreter matrun can probe (exit 0)"),
                        ("#!/bin/sh\necho oops >&2\nexit 3\n", "not a Python interpreter matrun can probe (exit 3): oops"),
                        ("#!/bin/sh\nprintf '@@matrun-system-probe@@\\n{\"version\": \"3\"}\\n'\n",
                         "its probe answered with something matrun cannot read")]:
        fake = tmp_path / "fake-python"
        fake.write_text(text)
        fake.chmod(0o755)
        with pytest.raises(InputError) as err:
            plan_of(matrix(tmp_path, system_cell(fake)))
        assert str(err.value).startswith(f'python = "{fake}": {words}'), str(err.value)
        assert err.value.exit_code == 2
        fake.unlink()


def test_a_probe_that_hangs_is_stopped_by_its_timeout(tmp_path: Path, home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs in its own session: the timeout kills what it started too."""
    pids = tmp_path / "pids"
    fake = tmp_path / "slow-python"
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pids}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(system, "PROBE_TIMEOUT_S", 1.0)
    with pytest.raises(InputError) as err:  # the sleeper would hold it 60 s: the error is the timeout's
        probe_python(str(fake))
    assert str(err.value) == (f'python = "{fake}": its probe did not answer within 1 s; is it a Python '
                              "interpreter?")
    sleeper = int(pids.read_text())
    for _ in range(100):  # killed with its session (a zombie for an instant at most)
        if not Path(f"/proc/{sleeper}").exists() or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the probe's child {sleeper} outlived the timeout")


# -- environment ids ------------------------------------------------------------------------


def test_the_environment_id_follows_the_install_not_the_path(tmp_path: Path, home: Path) -> None:
    python = make_venv(tmp_path / "site")
    first = system_env_id("torch", str(python))
    assert first.startswith("torch-system-") and len(first) == len("torch-system-") + 12
    assert system_env_id("torch", str(python)) == first  # the same install twice: the same id
    probe = probe_python(str(python))
    assert probe.prefix == str((tmp_path / "site").resolve())
    assert probe.version == tuple(sys.version_info[:3])

    # the same install through other paths: a second link in bin/, a link to the whole venv
    (tmp_path / "alias").symlink_to(tmp_path / "site")
    for other in (tmp_path / "site" / "bin" / "python3", tmp_path / "alias" / "bin" / "python"):
        assert system_env_id("torch", str(other)) == first, other

    # a package installed: another environment; removed again: the first one
    info = add_distribution(python, "matrun-site-marker", "1.0")
    second = system_env_id("torch", str(python))
    assert second != first
    assert "matrun-site-marker==1.0" in probe_python(str(python)).distributions
    shutil.rmtree(info)
    assert system_env_id("torch", str(python)) == first

    # another interpreter with another package set: another environment
    other = make_venv(tmp_path / "other")
    add_distribution(other, "matrun-other-marker", "2.0")
    assert system_env_id("torch", str(other)) not in (first, second)
    # and the framework names the id, the install hashes it
    assert system_env_id("jax", str(python)) == "jax" + first[len("torch"):]


def test_two_paths_to_one_install_are_one_cell_and_python_is_not_part_of_the_id(tmp_path: Path,
                                                                                 home: Path) -> None:
    python = make_venv(tmp_path / "site")
    (tmp_path / "alias").symlink_to(tmp_path / "site")
    body = ('[fixed]\nvariant = "system"\ndataset = "synthetic"\n[axes]\n'
            f'python = ["{python}", "{tmp_path / "alias" / "bin" / "python"}"]\n')
    planned = plan_of(matrix(tmp_path, body))
    assert len(planned) == 1
    assert planned[0].env_id == system_env_id("torch", str(python))
    assert "python" not in planned[0].cell.identity
    # a cpu cell of the same matrix keeps the executor's environment
    mixed = plan_of(matrix(tmp_path, f'[fixed]\ndataset = "synthetic"\n[[include]]\nvariant = "system"\n'
                                     f'python = "{python}"\n[[include]]\nvariant = "cpu"\n'))
    assert [pc.env_id for pc in mixed] == ["torch-cpu-venv", system_env_id("torch", str(python))]


def test_the_probe_is_cached_and_run_again_when_the_install_changes(tmp_path: Path) -> None:
    """`matrun plan` twice runs the interpreter once; a package installed since runs it again
    (its site-packages changed) and plans another environment."""
    venv = make_venv(tmp_path / "site")
    calls = tmp_path / "calls"
    wrapper = tmp_path / "python"  # the site's interpreter, counting its starts
    wrapper.write_text(f'#!/bin/sh\necho run >> {calls}\nexec {venv} "$@"\n')
    wrapper.chmod(0o755)
    path = matrix(tmp_path, system_cell(wrapper))
    home = tmp_path / "home"

    def env_of_plan() -> str:
        out = matrun("plan", str(path), cwd=tmp_path, home=home).stdout
        return next(word for word in out.split() if word.startswith("torch-system-"))

    first = env_of_plan()
    assert calls.read_text().count("run") == 1
    assert env_of_plan() == first
    assert calls.read_text().count("run") == 1  # from the cache
    assert len(list((home / "system").glob("*.json"))) == 1
    add_distribution(venv, "matrun-site-marker", "1.0")
    assert env_of_plan() != first
    assert calls.read_text().count("run") == 2


def test_min_python_is_what_the_package_requires_and_the_harness_parses_there() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=" + ".".join(map(str, MIN_PYTHON))
    for source in sorted((ROOT / "runner" / "harness").rglob("*.py")):
        ast.parse(source.read_text(encoding="utf-8"), str(source), feature_version=MIN_PYTHON)


def test_framework_modules_come_from_each_framework_toml() -> None:
    """Framework-neutral: the modules are read from import_check, the standard library's left out."""
    for name, fw in frameworks().items():
        modules = framework_modules(name)
        assert modules, name
        assert not set(modules) & set(sys.stdlib_module_names), (name, modules)
        assert all(m in fw.import_check for m in modules)
        assert SYSTEM_VARIANT not in fw.variants, f"images/{name}/framework.toml declares the reserved variant"


# -- refusals -------------------------------------------------------------------------------


def test_a_python_without_the_framework_is_refused_before_anything_runs(tmp_path: Path, bare: Path) -> None:
    path = matrix(tmp_path, system_cell(bare, "iterations = 20\n"))
    home = tmp_path / "home"
    proc = matrun("sweep", str(path), "--executor", "local", cwd=tmp_path, home=home, check=False)
    assert proc.returncode == 2
    cell = matrun("plan", str(path), cwd=tmp_path, home=home).stdout.split()
    prefix = str(bare.parent.parent.resolve())
    version = ".".join(map(str, sys.version_info[:3]))
    error = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1
    assert error[0].startswith("Error: cell ") and error[0].split()[2] in cell
    assert error[0].endswith(f'python = "{bare}" (CPython {version} at {prefix}) cannot import torch: PyTorch '
                             "is not installed there; install it into that interpreter, or name one that has it")
    assert not list((tmp_path / "results").rglob("spec.json"))  # nothing ran


def test_the_local_executor_records_a_refused_system_cell_as_failed(tmp_path: Path, home: Path,
                                                                   bare: Path) -> None:
    """What a Slurm task (runtime "local") gets: the run is failed with the reason, nothing started."""
    (pc,) = plan_of(matrix(tmp_path, system_cell(bare, 'framework = "jax"\n')))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outcome = LocalExecutor().run(RunRequest(run_dir=run_dir, params=pc.params, env_id=pc.env_id,
                                             timeout=60, data_dir=tmp_path))
    assert outcome.status == "failed" and outcome.exit_code is None
    assert "cannot import jax, flax, optax: JAX is not installed there" in outcome.error_tail
    assert not (run_dir / "events.jsonl").exists()


def test_an_install_changed_since_the_plan_is_not_run(tmp_path: Path, home: Path, bare: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The cell's environment id was fixed when it was planned: a run in another install is refused."""
    (pc,) = plan_of(matrix(tmp_path, system_cell(bare)))
    monkeypatch.setattr("matrun.runner.executors.local.system_refusal", lambda framework, python: None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outcome = LocalExecutor().run(RunRequest(run_dir=run_dir, params=pc.params, env_id="torch-system-0123456789ab",
                                             timeout=60, data_dir=tmp_path))
    assert outcome.status == "failed"
    assert outcome.error_tail == (f'[matrun] python = "{bare}" is no longer the install this cell was planned '
                                  f"with (environment torch-system-0123456789ab, now {pc.env_id}: a package was "
                                  "installed or removed); plan the sweep again")


def test_an_interpreter_removed_since_the_plan_is_a_failed_run_not_an_exception(tmp_path: Path,
                                                                               home: Path) -> None:
    python = make_venv(tmp_path / "site")
    (pc,) = plan_of(matrix(tmp_path, system_cell(python)))
    shutil.rmtree(tmp_path / "site")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outcome = LocalExecutor().run(RunRequest(run_dir=run_dir, params=pc.params, env_id=pc.env_id,
                                             timeout=60, data_dir=tmp_path))
    assert (outcome.status, outcome.exit_code) == ("failed", None)
    assert outcome.error_tail == f'[matrun] python = "{python}": no such file, or it cannot be read'


def test_docker_and_slurm_docker_refuse_system_cells(tmp_path: Path, home: Path, bare: Path) -> None:
    params = {"variant": SYSTEM_VARIANT, "python": str(bare), "nodes": 1, "framework": "torch"}
    words = (f'variant = "system" runs in the site\'s own Python (python = "{bare}") with the local executor '
             "only; the {} executor runs cells in the images matrun builds: use --executor local (under "
             'Slurm: [slurm] runtime = "local")')
    assert DockerExecutor().refusal(params) == words.format("docker")
    assert SlurmExecutor(SlurmSettings(runtime="docker")).refusal(params) == words.format('slurm (runtime "docker")')
    assert SlurmExecutor(SlurmSettings(runtime="local")).refusal(params) is None  # its tasks run the local executor
    assert executor_refusal(params, "local") is None
    assert executor_refusal({**params, "variant": "cpu"}, "docker") is None
    # through the CLI: refused before anything runs, whatever else the sweep holds
    path = matrix(tmp_path, system_cell(bare))
    proc = matrun("sweep", str(path), "--executor", "docker", cwd=tmp_path, home=home, check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(words.format("docker"))


def _old_python(version: str) -> Path:
    """A real interpreter of that version: pyenv's (the interpreter itself, not its shim), or on PATH."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [p for p in sorted(pyenv.glob(f"{version}.*/bin/python{version}")) if p.is_file()]
    for name in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if Path(name).is_file():
            found.append(Path(name))
    if not found:
        pytest.skip(f"no Python {version} on this machine")
    return found[0]


@pytest.mark.parametrize("version", ["3.9", "2.7"])
def test_a_python_older_than_the_harness_needs_is_refused(tmp_path: Path, home: Path, version: str) -> None:
    """A real old interpreter answers the probe (it runs on 2.7) and is refused by its version."""
    python = _old_python(version)
    probe = probe_python(str(python))
    assert ".".join(map(str, probe.version[:2])) == version and probe.too_old
    reason = system_refusal("torch", str(python))
    assert reason == (f'python = "{python}" ({probe.implementation} {probe.version_text} at {probe.prefix}): '
                      "the harness needs Python 3.10 or later; name a newer interpreter")
    (pc,) = plan_of(matrix(tmp_path, system_cell(python)))
    assert pc.env_id == probe.env_id("torch")
    assert LocalExecutor().refusal(pc.params) == reason


def test_build_and_envs_have_nothing_to_build_for_system_cells(tmp_path: Path, bare: Path) -> None:
    path = matrix(tmp_path, system_cell(bare))
    home = tmp_path / "home"
    built = matrun("build", str(path), cwd=tmp_path, home=home)
    assert built.stderr.strip() == ("torch:system: nothing to build (the site's own Python, named by python; its "
                                    "cells run with --executor local)")
    image = matrun("build", "--image", "torch:system", cwd=tmp_path, home=home)
    assert "torch:system: nothing to build" in image.stderr
    envs = matrun("envs", str(path), "--build", cwd=tmp_path, home=home)
    assert envs.stdout.splitlines()[0] == "torch:system: nothing to build (the site's own Python, named by python)"


# -- a real cell ----------------------------------------------------------------------------


@pytest.fixture
def short_dir():
    """A directory with a short path: `matrun envs` into a pipe is a 160-column table, and a site
    path under pytest-xdist's longer tmp_path (``popen-gw0/``) is folded onto two lines there."""
    path = Path(tempfile.mkdtemp(prefix="site-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_real_lenet_cell_runs_in_the_site_python_and_lands_in_the_warehouse(tmp_path: Path, torch_env,
                                                                                bare: Path, short_dir: Path) -> None:
    """A "site Python" made here: a virtual environment of its own whose site-packages carry the
    PyTorch environment's packages (a .pth line) plus one package of its own.  A LeNet-5 cell
    runs in it through `matrun sweep --executor local`; the warehouse row has the environment id
    the probe gave and the packages the run found."""
    site = make_venv(short_dir / "site", base=torch_env.python)
    (site_packages(site) / "torch-env.pth").write_text(f"{site_packages(torch_env.python)}\n")
    add_distribution(site, "matrun-site-marker", "1.0")
    home = tmp_path / "home"
    # one thread: the default, "unset", is one per CPU, and on a busy 2-CPU host the two OpenMP
    # threads wait for each other at every layer (the 20 steps took 9.4 s there; 0.3 s with one)
    path = matrix(tmp_path, system_cell(site, "model = \"lenet5\"\niterations = 20\nbatch_size = 32\n"
                                              "warmup_steps = 2\nthreads = 1\nonednn_check = false\n"))
    swept = matrun("sweep", str(path), "--executor", "local", cwd=tmp_path, home=home)
    assert "sweep site: 1 runs (1 ok); 0 already done" in swept.stdout, swept.stdout + swept.stderr

    os.environ["MATRUN_HOME"], saved = str(home), os.environ.get("MATRUN_HOME")
    try:
        probe = probe_python(str(site))  # from the cache the sweep wrote
    finally:
        if saved is None:
            del os.environ["MATRUN_HOME"]
        else:
            os.environ["MATRUN_HOME"] = saved
    con = plain_connect(tmp_path / "matrun.duckdb")
    try:
        (row,) = con.execute("SELECT env_id, executor, status, params, probe FROM runs").fetchall()
    finally:
        con.close()
    env_id, executor, status, params, run_probe = row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4])
    assert (env_id, executor, status) == (probe.env_id("torch"), "local", "ok")
    assert params["variant"] == "system" and params["python"] == str(site)
    assert run_probe["interpreter"] == {"executable": str(site), "prefix": str((short_dir / "site").resolve()),
                                        "implementation": "CPython"}
    assert run_probe["packages"] == list(probe.distributions)  # what the run saw is what the plan hashed
    assert f"torch=={run_probe['framework_version']}" in run_probe["packages"]
    assert "matrun-site-marker==1.0" in run_probe["packages"]

    listed = matrun("envs", cwd=tmp_path, home=home).stdout
    assert probe.env_id("torch") in listed and str(site) in listed

    # a package installed into the site's Python: another environment, so the cell is to run again
    add_distribution(site, "matrun-site-marker-two", "1.0")
    plan = matrun("plan", str(path), cwd=tmp_path, home=home).stdout
    assert probe.env_id("torch") not in plan and "1 runs: 0 done, 1 to run" in plan

