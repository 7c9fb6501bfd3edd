"""Image recipes (every ``images/<framework>/Dockerfile.*`` and ``requirements-*.txt``), checked
without an engine: the GPU images cannot be built nor run on a machine with no GPU and no
registry, so what can be checked is checked here, on the files the installed package ships
(``matrun.images``).

- every Dockerfile builds every stage on ``ARG BASE_IMAGE=<exact tag>`` (no ``latest``, no
  missing tag, no registry host: ``matrun build --base-image`` and a locally made base work);
- every requirements line is one exact ``name==version`` pin;
- a two-stage image copies nothing into its final stage but ``/opt/venv`` from ``build``;
- a GPU variant builds on an NVIDIA CUDA image whose CUDA matches the pinned CUDA wheels,
  and MXNet 1.9.1's on CUDA <= 11.7 with cuDNN 8.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

import pytest

from matrun.frameworks import frameworks

if TYPE_CHECKING:
    from importlib.abc import Traversable

IMAGES = resources.files("matrun.images")
NVIDIA_CUDA = re.compile(
    r"^nvidia/cuda:(?P<cuda>\d+\.\d+(?:\.\d+)?)-(?:cudnn(?P<cudnn>\d*)-)?(?P<flavour>base|runtime|devel)"
    r"-(?P<os>ubuntu\d\d\.\d\d|rockylinux\d+|ubi\d+)$")
PIN = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[0-9][A-Za-z0-9.+!_-]*)$")


def _files(prefix: str, suffix: str = "") -> list[tuple[str, Traversable]]:
    found = []
    for folder in sorted(IMAGES.iterdir(), key=lambda p: p.name):
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            if entry.is_file() and entry.name.startswith(prefix) and entry.name.endswith(suffix):
                found.append((f"{folder.name}/{entry.name}", entry))
    return found


DOCKERFILES = _files("Dockerfile.")
REQUIREMENTS = _files("requirements-", ".txt")


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):  # Docker drops comment lines, inside a RUN too
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "a continued line runs off the end of the Dockerfile"
    return out


def stages(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The Dockerfile's stages: (the FROM arguments, the instructions after it)."""
    found: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            found.append((args, []))
        elif found:
            found[-1][1].append((keyword, args))
    return found


def base_image_default(text: str) -> str:
    """The ``ARG BASE_IMAGE=`` default, declared before the first FROM."""
    for keyword, args in instructions(text):
        if keyword == "FROM":
            break
        if keyword == "ARG" and args.startswith("BASE_IMAGE="):
            return args.partition("=")[2]
    raise AssertionError("no `ARG BASE_IMAGE=<image>` before the first FROM")


def split_reference(ref: str) -> tuple[str, str, str]:
    """An image reference as (name, tag, digest); tag and digest may be empty."""
    name, _, digest = ref.partition("@")
    last = name.rfind(":")
    if last > name.rfind("/"):
        return name[:last], name[last + 1:], digest
    return name, "", digest


def pins(requirements: Traversable) -> dict[str, str]:
    found = {}
    for line in requirements.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match["name"]).lower()] = match["version"]
    return found


def gpu_variants() -> list[tuple[str, str]]:
    return [(fw.name, var.name) for fw in frameworks().values() for var in fw.variants.values()
            if var.device == "gpu"]


def variant_files(framework: str, variant: str) -> tuple[Traversable, Traversable | None]:
    var = frameworks()[framework].variant(variant)
    folder = IMAGES / framework
    return folder / var.dockerfile, (folder / var.requirements if var.requirements else None)


# --- the parser itself -----------------------------------------------------------------------

def test_the_dockerfile_reader_joins_continued_lines_and_drops_comments() -> None:
    text = ("# header\nARG BASE_IMAGE=a/b:1\nFROM ${BASE_IMAGE} AS build\nRUN one \\\n"
            "# inside\n && two\nFROM ${BASE_IMAGE}\nCOPY --from=build /opt/venv /opt/venv\n")
    assert instructions(text) == [("ARG", "BASE_IMAGE=a/b:1"), ("FROM", "${BASE_IMAGE} AS build"),
                                  ("RUN", "one  && two"), ("FROM", "${BASE_IMAGE}"),
                                  ("COPY", "--from=build /opt/venv /opt/venv")]
    assert [s[0] for s in stages(text)] == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    assert split_reference("nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04") == (
        "nvidia/cuda", "13.0.2-cudnn-runtime-ubuntu24.04", "")
    assert split_reference("localhost:5000/x") == ("localhost:5000/x", "", "")
    assert split_reference("x:1@sha256:ab") == ("x", "1", "sha256:ab")


def test_the_recipes_are_shipped_in_the_package() -> None:
    names = {name for name, _ in DOCKERFILES}
    assert {"torch/Dockerfile.cpu", "torch/Dockerfile.cuda", "tensorflow/Dockerfile.cpu",
            "tensorflow/Dockerfile.cuda", "mxnet/Dockerfile.cpu", "mxnet/Dockerfile.cu117"} <= names
    assert {"torch/requirements-cuda.txt", "tensorflow/requirements-cuda.txt",
            "mxnet/requirements-cu117.txt"} <= {name for name, _ in REQUIREMENTS}


# --- every Dockerfile ------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "dockerfile"), DOCKERFILES, ids=[n for n, _ in DOCKERFILES])
def test_the_base_image_is_an_exact_tag_with_no_registry_host(name: str, dockerfile: Traversable) -> None:
    ref = base_image_default(dockerfile.read_text(encoding="utf-8"))
    image, tag, digest = split_reference(ref)
    assert tag, f"{name}: BASE_IMAGE={ref} has no tag"
    assert tag != "latest" and not tag.startswith("latest-"), f"{name}: BASE_IMAGE={ref} is not pinned"
    assert "$" not in ref and " " not in ref, f"{name}: BASE_IMAGE={ref} is not a literal image"
    first, sep, _ = image.partition("/")
    assert not (sep and ("." in first or ":" in first or first == "localhost")), (
        f"{name}: BASE_IMAGE={ref} names a registry host ({first}); give it with --base-image instead")
    assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{name}: bad digest in {ref}"


@pytest.mark.parametrize(("name", "dockerfile"), DOCKERFILES, ids=[n for n, _ in DOCKERFILES])
def test_every_stage_builds_on_the_base_image_argument(name: str, dockerfile: Traversable) -> None:
    # So that `matrun build --base-image` (and the locally made base) replaces every stage's base.
    for from_args, _ in stages(dockerfile.read_text(encoding="utf-8")):
        assert from_args.split()[0] == "${BASE_IMAGE}", f"{name}: FROM {from_args}"


@pytest.mark.parametrize(("name", "dockerfile"), DOCKERFILES, ids=[n for n, _ in DOCKERFILES])
def test_the_final_stage_copies_only_the_venv_from_the_build_stage(name: str, dockerfile: Traversable) -> None:
    found = stages(dockerfile.read_text(encoding="utf-8"))
    final = found[-1][1]
    copies = [(k, a) for k, a in final if k in ("COPY", "ADD")]
    if len(found) == 1:
        # One stage: nothing from the context (wheelhouse, CA bundle) may land in a layer.
        assert copies == [], f"{name}: a single-stage image copies {copies}"
        return
    assert len(found) == 2, f"{name}: expected a build stage and a final stage"
    build_from, build = found[0]
    assert build_from.split()[1:] == ["AS", "build"], f"{name}: the first stage is not `AS build`"
    assert ("LABEL", "org.matrun.stage=build") in build, f"{name}: the build stage lacks its label"
    assert copies == [("COPY", "--from=build /opt/venv /opt/venv")], f"{name}: final stage copies {copies}"


@pytest.mark.parametrize(("name", "dockerfile"), DOCKERFILES, ids=[n for n, _ in DOCKERFILES])
def test_the_image_runs_as_uid_1000_and_keeps_no_apt_lists(name: str, dockerfile: Traversable) -> None:
    found = stages(dockerfile.read_text(encoding="utf-8"))
    final = found[-1][1]
    assert any(k == "RUN" and "useradd --create-home --uid 1000 matrun" in a for k, a in final), name
    assert ("WORKDIR", "/home/matrun") in final and ("CMD", '["python3"]') in final, name
    for _, body in found:
        for keyword, args in body:
            if keyword == "RUN" and "apt-get install" in args:
                assert "rm -rf /var/lib/apt/lists/*" in args, f"{name}: apt lists stay in a layer: {args}"
            if keyword == "RUN" and "pip install" in args:
                assert "PIP_NO_CACHE_DIR=1" in args, f"{name}: pip's cache stays in a layer"
                assert 'if [ -s /tmp/ctx/ca-bundle.crt ]; then export PIP_CERT=' in args, (
                    f"{name}: PIP_CERT must be set only when the context's CA bundle is not empty")


# --- every requirements file -----------------------------------------------------------------

@pytest.mark.parametrize(("name", "requirements"), REQUIREMENTS, ids=[n for n, _ in REQUIREMENTS])
def test_every_requirement_is_an_exact_pin(name: str, requirements: Traversable) -> None:
    seen: dict[str, int] = {}
    for number, raw in enumerate(requirements.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{name}:{number}: {line!r} is not an exact `name==version` pin"
        key = re.sub(r"[-_.]+", "-", match["name"]).lower()
        assert key not in seen, f"{name}:{number}: {match['name']} is pinned twice (line {seen.get(key)})"
        seen[key] = number
    assert seen, f"{name} pins nothing"


# --- GPU variants ----------------------------------------------------------------------------

def test_there_are_gpu_variants_for_the_four_frameworks() -> None:
    assert {fw for fw, _ in gpu_variants()} == {"torch", "tensorflow", "mxnet", "jax"}


#: The CUDA user space a GPU image needs when its base brings none: runtime, cuDNN and NCCL wheels.
CUDA_WHEELS = (r"nvidia-cuda-runtime(-cu\d+)?", r"nvidia-cudnn(-cu\d+)?", r"nvidia-nccl(-cu\d+)?")


@pytest.mark.parametrize(("framework", "variant"), gpu_variants())
def test_a_gpu_variant_builds_on_nvidia_cuda_matching_its_cuda_wheels(framework: str, variant: str) -> None:
    """On an NVIDIA CUDA base whose CUDA matches the wheels (or, lacking wheels, whose runtime
    and cuDNN the framework links); or, for a variant that needs no registry, on Debian with
    the whole CUDA user space (runtime, cuDNN, NCCL) pinned as wheels."""
    dockerfile, requirements = variant_files(framework, variant)
    ref = base_image_default(dockerfile.read_text(encoding="utf-8"))
    image, tag, _ = split_reference(ref)
    assert requirements is not None
    pinned = pins(requirements)
    if image == "debian":
        missing = [wheel for wheel in CUDA_WHEELS if not any(re.fullmatch(wheel, k) for k in pinned)]
        assert not missing, f"{framework}:{variant}: a Debian base, but no wheel pins {missing}"
        return
    base = NVIDIA_CUDA.match(f"{image}:{tag}")
    assert base, f"{framework}:{variant}: BASE_IMAGE={ref} is not an NVIDIA CUDA image tag"
    runtime = [v for k, v in pinned.items() if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", k)]
    if runtime:  # the CUDA libraries come from wheels: the base's CUDA (and driver check) must match
        assert runtime[0].split(".")[:2] == base["cuda"].split(".")[:2], (
            f"{framework}:{variant}: CUDA wheels {runtime[0]} on a CUDA {base['cuda']} base")
    else:  # the framework links the base image's CUDA libraries: it needs the runtime and cuDNN
        assert base["flavour"] == "runtime" and base["cudnn"], (
            f"{framework}:{variant}: BASE_IMAGE={ref} lacks the CUDA runtime or cuDNN")


def test_the_registry_free_cuda_variant_declares_what_the_container_toolkit_reads() -> None:
    """torch:cuda-pypi builds on the Debian base (no NVIDIA image to inherit from): it declares
    the driver capabilities and CUDA requirement NVIDIA's images do, and no NVIDIA_VISIBLE_DEVICES
    (a cell sees only the GPUs its device request names)."""
    dockerfile, _ = variant_files("torch", "cuda-pypi")
    text = dockerfile.read_text(encoding="utf-8")
    assert base_image_default(text).startswith("debian:bookworm")
    env = " ".join(args for keyword, args in stages(text)[-1][1] if keyword == "ENV").split()
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env and "NVIDIA_REQUIRE_CUDA=cuda>=13.0" in env
    assert not [item for item in env if item.startswith("NVIDIA_VISIBLE_DEVICES")]
    assert frameworks()["torch"].variant("cuda-pypi").requirements == frameworks()["torch"].variant("cuda").requirements


def test_mxnet_cuda_builds_on_cuda_11_7_or_older_with_cudnn_8_and_old_numpy() -> None:
    # MXNet 1.9.1 supports CUDA up to 11.7 and cuDNN 8; its numpy aliases went away in numpy 1.24.
    variants = [v for fw, v in gpu_variants() if fw == "mxnet"]
    assert variants
    for variant in variants:
        dockerfile, requirements = variant_files("mxnet", variant)
        ref = base_image_default(dockerfile.read_text(encoding="utf-8"))
        base = NVIDIA_CUDA.match(ref)
        assert base, ref
        major, minor = (int(x) for x in base["cuda"].split(".")[:2])
        assert (major, minor) <= (11, 7) and base["cudnn"] == "8", ref
        assert base["flavour"] == "runtime", ref
        pinned = pins(requirements)
        assert pinned.get(f"mxnet-{variant}") == "1.9.1", pinned
        numpy = tuple(int(x) for x in pinned["numpy"].split(".")[:2])
        assert numpy < (1, 24), pinned["numpy"]
