"""Framework releases as a cell parameter (``version``; issue 29): the lock pip's resolver
gives a release (real pip against the package index), the environment ids it makes, the
refusals at plan time (malformed, no releases, the site's own Python, too old, a version guard,
not in the index, conflicting requirements), a build that fails half-way (nothing half-built
used, the reason kept) and the run record that carries the lock.  Cells without ``version``
keep their ids: tests/test_golden_ids.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from matrun.errors import EnvironmentBuildError, InputError, MatrixError
from matrun.frameworks import Unsupported, release_key
from matrun.runner.environments import releases, venvs
from matrun.runner.environments.releases import (
    env_variant, lock_for, nearest, pip_failure, pip_report, split_variant,
)
from matrun.runner.environments.contexts import images_needed, prepare_context, recipe_hash
from matrun.runner.environments.probes import variant_promises
from matrun.runner.executors.docker import DockerExecutor
from matrun.runner.executors.local import LocalExecutor
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.executors.docker import ImageRef
from matrun.runner.executors.protocol import RunOutcome
from matrun.warehouse.bundles.layout import RunKey
from matrun.runner.sweep.records import _release_record, write_result

MATRUN = [str(Path(sys.executable).with_name("matrun"))]
SHA = "ab" * 32


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MATRUN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text("[sweep]\nrepeats = 1\n" + body, encoding="utf-8")
    return path


def report(*pins: tuple[str, str], sha: str = SHA) -> dict:
    """pip's installation report, as ``pip install --dry-run --report`` writes it."""
    return {"pip_version": "23.2.1", "install": [
        {"metadata": {"name": n, "version": v}, "download_info": {"archive_info": {"hashes": {"sha256": sha}}}}
        for n, v in pins]}


# -- the release grammar and its order ---------------------------------------------------------


def test_releases_sort_as_pep_440_orders_them():
    order = ["1.13.0", "1.13.1", "2.0.0rc1", "2.0", "2.0.0.post1", "2.4.1", "2.10.0", "2.13.0"]
    assert sorted(reversed(order), key=release_key) == order
    assert release_key("2.4") == release_key("2.4.0")
    assert nearest("2.4.7", ["2.3.1", "2.4.0", "2.4.1", "2.5.0", "2.6.0"]) == ["2.4.0", "2.4.1", "2.5.0"]
    assert nearest("0.1", ["2.4.0", "2.5.0"]) == ["2.4.0", "2.5.0"]


def test_a_guard_holds_only_for_releases_older_than_its_bound():
    guard = Unsupported({"compile": "compiled"}, "no torch.compile", releases_before="2.0")
    assert guard.matches({"compile": "compiled", "version": "1.13.1"})
    assert not guard.matches({"compile": "compiled", "version": "2.0.0"})
    assert not guard.matches({"compile": "compiled", "version": ""})  # today's pins
    assert not guard.matches({"compile": "eager", "version": "1.13.1"})


def test_the_environment_key_carries_the_release():
    assert env_variant({"variant": "cpu", "version": "2.4.1"}) == "cpu@2.4.1"
    assert env_variant({"variant": "cpu", "version": ""}) == "cpu"
    assert split_variant("cpu@2.4.1") == ("cpu", "2.4.1")


# -- refused at plan time ------------------------------------------------------------------------


@pytest.mark.parametrize("body, words", [
    ('[fixed]\nversion = "2.x"\n', ['version', 'expected a release such as "2.4.1"', '"2.x"']),
    ('[fixed]\nversion = "v2.4.1"\n', ['version', '"v2.4.1"']),
    ('[fixed]\nversion = 2.4\n', ['version', 'as a string']),
    ('[fixed]\nversion = "2.4.1; rm -rf /"\n', ['version', 'expected a release']),
    ('[fixed]\nframework = "mxnet"\nversion = "1.9.1"\n', ['version "1.9.1"', "MXNet has no releases",
                                                           "last release is 1.9.1"]),
    ('[fixed]\nframework = "theano"\nversion = "1.0.4"\n', ["Theano has no releases"]),
    ('[fixed]\nvariant = "cpu-openblas"\nversion = "2.4.1"\n', ['built for variant cpu, not "cpu-openblas"']),
    ('[fixed]\nvariant = "system"\npython = "/usr/bin/python3"\nversion = "2.4.1"\n',
     ['version "2.4.1"', 'variant = "system"', "leave version out"]),
    ('[fixed]\nversion = "1.12.1"\n', ['version "1.12.1"', "drives torch 1.13.0 and newer"]),
    ('[fixed]\nframework = "jax"\nversion = "0.4.1"\n', ['drives jax 0.4.20 and newer']),
    ('[fixed]\nversion = "1.13.1"\ncompile = "compiled"\n', ["torch.compile came with PyTorch 2.0"]),
    ('[fixed]\nversion = "1.13.1"\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\nattention = "fused"\n',
     ["scaled_dot_product_attention came with PyTorch 2.0"]),
])
def test_a_release_that_cannot_run_is_refused_when_the_matrix_is_read(tmp_path, body, words):
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, body))
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_guarded_combination_runs_in_a_release_that_has_it(tmp_path):
    m = load_matrix(write(tmp_path, '[fixed]\ncompile = "compiled"\n[axes]\nversion = ["2.0.1", ""]\n'))
    assert [c.values["version"] for c in m.cells] == ["2.0.1", ""]


def test_a_cell_without_version_keeps_its_identity(tmp_path):
    m = load_matrix(write(tmp_path, '[fixed]\nthreads = 1\n'))
    assert "version" not in m.cells[0].identity
    assert "version" in load_matrix(write(tmp_path, '[fixed]\nthreads = 1\nversion = "2.4.1"\n')).cells[0].identity


# -- the lock ------------------------------------------------------------------------------------


def test_a_release_is_resolved_once_and_its_environment_id_is_known_before(home):
    calls = []

    def resolver(requested):
        calls.append(requested)
        return report(("torch", "2.4.1"), ("numpy", "1.26.4"), ("filelock", "4.3.1"))

    lock = lock_for("torch", "cpu", "2.2.2", resolver=resolver)
    assert calls == [["torch==2.2.2", "numpy", "threadpoolctl==3.8.0", "numpy<2"]]  # the extra of < 2.3
    assert [p.name for p in lock.pins] == ["filelock", "numpy", "torch"]  # sorted: a stable text
    assert lock.text.splitlines()[2] == f"filelock==4.3.1 --hash=sha256:{SHA}"
    assert lock_for("torch", "cpu", "2.2.2", resolver=resolver).text == lock.text
    assert len(calls) == 1, "a locked release is not resolved again"
    # the id is the release's request (a recipe, as an image's), known without the index
    spec = venvs.env_spec("torch", "cpu@2.2.2")
    assert spec.env_id.startswith("torch-cpu-2.2.2-") and spec.requirements == (
        "torch==2.2.2\nnumpy\nthreadpoolctl==3.8.0\nnumpy<2\n") and spec.lock == ""
    assert spec.env_id != venvs.env_spec("torch", "cpu").env_id != venvs.env_spec("torch", "cpu@2.4.1").env_id
    # --relock: resolved again; the environment is rebuilt from the new lock (same id)
    relocked = lock_for("torch", "cpu", "2.2.2", relock=True,
                        resolver=lambda r: report(("torch", "2.4.1"), ("numpy", "1.26.3")))
    assert len(calls) == 1 and relocked.pinned("numpy") == "1.26.3"
    assert venvs.env_spec("torch", "cpu@2.2.2").env_id == spec.env_id


def test_a_damaged_lock_is_resolved_again(home):
    lock = lock_for("torch", "cpu", "2.4.1", resolver=lambda r: report(("torch", "2.4.1")))
    lock.path.write_text('{"format": 1, "pins": [{"name": "torch"', encoding="utf-8")
    again = lock_for("torch", "cpu", "2.4.1", resolver=lambda r: report(("torch", "2.4.1"), ("numpy", "2.4.6")))
    assert again.pinned("numpy") == "2.4.6"


def test_a_resolution_without_hashes_or_without_the_framework_is_refused(home):
    no_hash = {"install": [{"metadata": {"name": "torch", "version": "2.4.1"}, "download_info": {"dir_info": {}}}]}
    with pytest.raises(InputError, match="no SHA-256"):
        lock_for("torch", "cpu", "2.4.1", resolver=lambda r: no_hash)
    with pytest.raises(InputError, match="holds no torch"):
        lock_for("torch", "cpu", "2.4.1", resolver=lambda r: report(("numpy", "2.4.6")))
    assert not list((home / "locks").glob("*.json")), "no lock is kept from a refused resolution"


def test_pip_names_a_release_the_index_does_not_offer_with_the_nearest_ones(home):
    """Real pip against the package index: no torch 2.4.7 exists."""
    with pytest.raises(InputError) as err:
        lock_for("torch", "cpu", "2.4.7")
    text = str(err.value)
    assert 'version "2.4.7" of torch: the package index offers no torch 2.4.7 for Python' in text
    assert "nearest: 2.4.0, 2.4.1, 2.5.0" in text


def test_requirements_that_conflict_are_refused_with_pips_reason():
    """Real pip: two pins of one project that cannot both hold."""
    with pytest.raises(InputError) as err:
        pip_report(["typing_extensions==4.16.0", "typing_extensions<4"])
    assert "conflict" in str(err.value) and "typing_extensions<4" in str(err.value)


def test_pips_failure_text_is_read_into_one_sentence():
    text = ("ERROR: Cannot install torch==2.15.0 because these package versions have conflicting dependencies.\n\n"
            "The conflict is caused by:\n    The user requested torch==2.15.0\n"
            "    The user requested (constraint) torch<=2.14.1\n\nTo fix this you could try to:\n")
    assert pip_failure(text, ["torch==2.15.0"]) == ("the requirements torch==2.15.0 conflict: The user requested "
                                                   "torch==2.15.0; The user requested (constraint) torch<=2.14.1")
    assert "could not resolve x" in pip_failure("ERROR: no network\n", ["x"])


def test_matrun_plan_refuses_a_release_the_index_does_not_have(tmp_path, home):
    path = write(tmp_path, '[fixed]\nthreads = 1\n[axes]\nversion = ["2.4.7", ""]\n')
    proc = subprocess.run([*MATRUN, "plan", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Error:" in proc.stderr and 'version "2.4.7"' in proc.stderr and "nearest" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the environment -----------------------------------------------------------------------------


def test_a_build_that_fails_half_way_leaves_nothing_used_and_keeps_its_reason(home):
    """Real pip, a lock whose hash is wrong: pip refuses the file; the environment is removed,
    the reason kept beside it, and the next attempt builds from scratch."""
    lock_for("jax", "cpu", "0.4.30", resolver=lambda r: report(("jax", "0.4.30"), sha="0" * 64))
    with pytest.raises(EnvironmentBuildError) as err:
        venvs.ensure_env("jax", "cpu@0.4.30")
    spec = venvs.env_spec("jax", "cpu@0.4.30")
    assert "could not install the pinned requirements" in str(err.value)
    assert not (home / "envs" / spec.env_id).exists(), "nothing half-built is left to be used"
    reason = (home / "envs" / f"{spec.env_id}.failed").read_text(encoding="utf-8")
    assert "HASH" in reason.upper()


def test_a_release_image_is_built_from_the_lock_by_the_variants_own_dockerfile(tmp_path, home):
    """The image recipe of a release: the variant's Dockerfile, the release's request in the
    recipe hash (the docker env id, known without the index), the lock in the context under
    the variant's requirements name, a tag without '@', the release as a label and promise."""
    lock = lock_for("jax", "cpu", "0.4.30", resolver=lambda r: report(("jax", "0.4.30"), ("jaxlib", "0.4.30")))
    docker = DockerExecutor()
    assert docker.env_id("jax", "cpu@0.4.30").startswith("jax-cpu-0.4.30-")
    assert docker.env_id("jax", "cpu@0.4.30") != docker.env_id("jax", "cpu@0.5.3") != docker.env_id("jax", "cpu")
    assert recipe_hash("jax", "cpu@0.4.30") != recipe_hash("jax", "cpu")
    ctx = prepare_context("jax", "cpu@0.4.30", dest=tmp_path / "ctx", base_image="matrun-base:bookworm",
                          base_image_id="sha256:" + "1" * 64)
    assert (tmp_path / "ctx" / "requirements-cpu.txt").read_text() == lock.text
    assert ctx.pins == {"jax": "0.4.30", "jaxlib": "0.4.30"} and ctx.tag.startswith("matrun/jax:cpu-0.4.30-")
    labels = ctx.labels()
    assert labels["org.matrun.variant"] == "cpu" and labels["org.matrun.release"] == "0.4.30"
    assert labels["org.matrun.lock"] == lock.text
    assert variant_promises("jax", "cpu@0.4.30")[True]["framework_version"] == "0.4.30"
    assert variant_promises("jax", "cpu")[True]["framework_version"] == "0.10.2"
    m = load_matrix(write(tmp_path, '[fixed]\nframework = "jax"\n[axes]\nversion = ["0.4.30", ""]\n'))
    assert images_needed(m.cells) == [("jax", "cpu@0.4.30"), ("jax", "cpu")]
    assert docker.refusal(m.cells[0].values) is None


def test_every_run_of_a_release_environment_records_its_lock(home):
    marker = home / "envs" / "torch-cpu-2.4.1-abc" / ".matrun-env.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"release": "2.4.1", "framework_version": "2.4.1+cu121",
                                  "lock": f"torch==2.4.1 --hash=sha256:{SHA}\n"}), encoding="utf-8")
    assert _release_record("torch-cpu-2.4.1-abc") == {"release": {
        "version": "2.4.1", "framework_version": "2.4.1+cu121", "lock": f"torch==2.4.1 --hash=sha256:{SHA}\n"}}
    assert _release_record("torch-cpu-58e8c84218f2") == {}


def test_a_run_in_a_release_image_records_the_images_lock(tmp_path):
    ref = ImageRef("matrun/jax:cpu-0.4.30-4f8ea79eeca2", "sha256:" + "2" * 64, (), "c" * 64, (),
                   release="0.4.30", lock=f"jax==0.4.30 --hash=sha256:{SHA}\n")
    outcome = RunOutcome("ok", 0, "", "2026-11-29T00:00:00+00:00", "2026-11-29T00:00:05+00:00", 5.0,
                         image=ref.as_record())
    write_result(RunKey("s", "c" * 16, 0, 1), tmp_path, "jax-cpu-0.4.30-4cf717067c95", "docker", None, outcome)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["release"] == {"version": "0.4.30", "lock": f"jax==0.4.30 --hash=sha256:{SHA}\n"}
    assert result["image"]["tag"] == ref.tag and "release" not in result["image"]


def test_the_local_executor_plans_a_release_cell_in_its_own_environment(tmp_path, home, monkeypatch):
    def no_index(requested):
        raise AssertionError("planning asked the package index")

    monkeypatch.setattr(releases, "pip_report", no_index)
    m = load_matrix(write(tmp_path, '[fixed]\nthreads = 1\n[axes]\nversion = ["2.4.1", ""]\n'))
    planned = plan_cells(m, LocalExecutor().env_id)
    assert planned[0].env_id.startswith("torch-cpu-2.4.1-") and planned[1].env_id.startswith("torch-cpu-")
    assert planned[0].cell_id != planned[1].cell_id
    assert not (home / "locks").exists()


def test_an_environment_built_from_another_lock_is_built_again(home, monkeypatch):
    """A marker whose lock is not the release's lock now (``--relock``) is not used."""
    lock = lock_for("jax", "cpu", "0.4.30", resolver=lambda r: report(("jax", "0.4.30")))
    spec = venvs.env_spec("jax", "cpu@0.4.30")
    env = venvs.Env(venvs.replace(spec, lock=lock.text), home / "envs" / spec.env_id)
    env.path.mkdir(parents=True)
    (env.path / venvs.MARKER).write_text(json.dumps({"lock": lock.text}), encoding="utf-8")
    assert venvs._usable(env)
    (env.path / venvs.MARKER).write_text(json.dumps({"lock": "jax==0.4.29 --hash=sha256:" + SHA}), encoding="utf-8")
    assert not venvs._usable(env)
    built = []
    monkeypatch.setattr(venvs, "_build", lambda e, log: built.append(e.spec.lock))
    venvs.ensure_env("jax", "cpu@0.4.30")
    assert built == [lock.text]
