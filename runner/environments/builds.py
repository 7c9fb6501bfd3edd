"""Image builds: build the framework images a matrix needs through the Docker SDK, then probe them.

For each (framework, variant): resolve the base image (pulled once when the engine lacks it),
assemble and hash the build context (``contexts.py``), and build it unless an image with its
tag exists.  Builds use ``--network host`` (apt and pip only; cells always run with
``--network none``); the untagged build stages are pruned afterwards.  Then the harness probe
runs inside the image (``probes.py``) and the variant's promises are checked.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from matrun.errors import EnvironmentBuildError, InputError
from matrun.runner.environments.contexts import (LABEL, BuildContext, default_base_image, prepare_context,
                                                 variant_of)
from matrun.runner.environments.engine import build_lock
from matrun.runner.environments.probes import (ImageProbe, broken_promises, probe_cuda_libraries, probe_image,
                                                variant_promises)
from matrun.runner.planning.preflight import host_gpus

if TYPE_CHECKING:  # the Docker SDK is imported only when an engine is used
    import docker

LOG_TAIL_LINES = 40  # of a failed build's log, in its error

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ImageBuildError(EnvironmentBuildError):
    """``docker build`` failed: names the failing step and carries its log tail."""

    def __init__(self, message: str, *, step: str = "", log_tail: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.log_tail = log_tail


@dataclass(frozen=True)
class BuildEvent:
    """One progress report: ``kind`` is context / step / log / cached / built / pull / probe."""

    framework: str
    variant: str
    kind: str
    text: str = ""
    step: int | None = None
    steps: int | None = None


ProgressCallback = Callable[[BuildEvent], None]


@dataclass(frozen=True)
class BuiltImage:
    """An image built (or found already built) and what its probe found (None: not probed)."""

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


def remove_build_stages(client: "docker.DockerClient", report: ProgressCallback | None = None,
                        image: tuple[str, str] = ("", "")) -> None:
    """Remove untagged images of build stages (the legacy builder keeps them; they hold
    wheels and compilers and are not part of any framework image).  Removing a large one
    (a CUDA image's build stage holds ~6 GB) can outlast the SDK's 10 s read timeout: the
    engine finishes it anyway, so the build goes on and says so."""
    import requests

    try:
        client.images.prune(filters={"dangling": True, "label": f"{LABEL}.stage=build"})
    except requests.exceptions.ReadTimeout:
        if report is not None:
            report(BuildEvent(*image, "cleanup", "the engine is still removing the build stage's image (over "
                                                 "10 s): it finishes on its own"))


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
                with build_lock(client):  # builds on one engine take turns (engine.build_lock)
                    image_id = None if force else _existing_image(client, ctx.tag)
                    if image_id is not None:  # another process built it while this one waited
                        report(BuildEvent(framework, variant, "cached", ctx.tag))
                    else:
                        started = time.perf_counter()
                        try:
                            image_id = build_image(client, ctx, progress=report)
                        finally:
                            remove_build_stages(client, report, (framework, variant))
                        seconds = time.perf_counter() - started
                        report(BuildEvent(framework, variant, "built", f"{ctx.tag} in {seconds:.0f} s"))
        found = None
        gpu_variant = variant_of(framework, variant, images_dir).device == "gpu"
        if probe and gpu_variant and not host_gpus():
            # A CUDA framework may not even import without the driver's libcuda (MXNet does not),
            # and nothing can train: the harness probe of a GPU image needs a GPU.  Without one,
            # the CUDA runtime, cuDNN and NCCL really inside are read (none needs the driver)
            # and the variant's cuda / cudnn promises checked against them.
            found = probe_cuda_libraries(client, ctx.tag, framework)
            libs = found.raw
            report(BuildEvent(framework, variant, "probe", (
                f"no GPU here, libraries only: {found.framework} {found.framework_version}, python {found.python}, "
                f"cuda runtime {found.cuda}, cudnn {found.cudnn}, nccl {libs['versions']['nccl']}"
                + (f" ({found.framework} did not import: {libs['framework_error']})" if libs.get("framework_error") else "")
                + "; the harness probe runs on a GPU")))
            promised = {key: value for key, value in (
                promises.get((framework, variant), {}) if promises is not None
                else variant_promises(framework, variant, images_dir)[True]).items() if key in ("cuda", "cudnn")}
            broken = broken_promises(found, promised)
            if broken:
                raise ImageBuildError(f"image {ctx.tag} ({framework}:{variant}) does not hold what the variant "
                                      f"promises (library probe, no GPU): {'; '.join(broken)}", step="probe")
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
