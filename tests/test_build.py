"""Framework images: build contexts and their hashes, the engine address rule, and a real
build of the PyTorch CPU image on a real Docker engine, probed inside the image.

The engine tests need a running local engine (`.ci/run` starts one: DESIGN.md, Debian
docker.io, ``dockerd --bridge=none --iptables=false``); without one they skip with the reason.
The base image is ``matrun-base:bookworm`` (made with debootstrap when missing), the torch
CPU wheel comes from the wheelhouse ``$MATRUN_TEST_WHEELHOUSE`` or ``$PIP_FIND_LINKS``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from matrun.errors import InputError
from matrun.runner.environments import builds, contexts, engine, probes
from matrun.frameworks import frameworks

REPO_IMAGES = Path(__file__).resolve().parents[1] / "images"
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


# --- no engine needed ------------------------------------------------------------------

@pytest.mark.parametrize("url", ["unix:///var/run/docker.sock", "tcp://127.0.0.1:2375",
                                 "tcp://localhost:2375"])
def test_local_engine_addresses_are_allowed(url: str) -> None:
    assert engine.engine_url(url) == url


@pytest.mark.parametrize("url", ["tcp://10.1.2.3:2375", "tcp://172.17.0.1:2375",
                                 "tcp://192.168.1.5:2376", "ssh://build@host"])
def test_engine_addresses_off_this_host_are_refused(url: str) -> None:
    with pytest.raises(InputError) as err:
        engine.engine_url(url)
    assert str(err.value) == (
        f"Docker engine address {url!r} is not local; matrun only talks to a unix socket or "
        "tcp://127.0.0.1 (unset DOCKER_HOST to use /var/run/docker.sock)")


def test_images_needed_lists_each_variant_once_in_order() -> None:
    cells = [{"framework": "torch", "variant": "cpu"}, {"framework": "mxnet", "variant": "cpu"},
             {"framework": "torch", "variant": "cpu"}]
    assert contexts.images_needed(cells) == [("torch", "cpu"), ("mxnet", "cpu")]


def _images_copy(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    shutil.copytree(REPO_IMAGES / "torch", images / "torch")
    return images


def _context(tmp_path: Path, name: str, images: Path, **kwargs) -> contexts.BuildContext:
    return contexts.prepare_context("torch", "cpu", dest=tmp_path / name, base_image="base:x",
                                 base_image_id="sha256:1", images_dir=images, **kwargs)


def test_context_hash_covers_pins_wheels_and_base_but_not_the_ca_bundle(tmp_path: Path) -> None:
    images = _images_copy(tmp_path)
    house = tmp_path / "house"
    house.mkdir()
    (house / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"torch")
    (house / "torch-2.12.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"old torch")
    (house / "unrelated-1.0-py3-none-any.whl").write_bytes(b"x")
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")

    first = _context(tmp_path, "a", images, wheelhouse=house)
    assert first.wheels == ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",)
    assert sorted(p.name for p in (first.path / "wheels").iterdir()) == list(first.wheels)
    assert (first.path / "ca-bundle.crt").read_bytes() == b""
    with_ca = _context(tmp_path, "b", images, wheelhouse=house, ca_bundle=ca)
    assert (with_ca.path / "ca-bundle.crt").read_text() == ca.read_text()
    assert with_ca.content_hash == first.content_hash
    assert first.tag == f"matrun/torch:cpu-{first.content_hash[:12]}"
    labels = first.labels()
    assert labels["org.matrun.pin.torch"] == "2.13.0"
    assert labels["org.matrun.pin.typing-extensions"] == "4.16.0"
    assert labels["org.matrun.content-hash"] == first.content_hash

    assert _context(tmp_path, "c", images).content_hash != first.content_hash  # no wheel
    other_base = contexts.prepare_context("torch", "cpu", dest=tmp_path / "d", base_image="base:x",
                                       base_image_id="sha256:2", images_dir=images, wheelhouse=house)
    assert other_base.content_hash != first.content_hash
    req = images / "torch" / "requirements-cpu.txt"
    req.write_text(req.read_text().replace("sympy==1.14.0", "sympy==1.13.0"))
    assert _context(tmp_path, "e", images, wheelhouse=house).content_hash != first.content_hash


def test_a_gpu_variant_never_takes_a_cpu_wheel_from_the_wheelhouse(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    for name in ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "torch-2.13.0-cp312-cp312-linux_x86_64.whl"):
        (house / name).write_bytes(b"w")
    pins = {"torch": "2.13.0"}
    assert [w.name for w in contexts.select_wheels(house, pins)] == [
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "torch-2.13.0-cp312-cp312-linux_x86_64.whl"]
    assert [w.name for w in contexts.select_wheels(house, pins, device="gpu")] == [
        "torch-2.13.0-cp312-cp312-linux_x86_64.whl"]
    assert [w.name for w in contexts.select_wheels(house, {"torch": "2.13.0+cpu"}, device="gpu")] == [
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "torch-2.13.0-cp312-cp312-linux_x86_64.whl"]


def test_an_unknown_variant_is_refused_with_the_known_ones() -> None:
    with pytest.raises(InputError) as err:
        contexts.image_sources("torch", "rocm")
    known = ", ".join(frameworks()["torch"].variants)
    assert str(err.value) == (f"framework torch has no variant 'rocm'; known: {known} "
                              "(images/torch/framework.toml)")


def test_a_declared_variant_without_its_dockerfile_is_refused(tmp_path: Path) -> None:
    images = _images_copy(tmp_path)
    (images / "torch" / "Dockerfile.cpu").unlink()
    with pytest.raises(InputError) as err:
        contexts.image_sources("torch", "cpu", images)
    assert str(err.value) == "no image for torch:cpu: images/torch/Dockerfile.cpu does not exist"


def test_recipe_hash_follows_dockerfile_pins_and_build_args_but_not_the_base(tmp_path: Path) -> None:
    images = _images_copy(tmp_path)
    first = contexts.recipe_hash("torch", "cpu", images)
    assert first == contexts.recipe_hash("torch", "cpu", images)
    assert _context(tmp_path, "a", images).recipe_hash == first
    assert contexts.prepare_context("torch", "cpu", dest=tmp_path / "b", base_image="other:y",
                                 base_image_id="sha256:9", images_dir=images).recipe_hash == first
    toml = images / "torch" / "framework.toml"
    toml.write_text(toml.read_text().replace('dockerfile = "Dockerfile.cpu"',
                                             'dockerfile = "Dockerfile.cpu"\nbuild_args = { X = "1" }'))
    with_arg = contexts.recipe_hash("torch", "cpu", images)
    assert with_arg != first
    dockerfile = images / "torch" / "Dockerfile.cpu"
    dockerfile.write_text(dockerfile.read_text() + "\n# a comment is a change\n")
    assert contexts.recipe_hash("torch", "cpu", images) not in (first, with_arg)
    labels = _context(tmp_path, "c", images).labels()
    assert labels["org.matrun.build-arg.X"] == "1"
    assert labels["org.matrun.recipe-hash"] == contexts.recipe_hash("torch", "cpu", images)


@pytest.mark.parametrize("text, message", [
    ('[variants.cpu]\npromises = { gpu = "a100" }\n',
     "images/torch/framework.toml [variants.cpu]: promises names gpu, which the probe does not report "
     "(it reports framework_version, python, cuda, cudnn, blas, onednn, openmp)"),
    ('[variants.cpu]\nbuild_args = { BLAS = 3 }\n',
     "images/torch/framework.toml [variants.cpu]: build_args must map names to strings"),
    ('[variants.cpu]\ndockerflie = "Dockerfile.cpu"\n',
     "images/torch/framework.toml [variants.cpu]: unknown key(s) dockerflie"),
])
def test_malformed_variant_descriptions_are_refused(tmp_path: Path, text: str, message: str) -> None:
    images = _images_copy(tmp_path)
    toml = images / "torch" / "framework.toml"
    head = toml.read_text().split("[variants.", 1)[0]
    toml.write_text(head + text)
    with pytest.raises(InputError) as err:
        contexts.image_sources("torch", "cpu", images)
    assert str(err.value) == message


def test_the_default_base_image_is_the_dockerfiles_pinned_one() -> None:
    assert contexts.default_base_image("torch", "cpu") == "debian:bookworm-20240926-slim"


def test_probe_summary_takes_torch_blas_from_its_build_not_numpy() -> None:
    fields = {"framework": "torch", "framework_version": "2.13.0+cpu", "python": "3.11.2",
              "build": "  - BLAS_INFO=mkl\n  - Intel(R) MKL-DNN v3.12.0 (Git Hash …)",
              "in_force": {"onednn_available": True},
              "libraries": [{"name": "libgomp.so.1", "user_api": "openmp", "internal_api": "openmp"},
                            {"name": "libscipy_openblas64_-32a4b2a6.so", "user_api": "blas",
                             "internal_api": "openblas", "version": "0.3.31",
                             "path": "/opt/venv/lib/python3.11/site-packages/numpy.libs/x.so"}]}
    found = probes.summarise_probe(fields)
    assert (found.blas, found.onednn, found.openmp, found.cuda) == ("mkl", "3.12.0", "libgomp.so.1", None)


def test_a_private_engine_starts_answers_and_stops_by_its_pid(tmp_path: Path) -> None:
    pytest.importorskip("docker", reason="the Docker SDK is not installed (pip install docker)")
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("starting dockerd needs root and Debian's docker.io")
    # Short paths: containerd's sockets live under --exec-root and a unix socket path is
    # limited to 107 bytes (pytest's tmp_path is too long for that).
    state = Path(tempfile.mkdtemp(prefix="mte-", dir="/tmp"))
    socket = state / "d.sock"
    try:
        started = engine.start_engine(state_dir=state, socket=str(socket), private=True)
        try:
            assert started.pid_file.read_text() == f"{started.pid}\n"
            client = engine.connect(f"unix://{socket}")
            assert client.info()["DockerRootDir"] == str(state / "data")
        finally:
            assert engine.stop_engine(started.pid_file)
        assert not Path(f"/proc/{started.pid}").exists()
        assert engine.find_engine(f"unix://{socket}") is None
        assert not engine.stop_engine(started.pid_file)  # the pid file is gone: nothing to stop
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_broken_promises_name_what_the_probe_did_not_find() -> None:
    found = probes.ImageProbe("mxnet", "1.9.1", "3.11.2", None, None, "openblas 0.3.13", "present",
                             "libgomp.so.1")
    assert probes.broken_promises(found, {"blas": "OpenBLAS", "onednn": "any", "cuda": "none"}) == []
    assert probes.broken_promises(found, {"blas": "mkl", "cuda": "11.7", "gpu": "a100"}) == [
        "blas: promised mkl, the probe found openblas 0.3.13",
        "cuda: promised 11.7, the probe found none",
        "gpu: not something the probe reports"]


def test_a_private_engine_with_too_long_socket_paths_is_refused_before_it_starts(tmp_path: Path) -> None:
    state = tmp_path / ("x" * 80)
    with pytest.raises(InputError) as err:
        engine.start_engine(state_dir=state, socket="/tmp/short.sock", private=True)
    assert str(err.value) == (
        f"socket path {state.resolve()}/exec/containerd/containerd.sock.ttrpc is longer than 107 "
        "bytes; use a shorter state directory")
    assert not state.exists()


# --- a real engine ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def client():
    pytest.importorskip("docker", reason="the Docker SDK is not installed (pip install docker)")
    try:
        return engine.connect()
    except Exception as exc:  # EngineUnavailable, or InputError for a non-local DOCKER_HOST
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def base_image(client) -> str:
    engine.ensure_base_image(client)
    return engine.BASE_IMAGE


def _wheelhouse() -> Path:
    for candidate in (os.environ.get("MATRUN_TEST_WHEELHOUSE"), os.environ.get("PIP_FIND_LINKS")):
        if candidate and (Path(candidate) / TORCH_WHEEL).is_file():
            return Path(candidate)
    pytest.skip(f"no wheelhouse with {TORCH_WHEEL} (set MATRUN_TEST_WHEELHOUSE)")


def test_real_torch_cpu_image_is_built_labelled_and_probed(client, base_image: str) -> None:
    events: list[builds.BuildEvent] = []
    built, = builds.build_images([("torch", "cpu")], client=client, base_image=base_image,
                                wheelhouse=_wheelhouse(),
                                ca_bundle=CA_BUNDLE if CA_BUNDLE.is_file() else None,
                                progress=events.append)
    kinds = {event.kind for event in events}
    assert {"context", "probe"} <= kinds and ("built" in kinds or "cached" in kinds)
    probe = built.probe
    assert probe is not None
    assert (probe.framework, probe.framework_version, probe.blas) == ("torch", "2.13.0+cpu", "mkl")
    assert probe.python.startswith("3.11.")
    assert probe.onednn and probe.onednn[0].isdigit()
    assert (probe.cuda, probe.cudnn) == (None, None)

    image = client.images.get(built.tag)
    assert image.labels["org.matrun.pin.torch"] == "2.13.0"
    assert image.labels["org.matrun.content-hash"] == built.content_hash
    assert image.labels["org.matrun.wheels"] == TORCH_WHEEL
    # The wheelhouse stayed in the build stage and apt's lists and packages left no layer:
    # no wheel, no list, no .deb anywhere in the image.
    out = client.containers.run(
        built.tag, ["sh", "-c", "find / -xdev \\( -name '*.whl' -o -name '*.deb' \\) | wc -l; "
                                "ls /var/lib/apt/lists | wc -l"],
        network_mode="none", remove=True)
    assert out.decode().split() == ["0", "0"]

    again, = builds.build_images([("torch", "cpu")], client=client, base_image=base_image,
                                wheelhouse=_wheelhouse(), probe=False)
    assert (again.tag, again.image_id, again.build_seconds) == (built.tag, built.image_id, None)

    # A variant whose probe does not show the promised library fails its build check.
    with pytest.raises(builds.ImageBuildError) as err:
        builds.build_images([("torch", "cpu")], client=client, base_image=base_image,
                           wheelhouse=_wheelhouse(), promises={("torch", "cpu"): {"blas": "openblas"}})
    assert str(err.value) == (f"image {built.tag} (torch:cpu) does not hold what the variant promises "
                              "(probe with oneDNN on): blas: promised openblas, the probe found mkl")


def test_a_failing_build_names_the_step_and_shows_its_log(client, base_image: str, tmp_path: Path) -> None:
    images = tmp_path / "images"
    (images / "broken").mkdir(parents=True)
    (images / "broken" / "requirements-cpu.txt").write_text("")
    (images / "broken" / "Dockerfile.cpu").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo about-to-fail && exit 3\n")
    with pytest.raises(builds.ImageBuildError) as err:
        builds.build_images([("broken", "cpu")], client=client, base_image=base_image,
                           images_dir=images, probe=False)
    # The legacy builder appends the labels as steps: six here (no pins, no wheels).
    assert err.value.step == "Step 3/9 : RUN echo about-to-fail && exit 3"
    assert "about-to-fail" in err.value.log_tail
    assert str(err.value).startswith(
        "building broken:cpu failed at Step 3/9 : RUN echo about-to-fail && exit 3: "
        "The command '/bin/sh -c echo about-to-fail && exit 3' returned a non-zero code: 3")
