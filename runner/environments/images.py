"""Framework images: build the ones a matrix needs, then probe what is really in them.

An image is built from ``images/<framework>/Dockerfile.<variant>`` and
``requirements-<variant>.txt`` (the same pins as the local executor's virtual environment)
in a build context assembled here:

    Dockerfile.<variant>, requirements-<variant>.txt
    wheels/          wheels of pinned packages taken from the wheelhouse (may be empty)
    ca-bundle.crt    the CA bundle pip trusts inside the build (empty: pip's own)

Its tag is ``matrun/<framework>:<variant>-<hash>``, where the hash covers the context's
files (not the CA bundle: how pip reaches the index does not change what is installed),
the base image's name and ID, and ``CONTEXT_PROTOCOL``; so the same inputs are built once
and any change gives a new tag.  Labels carry the pins.  Builds use ``--network host``
(apt and pip only; cells always run with ``--network none``).  After a build the harness
probe runs inside the image (no network, no capabilities, the staged harness mounted
read-only) and reports the framework, Python, CUDA / cuDNN, BLAS and oneDNN it finds.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrun.errors import EnvironmentBuildError, InputError

if TYPE_CHECKING:
    import docker

    from matrun.frameworks import Variant

# Bump when the layout of the build context changes (the hash, hence every tag, changes).
CONTEXT_PROTOCOL = 1
REPOSITORY = "matrun"
LABEL = "org.matrun"
CA_BUNDLE = "ca-bundle.crt"
WHEELS = "wheels"
HARNESS_MOUNT = "/opt/matrun-harness"
PROBE_MARK = "MATRUN-PROBE "
PROBE_TIMEOUT = 300.0
LOG_TAIL_LINES = 40

# Frameworks whose dense kernels are their own, with no BLAS library loaded: TensorFlow's CPU
# matmul / convolution are Eigen's (or oneDNN's, reported apart).
_BUILTIN_BLAS = {"tensorflow": "eigen"}
_NUMPY_LIB = re.compile(r"numpy|scipy_openblas")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


class ImageBuildError(EnvironmentBuildError):
    """``docker build`` failed: names the failing step and carries its log tail."""

    def __init__(self, message: str, *, step: str = "", log_tail: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.log_tail = log_tail


@dataclass(frozen=True)
class BuildEvent:
    """One progress report: ``kind`` is context / step / log / cached / built / probe."""

    framework: str
    variant: str
    kind: str
    text: str = ""
    step: int | None = None
    steps: int | None = None


ProgressCallback = Callable[[BuildEvent], None]


@dataclass(frozen=True)
class BuildContext:
    framework: str
    variant: str
    path: Path
    dockerfile: str
    content_hash: str
    pins: Mapping[str, str]
    wheels: tuple[str, ...]
    base_image: str
    recipe_hash: str = ""
    build_args: Mapping[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"{REPOSITORY}/{self.framework}:{self.variant}-{self.content_hash[:12]}"

    def labels(self) -> dict[str, str]:
        labels = {
            f"{LABEL}.framework": self.framework,
            f"{LABEL}.variant": self.variant,
            f"{LABEL}.content-hash": self.content_hash,
            f"{LABEL}.base-image": self.base_image,
            f"{LABEL}.wheels": " ".join(self.wheels),
            f"{LABEL}.recipe-hash": self.recipe_hash,
        }
        labels.update({f"{LABEL}.build-arg.{name}": value for name, value in self.build_args.items()})
        labels.update({f"{LABEL}.pin.{name}": version for name, version in self.pins.items()})
        return labels


@dataclass(frozen=True)
class ImageProbe:
    """What the harness probe found inside an image (``raw``: the probe event's fields)."""

    framework: str
    framework_version: str | None
    python: str | None
    cuda: str | None
    cudnn: str | None
    blas: str | None
    onednn: str | None
    openmp: str | None
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class BuiltImage:
    framework: str
    variant: str
    tag: str
    image_id: str
    content_hash: str
    size_bytes: int
    build_seconds: float | None  # None: the tag existed, nothing was built
    probe: ImageProbe | None
    base_image: str = ""
    recipe_hash: str = ""
    pins: Mapping[str, str] = field(default_factory=dict)


# --- what to build ---------------------------------------------------------------------

def images_needed(cells: Iterable[Any]) -> list[tuple[str, str]]:
    """The (framework, variant) pairs of the cells, once each, in first-seen order.

    A cell is anything with ``params`` (``PlannedCell``), ``values`` (``CellParams``) or a
    mapping with ``framework`` and ``variant``.
    """
    seen: dict[tuple[str, str], None] = {}
    for cell in cells:
        values = cell if isinstance(cell, Mapping) else getattr(cell, "params", None) or cell.values
        seen.setdefault((values["framework"], values["variant"]), None)
    return list(seen)


def variant_of(framework: str, variant: str, images_dir: Path | None = None) -> "Variant":
    """How a framework variant is built: ``[variants.<variant>]`` of its framework.toml (the
    package's, or ``images_dir``'s own); a folder without a framework.toml builds
    ``Dockerfile.<variant>`` from ``requirements-<variant>.txt``."""
    from matrun.frameworks import Variant, get_framework, load_framework

    if images_dir is None:
        return get_framework(framework).variant(variant)
    found = load_framework(images_dir / framework)
    if found is not None:
        return found.variant(variant)
    return Variant(variant, f"Dockerfile.{variant}", f"requirements-{variant}.txt")


def image_sources(framework: str, variant: str, images_dir: Path | None = None) -> tuple[Path, Path | None]:
    """The Dockerfile and the pip requirements (None: an image-only variant) of a framework
    variant, as ``[variants.<variant>]`` of its framework.toml names them."""
    var = variant_of(framework, variant, images_dir)
    root = images_dir or Path(str(resources.files("matrun.images")))
    folder = root / framework
    dockerfile = folder / var.dockerfile
    requirements = folder / var.requirements if var.requirements else None
    for path in filter(None, (dockerfile, requirements)):
        if not path.is_file():
            raise InputError(f"no image for {framework}:{variant}: images/{framework}/{path.name} does not exist")
    return dockerfile, requirements


def recipe_hash(framework: str, variant: str, images_dir: Path | None = None) -> str:
    """SHA-256 of what the repository says about an image: its Dockerfile, its requirements
    and its build arguments.  Known without an engine, so a cell's identity (``env_id``)
    changes when the recipe does, before anything is built; the image's tag hashes more
    (the base image's ID and the wheels actually used)."""
    var = variant_of(framework, variant, images_dir)
    dockerfile, requirements = image_sources(framework, variant, images_dir)
    digest = hashlib.sha256(f"matrun-recipe {CONTEXT_PROTOCOL}\n{framework}\n{variant}\n".encode())
    for path in filter(None, (dockerfile, requirements)):
        digest.update(f"{path.name}\0{_file_digest(path)}\n".encode())
    for name, value in sorted(var.build_args.items()):
        digest.update(f"arg {name}={value}\n".encode())
    return digest.hexdigest()


_BASE_ARG = re.compile(r"^ARG\s+BASE_IMAGE=(\S+)\s*$", re.M)


def default_base_image(framework: str, variant: str, images_dir: Path | None = None) -> str:
    """The base image a variant builds on when ``--base-image`` is not given: the variant's
    ``base_image`` in framework.toml, else the Dockerfile's ``ARG BASE_IMAGE=`` default."""
    var = variant_of(framework, variant, images_dir)
    if var.base_image:
        return var.base_image
    dockerfile, _ = image_sources(framework, variant, images_dir)
    match = _BASE_ARG.search(dockerfile.read_text(encoding="utf-8"))
    if not match:
        raise InputError(f"images/{framework}/{dockerfile.name} has no `ARG BASE_IMAGE=<image>` default")
    return match.group(1)


def parse_pins(requirements: str) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by normalised project name."""
    pins = {}
    for line in requirements.splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[_normalise(match.group(1))] = match.group(2)
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def select_wheels(wheelhouse: Path | None, pins: Mapping[str, str], *, device: str = "cpu") -> list[Path]:
    """The wheelhouse's wheels of pinned packages at their pinned version (a local version
    label such as ``+cpu`` matches, as it does for pip); others are left out of the context.
    For a GPU variant a ``+cpu`` wheel is never taken: pip would accept it for a plain pin,
    and the image would silently have no CUDA."""
    if wheelhouse is None:
        return []
    if not wheelhouse.is_dir():
        raise InputError(f"wheelhouse {wheelhouse} is not a directory")
    chosen = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        pinned = pins.get(_normalise(name))
        base, _, local = version.partition("+")
        if device == "gpu" and local == "cpu" and "+" not in (pinned or ""):
            continue
        if pinned is not None and base == pinned.split("+")[0]:
            chosen.append(wheel)
    return chosen


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare_context(framework: str, variant: str, *, dest: Path, base_image: str, base_image_id: str,
                    images_dir: Path | None = None, wheelhouse: Path | None = None,
                    ca_bundle: Path | None = None) -> BuildContext:
    """Assemble the build context in ``dest`` (created) and hash it."""
    var = variant_of(framework, variant, images_dir)
    dockerfile, requirements = image_sources(framework, variant, images_dir)
    pins = parse_pins(requirements.read_text(encoding="utf-8")) if requirements else {}
    wheels = select_wheels(wheelhouse, pins, device=var.device)
    (dest / WHEELS).mkdir(parents=True)
    shutil.copyfile(dockerfile, dest / dockerfile.name)
    if requirements is not None:
        shutil.copyfile(requirements, dest / requirements.name)
    for wheel in wheels:
        shutil.copyfile(wheel, dest / WHEELS / wheel.name)
    if ca_bundle is not None:
        if not ca_bundle.is_file():
            raise InputError(f"CA bundle {ca_bundle} is not a file")
        shutil.copyfile(ca_bundle, dest / CA_BUNDLE)
    else:
        (dest / CA_BUNDLE).write_bytes(b"")
    recipe = recipe_hash(framework, variant, images_dir)
    digest = hashlib.sha256(f"matrun-image {CONTEXT_PROTOCOL}\n{base_image}\n{base_image_id}\n{recipe}\n".encode())
    for path in sorted(p for p in dest.rglob("*") if p.is_file() and p.name != CA_BUNDLE):
        digest.update(f"{path.relative_to(dest).as_posix()}\0{_file_digest(path)}\n".encode())
    return BuildContext(framework, variant, dest, dockerfile.name, digest.hexdigest(), pins,
                        tuple(w.name for w in wheels), base_image, recipe, dict(var.build_args))


# --- build -----------------------------------------------------------------------------

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def build_image(client: "docker.DockerClient", ctx: BuildContext, *,
                progress: ProgressCallback | None = None) -> str:
    """``docker build --network host`` of the context; returns the image ID.

    Raises ``ImageBuildError`` naming the failing step, with the last lines of its log.
    """
    report = progress or (lambda event: None)
    step_text, log = "", []
    image_id = None
    stream = client.api.build(
        path=str(ctx.path), dockerfile=ctx.dockerfile, tag=ctx.tag, labels=ctx.labels(),
        buildargs={**ctx.build_args, "BASE_IMAGE": ctx.base_image}, network_mode="host", pull=False,
        rm=True, forcerm=True, decode=True)
    for chunk in stream:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            tail = "\n".join(log[-LOG_TAIL_LINES:])
            where = step_text if len(step_text) <= 120 else step_text[:119] + "…"
            raise ImageBuildError(
                f"building {ctx.framework}:{ctx.variant} failed at {where or 'the start'}: "
                f"{detail.strip()}\n--- log tail ---\n{tail}", step=step_text, log_tail=tail)
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        text = _ANSI.sub("", chunk.get("stream", ""))  # the builder colours stderr red
        for line in text.splitlines():
            match = _STEP.match(line)
            if match:
                step_text = line
                log.clear()
                report(BuildEvent(ctx.framework, ctx.variant, "step", match.group(3),
                                  int(match.group(1)), int(match.group(2))))
            elif line.strip():
                log.append(line)
                report(BuildEvent(ctx.framework, ctx.variant, "log", line))
    return image_id or client.images.get(ctx.tag).id


def _existing_image(client: "docker.DockerClient", tag: str) -> str | None:
    import docker

    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def remove_build_stages(client: "docker.DockerClient") -> None:
    """Remove untagged images of build stages (the legacy builder keeps them; they hold
    wheels and compilers and are not part of any framework image)."""
    client.images.prune(filters={"dangling": True, "label": f"{LABEL}.stage=build"})


# --- probe -----------------------------------------------------------------------------

_PROBE_SCRIPT = f"""
import importlib, json, sys
from matrun.runner.harness import probe
from matrun.runner.harness.adapters import ADAPTERS
params = json.loads(sys.argv[1])
adapter = importlib.import_module("matrun.runner.harness.adapters." + ADAPTERS[params["framework"]])
adapter.configure(params)
fields = probe.collect(params["framework"], params, adapter.probe(params))
print({PROBE_MARK!r} + json.dumps(fields, default=str))
"""


def probe_params(framework: str, variant: str, *, onednn: bool = True) -> dict[str, Any]:
    """Every cell parameter at its default, for this framework variant on the CPU."""
    from matrun.runner.planning.params import PARAMS

    params = {name: param.default for name, param in PARAMS.items()}
    params.update(framework=framework, variant=variant, device="cpu", onednn=onednn)
    return params


def probe_image(client: "docker.DockerClient", tag: str, framework: str, variant: str, *,
                harness_dir: Path | None = None, timeout: float = PROBE_TIMEOUT,
                onednn: bool = True, gpu: bool = False) -> ImageProbe:
    """Run the harness probe inside the image (oneDNN on or off) and summarise what it found."""
    from matrun.runner.environments.venvs import stage_harness
    from matrun.frameworks import get_framework

    params = probe_params(framework, variant, onednn=onednn)
    fw = get_framework(framework)
    env = {**fw.fixed_env, **fw.environment(params), "PYTHONPATH": HARNESS_MOUNT}
    container = client.containers.run(
        tag, ["python3", "-c", _PROBE_SCRIPT, json.dumps(params)], detach=True,
        environment=env, network_mode="none", user="1000:1000", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": ""},
        volumes={str(harness_dir or stage_harness()): {"bind": HARNESS_MOUNT, "mode": "ro"}},
        labels={f"{LABEL}.role": "probe"}, **_gpu_request(gpu))
    try:
        try:
            status = container.wait(timeout=timeout)
        except Exception as exc:  # the SDK raises a requests timeout
            container.kill()
            raise EnvironmentBuildError(f"the probe of {tag} did not finish in {timeout:.0f} s") from exc
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    found = [line[len(PROBE_MARK):] for line in logs.splitlines() if line.startswith(PROBE_MARK)]
    if status.get("StatusCode") != 0 or not found:
        tail = "\n".join(logs.splitlines()[-LOG_TAIL_LINES:])
        raise EnvironmentBuildError(f"the probe of {tag} failed (exit {status.get('StatusCode')}):\n{tail}")
    return summarise_probe(json.loads(found[-1]))


def _host_gpus() -> int:
    from matrun.runner.planning.identity import host_gpus

    return host_gpus()


def _gpu_request(gpu: bool) -> dict[str, Any]:
    """One GPU for the probe of a GPU image (the framework needs the driver to import)."""
    if not gpu:
        return {}
    import docker

    return {"device_requests": [docker.types.DeviceRequest(count=1, capabilities=[["gpu"]])]}


def summarise_probe(fields: Mapping[str, Any]) -> ImageProbe:
    """Framework, Python, CUDA / cuDNN, BLAS, oneDNN and OpenMP from a probe event's fields.

    The framework's BLAS comes from its build information where it says MKL (PyTorch links MKL
    statically: ``BLAS_INFO=mkl``), else from the BLAS library the probe found mapped
    (``blas_loaded``: Debian's alternatives resolved to OpenBLAS / BLIS / reference), else
    from the BLAS libraries threadpoolctl found loaded,
    leaving out numpy's own bundled OpenBLAS (loaded by every image, used by none of the
    frameworks' operators).
    """
    in_force = fields.get("in_force") or {}
    build = str(fields.get("build") or "")
    libs = fields.get("libraries") or []

    def pools(api: str) -> list[dict[str, Any]]:
        return [lib for lib in libs if lib.get("user_api") == api]

    blas = None
    loaded = fields.get("blas_loaded") or {}
    match = re.search(r"BLAS_INFO=(\w+)", build)
    if match and match.group(1) == "mkl":
        blas = "mkl"  # linked statically: no library of its own in the process to see
    elif isinstance(loaded, Mapping) and loaded.get("provider") not in (None, "unknown"):
        # The library really mapped, through Debian's alternatives (python3-torch says "generic").
        blas = " ".join(str(x) for x in (loaded["provider"], loaded.get("version")) if x)
    elif match:
        blas = match.group(1)
    else:
        own = [lib for lib in pools("blas") if not _NUMPY_LIB.search(str(lib.get("path") or lib.get("name")))]
        if own:
            blas = " ".join(str(x) for x in (own[0].get("internal_api"), own[0].get("version")) if x)
        else:
            blas = _BUILTIN_BLAS.get(str(fields.get("framework")))
    onednn = None
    match = re.search(r"(?:oneDNN|MKL-DNN|DNNL)\s+v?([\d.]+)", build)
    if match:
        onednn = match.group(1)
    elif _onednn_built_in(in_force, libs):
        onednn = "present"
    openmp = ", ".join(str(lib.get("name")) for lib in pools("openmp")) or None
    return ImageProbe(
        framework=str(fields.get("framework")),
        framework_version=fields.get("framework_version"),
        python=fields.get("python"),
        cuda=in_force.get("cuda_version"),
        cudnn=None if in_force.get("cudnn_version") is None else str(in_force["cudnn_version"]),
        blas=blas, onednn=onednn, openmp=openmp, raw=dict(fields))


def _onednn_built_in(in_force: Mapping[str, Any], libs: list[dict[str, Any]]) -> bool:
    """oneDNN is in the build: the adapter says so (torch / MXNet ``onednn_available``,
    TensorFlow ``IsMklEnabled``), or a oneDNN library is loaded."""
    if in_force.get("onednn_available"):
        return True
    if str(in_force.get("onednn_source", "")).startswith("IsMklEnabled") and in_force.get("onednn") is True:
        return True
    return any(re.search(r"dnnl|mkldnn|onednn", str(lib.get("name", "")), re.I) for lib in libs)


def broken_promises(found: ImageProbe, promised: Mapping[str, str]) -> list[str]:
    """What a variant promises (``{"blas": "mkl", "onednn": "any"}``) that the probe did not find.

    A promised value matches when the found one starts with it (case-insensitive: ``openblas``
    matches ``openblas 0.3.13``); ``"any"`` only asks that something was found; ``"none"``
    that nothing was.  Unknown keys are reported, never ignored.
    """
    broken = []
    for key, want in promised.items():
        if key not in ("framework_version", "python", "cuda", "cudnn", "blas", "onednn", "openmp"):
            broken.append(f"{key}: not something the probe reports")
            continue
        have = getattr(found, key)
        ok = (have is None if want == "none" else have is not None if want == "any"
              else have is not None and str(have).lower().startswith(want.lower()))
        if not ok:
            broken.append(f"{key}: promised {want}, the probe found {have if have is not None else 'none'}")
    return broken


# --- the whole job ---------------------------------------------------------------------

def variant_promises(framework: str, variant: str, images_dir: Path | None = None) -> dict[bool, Mapping[str, str]]:
    """What the probe must find, by oneDNN setting (``True``: on), from framework.toml."""
    var = variant_of(framework, variant, images_dir)
    found: dict[bool, Mapping[str, str]] = {True: var.promises}
    if var.promises_onednn_off:
        found[False] = var.promises_onednn_off
    return found


def resolve_base_image(client: "docker.DockerClient", name: str, *, report: ProgressCallback,
                       framework: str, variant: str) -> str:
    """The base image's ID, pulling it when the engine does not have it (a real GPU host
    pulls its pinned CUDA base once; where no registry answers, the error says what to do)."""
    import docker

    try:
        return client.images.get(name).id
    except docker.errors.ImageNotFound:
        pass
    report(BuildEvent(framework, variant, "pull", name))
    try:
        return client.images.pull(name).id
    except docker.errors.APIError as exc:
        raise InputError(f"base image {name} is not in the Docker engine and could not be pulled "
                         f"({str(exc).splitlines()[0][:200]}); pull or import it, or pass --base-image "
                         f"(`matrun build --make-base` makes {name if name.startswith('matrun-base') else 'matrun-base:bookworm'} "
                         f"with debootstrap)") from None


def build_images(images: Iterable[tuple[str, str]], *, client: "docker.DockerClient", base_image: str | None = None,
                 images_dir: Path | None = None, wheelhouse: Path | None = None,
                 ca_bundle: Path | None = None, progress: ProgressCallback | None = None,
                 force: bool = False, probe: bool = True, workdir: Path | None = None,
                 promises: Mapping[tuple[str, str], Mapping[str, str]] | None = None) -> list[BuiltImage]:
    """Build (or find already built) each (framework, variant) image and probe it.

    ``base_image``: for every image (``--base-image``); None: each variant's default.
    ``promises``: per (framework, variant), what its probe must show with oneDNN on
    (``broken_promises``); None: the variants' promises from framework.toml, with oneDNN on
    and, where the variant says, off.  A variant whose probe breaks a promise fails with
    ``ImageBuildError`` (the image stays tagged, so the failure can be inspected).
    """
    report = progress or (lambda event: None)
    built = []
    for framework, variant in images:
        base = base_image or default_base_image(framework, variant, images_dir)
        base_id = resolve_base_image(client, base, report=report, framework=framework, variant=variant)
        with tempfile.TemporaryDirectory(prefix=f"matrun-build-{framework}-", dir=workdir) as tmp:
            ctx = prepare_context(framework, variant, dest=Path(tmp) / "context", base_image=base,
                                  base_image_id=base_id, images_dir=images_dir,
                                  wheelhouse=wheelhouse, ca_bundle=ca_bundle)
            report(BuildEvent(framework, variant, "context", ctx.tag))
            seconds = None
            image_id = None if force else _existing_image(client, ctx.tag)
            if image_id is not None:
                report(BuildEvent(framework, variant, "cached", ctx.tag))
            else:
                started = time.perf_counter()
                try:
                    image_id = build_image(client, ctx, progress=report)
                finally:
                    remove_build_stages(client)
                seconds = time.perf_counter() - started
                report(BuildEvent(framework, variant, "built", f"{ctx.tag} in {seconds:.0f} s"))
        found = None
        gpu_variant = variant_of(framework, variant, images_dir).device == "gpu"
        if probe and gpu_variant and not _host_gpus():
            # A CUDA framework may not even import without the driver's libcuda (MXNet does not):
            # the probe of a GPU image needs a GPU.  Built, not verified: say so, record no probe.
            report(BuildEvent(framework, variant, "probe", "skipped: a GPU variant is probed on a GPU, "
                              "and this host has none (the image is built but unverified)"))
        elif probe:
            wanted = ({True: promises.get((framework, variant), {})} if promises is not None
                      else variant_promises(framework, variant, images_dir))
            for onednn, promised in wanted.items():
                result = probe_image(client, ctx.tag, framework, variant, onednn=onednn, gpu=gpu_variant)
                report(BuildEvent(framework, variant, "probe",
                                  f"oneDNN {'on' if onednn else 'off'}: {result.framework} "
                                  f"{result.framework_version}, python {result.python}, blas {result.blas}, "
                                  f"onednn {result.onednn}, cuda {result.cuda}"))
                broken = broken_promises(result, promised)
                if broken:
                    raise ImageBuildError(
                        f"image {ctx.tag} ({framework}:{variant}) does not hold what the variant promises "
                        f"(probe with oneDNN {'on' if onednn else 'off'}): {'; '.join(broken)}", step="probe")
                if onednn:
                    found = result
        size = client.images.get(ctx.tag).attrs.get("Size", 0)
        built.append(BuiltImage(framework, variant, ctx.tag, image_id, ctx.content_hash, size, seconds, found,
                                base, ctx.recipe_hash, dict(ctx.pins)))
    return built
