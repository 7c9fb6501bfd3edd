"""Shared fixtures: the real PyTorch environment and real data locations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

# The suite's two workers keep every run's CPUs busy, so every run starts busy: a study's
# default re-runs of busy runs ([sweep] rerun_busy, docs/MATRIX.md "Busy runs") would triple its
# sweeps and change their counts.  Off for the matrun processes the tests start, unless a test
# says otherwise (tests/test_busy_reruns.py checks the default without it).
os.environ.setdefault("MATRUN_RERUN_BUSY", "false")


# --- how the suite is split (`make test`: docs/ARCHITECTURE.md "Tests") ----------------------
# `make test` runs the suite in two steps (TEST_WORKERS=1: one process):
#   1. `pytest -n 2 --dist loadfile -m "not serial"`: every file but the serial ones, on two
#      pytest-xdist workers, each file one unit of work (its module fixtures made once), the
#      longest first (FILE_SECONDS).  The heavy files (marked `heavy`: any of their tests runs a
#      framework, a container or the Slurm cluster) and the light ones share the workers: most
#      heavy tests are one single-threaded cell or a wait on the engine or Slurm (the heavy
#      files alone kept 1.14 of the 2 cores busy).
#   2. `pytest -m serial`: the files that measure the machine's own load, alone.
# A file is heavy when one of its tests is marked slow or uses one of HEAVY_FIXTURES (checked
# at collection, so a new test of the kind marks its file heavy by itself);
# `pytest -m "not heavy"` is the quick run without a framework, an engine or Slurm.

#: Files whose tests measure this machine's load: they run last, alone.
SERIAL_FILES = {"test_machine_state.py", "test_doctor.py"}
#: Fixtures of real frameworks, containers and the Slurm cluster: a file using one is heavy.
HEAVY_FIXTURES = {"torch_python", "torch_env", "tf_env", "mxnet_env", "jax_env", "theano_env", "chainer_env",
                  "stage", "fashion_mnist_root", "docker_client", "cpu_images", "torch_image", "slurm_cluster"}
#: Heavy though none of their tests says so: they build images or run real cells through the CLI.
HEAVY_FILES = {"test_build.py", "test_cli_hardening.py", "test_studies_e2e.py", "test_sweep.py", "test_sweep_faults.py",
               "test_canary.py", "test_workers.py", "test_system_python.py", "test_local_executor.py"}
#: Session resources one worker holds: every test using the fixture must be in the one file.
ONE_FILE_RESOURCES = {"slurm_cluster": "test_slurm.py"}
#: The order the workers take the files in, longest first, so that no long file starts last and
#: keeps one worker busy alone at the end: each file's seconds, the heavy ones as profiled alone
#: (benchmarks/suite_profile.py), the light ones as estimated from their --durations (why this
#: order and not another: docs/ARCHITECTURE.md "Tests").  A file not named here counts as
#: SHORT_FILE seconds.
FILE_SECONDS = {
    # heavy files (real frameworks, containers, Slurm)
    "test_slurm.py": 260, "test_sweep.py": 228, "test_studies_e2e.py": 214, "test_jax.py": 190,
    "test_sweep_faults.py": 189, "test_knobs.py": 180, "test_theano.py": 128, "test_tensorflow.py": 114,
    "test_docker_sweep.py": 99, "test_docker_faults.py": 97, "test_cli_hardening.py": 88, "test_harness.py": 83,
    "test_hostile_inputs.py": 71, "test_chainer.py": 69, "test_canary.py": 69, "test_mxnet.py": 44,
    "test_system_python.py": 40, "test_docker_orphans.py": 30, "test_docker_executor.py": 27,
    "test_transformers_torch.py": 60, "test_transformers_jax.py": 42, "test_transformers_tf.py": 60,
    "test_transformers_mxnet.py": 45,
    "test_tune.py": 75, "test_local_executor.py": 17, "test_build.py": 10, "test_probe_blas.py": 10,
    # light files
    "test_warehouse_readers.py": 130, "test_materialise.py": 120, "test_ingest.py": 110, "test_export.py": 100,
    "test_report.py": 95, "test_study_views.py": 90, "test_cli_output.py": 85, "test_findings.py": 80,
    "test_report_studies.py": 75, "test_warehouse_portable.py": 70, "test_warehouse_hosts.py": 65,
    "test_compare_advise.py": 60, "test_views.py": 55, "test_warehouse.py": 50, "test_warehouse_faults.py": 45,
    "test_report_browser.py": 40, "test_iteration_model.py": 35, "test_lake_template.py": 30,
}
SHORT_FILE = 10


def heavy_files(items: list[pytest.Item]) -> set[str]:
    """The files of ``items`` that are heavy (marked ``heavy``)."""
    heavy = set(HEAVY_FILES)
    for item in items:
        if item.get_closest_marker("slow") is not None or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            heavy.add(item.path.name)
    return heavy


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for fixture, home in ONE_FILE_RESOURCES.items():
        elsewhere = sorted({item.nodeid for item in items
                            if fixture in getattr(item, "fixturenames", ()) and item.path.name != home})
        if elsewhere:
            raise pytest.UsageError(f"tests using {fixture} belong in tests/{home} (one worker, one "
                                    f"{fixture} for the run: tests/conftest.py): {', '.join(elsewhere)}")
    heavy = heavy_files(items)
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        if item.path.name in heavy:
            item.add_marker(pytest.mark.heavy)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the files in their own order
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-FILE_SECONDS.get(item.path.name, SHORT_FILE), order[id(item)]))


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """Python of the real PyTorch environment (built from images/torch pins if needed).

    MATRUN_TEST_TORCH_PYTHON points at an existing interpreter instead (development only).
    """
    override = os.environ.get("MATRUN_TEST_TORCH_PYTHON")
    if override:
        return Path(override)
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("torch", "cpu").python


@pytest.fixture(scope="session")
def fashion_mnist_root() -> Path:
    """The data directory that holds fashion-mnist/ (Debian's dataset-fashion-mnist)."""
    if not (FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Debian's dataset-fashion-mnist is not installed (make test installs it)")
    return FASHION_MNIST.parent


@pytest.fixture(scope="session")
def torch_env():
    """The real PyTorch environment the local executor uses (built once, then reused)."""
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("torch", "cpu")


@pytest.fixture(scope="session")
def stage() -> Path:
    """The staged harness, exactly as the host puts it on a cell's PYTHONPATH."""
    from matrun.runner.environments.home import stage_harness

    return stage_harness()


@pytest.fixture(scope="session")
def tf_env():
    """The real TensorFlow environment the local executor uses (built once, then reused)."""
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("tensorflow", "cpu")


@pytest.fixture(scope="session")
def mxnet_env():
    """The real MXNet environment the local executor uses (built once, then reused)."""
    from matrun.runner.environments.venvs import ensure_env

    return ensure_env("mxnet", "cpu")


# --- a real Docker engine and the framework images ------------------------------------------
# `make test` starts the engine (Debian's docker.io, `matrun engine start`); where none can be
# had these tests skip with the reason, except where MATRUN_REQUIRE_ENGINE=1 (CI: .ci/run),
# where a missing engine or image is a failure, never a skip.

REQUIRE_ENGINE = os.environ.get("MATRUN_REQUIRE_ENGINE") == "1"


def missing(reason: str, *, required: bool, variable: str):
    """Skip with the reason, or fail where the variable (CI) says the thing must be there."""
    if required:
        pytest.fail(f"{variable}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def engine_missing(reason: str):
    missing(reason, required=REQUIRE_ENGINE, variable="MATRUN_REQUIRE_ENGINE")


@pytest.fixture(scope="session")
def docker_client():
    """A client of the local Docker engine, with the timeout of one that builds (the fixtures
    build images with it, beside the other worker's tests)."""
    try:
        from matrun.runner.environments.engine import BUILD_TIMEOUT, connect

        return connect(timeout=BUILD_TIMEOUT)
    except Exception as exc:  # EngineUnavailable; InputError for a DOCKER_HOST matrun refuses
        engine_missing(f"no Docker engine: {exc}")


def _wheelhouse() -> Path | None:
    for item in (os.environ.get("MATRUN_TEST_WHEELHOUSE") or os.environ.get("PIP_FIND_LINKS") or "").split():
        if Path(item).is_dir():
            return Path(item)
    return None


def _ca_bundle() -> Path | None:
    value = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    return Path(value) if Path(value).is_file() else None


_BUILT: dict[tuple[str, str], object] = {}


def built_image(client, framework: str, variant: str):
    """The image of a framework variant, built (through matrun's own build path, with the probe
    and the variant's promise check) on the debootstrapped base when missing; once a session."""
    key = (framework, variant)
    if key not in _BUILT:
        from matrun.runner.environments import builds, engine

        try:
            engine.ensure_base_image(client)
            (_BUILT[key],) = builds.build_images([key], client=client, base_image=engine.BASE_IMAGE,
                                                wheelhouse=_wheelhouse(), ca_bundle=_ca_bundle())
        except Exception as exc:
            if REQUIRE_ENGINE:
                raise
            pytest.skip(f"could not build the {framework}:{variant} image here: {exc}")
    return _BUILT[key]


@pytest.fixture(scope="session")
def cpu_images(docker_client):
    """The four frameworks' CPU images (built when missing)."""
    return {fw: built_image(docker_client, fw, "cpu") for fw in ("torch", "tensorflow", "mxnet", "jax")}


# --- a real one-node Slurm cluster -------------------------------------------------------------
# Debian's slurmctld / slurmd / slurm-client / munge (`make test` installs them).  The session
# starts a cluster of its own (runner/slurm/cluster.py: private munged, slurmctld -D, slurmd -D, free
# ports, two fake GPUs) and stops it by its recorded PIDs at the end (.ci/run stops it again
# from $MATRUN_SLURM_STATE in case pytest itself was killed).  Without Slurm the tests
# skip with the reason, except where MATRUN_REQUIRE_SLURM=1 (CI: .ci/run): then they fail.

REQUIRE_SLURM = os.environ.get("MATRUN_REQUIRE_SLURM") == "1"


def slurm_missing(reason: str):
    missing(reason, required=REQUIRE_SLURM, variable="MATRUN_REQUIRE_SLURM")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The Slurm test cluster (node0 on 127.0.0.1 with 2 fake GPUs; partition multi: n1, n2 of one CPU
    each on the same host); its ``env`` names its slurm.conf."""
    import shutil
    import tempfile

    from matrun.runner.slurm import cluster as slurm

    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "squeue") if shutil.which(c) is None]
    if missing:
        slurm_missing(f"Slurm is not installed ({', '.join(missing)} missing; Debian: apt-get install "
                      "slurmctld slurmd slurm-client munge, as `make slurm` does)")
    if os.geteuid() != 0:
        slurm_missing("the Slurm test cluster needs root (munged, slurmd)")
    # $MATRUN_SLURM_STATE (CI: stopped there again at the end, whatever happens to pytest), else
    # a new directory under /tmp, not pytest's tmp_path: munged wants every directory above its
    # socket searchable.
    explicit = os.environ.get("MATRUN_SLURM_STATE")
    state = Path(explicit) if explicit else Path(tempfile.mkdtemp(prefix="matrun-slurm-", dir="/tmp"))
    if explicit:  # a cluster a killed session left there: stopped by its PIDs, its old jobs forgotten
        slurm.stop_cluster(state)
        shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True, exist_ok=True)
    try:
        cluster = slurm.start_cluster(state, kill_wait=5)
    except Exception as exc:
        slurm.stop_cluster(state)
        shutil.rmtree(state, ignore_errors=True)
        slurm_missing(f"could not start a Slurm test cluster: {exc}")
    try:
        yield cluster
    finally:
        slurm.stop_cluster(state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def torch_image(docker_client):
    """The torch:cpu image the Slurm tasks' docker executor runs cells in (built when missing)."""
    return built_image(docker_client, "torch", "cpu")
