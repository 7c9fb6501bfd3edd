"""Image recipes and build contexts: what an image is made of, named before anything is built.

An image is built from ``images/<framework>/Dockerfile.<variant>`` and
``requirements-<variant>.txt`` (the same pins as the local executor's virtual environment),
as ``[variants.<variant>]`` of the framework's framework.toml names them, in a build context
assembled here:

    Dockerfile.<variant>, requirements-<variant>.txt
    wheels/          wheels of pinned packages taken from the wheelhouse (may be empty)
    ca-bundle.crt    the CA bundle pip trusts inside the build (empty: pip's own)

Two hashes name an image.  The *recipe hash* covers what the repository says (Dockerfile,
requirements, build arguments, among them ``PIP_BUILD_CONSTRAINTS`` from a variant's
``build_constraints``): it is known without an engine and is the docker executor's
``env_id``, hence part of cell ids.  The *content hash* covers the context's files (not the
CA bundle: how pip reaches the index does not change what is installed), the base image's
name and ID, the recipe hash and ``CONTEXT_PROTOCOL``; the tag is
``matrun/<framework>:<variant>-<content hash>``, so the same inputs are built once and any
change gives a new tag.  Labels (``org.matrun.*``) carry both hashes and the pins.

No engine here: the build is ``builds.py``, the probe ``probes.py``.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from matrun.runner.environments.releases import env_variant, lock_for, project_name, requirements_of, split_variant
from matrun.errors import InputError
from matrun.frameworks import Variant, get_framework, load_framework

# Bump when the layout of the build context changes (the hash, hence every tag, changes).
CONTEXT_PROTOCOL = 1
# The image repository (tags are REPOSITORY/<framework>:<variant>-<hash>) and the label prefix.
REPOSITORY = "matrun"
LABEL = "org.matrun"
CA_BUNDLE = "ca-bundle.crt"
WHEELS = "wheels"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")
_BASE_ARG = re.compile(r"^ARG\s+BASE_IMAGE=(\S+)\s*$", re.M)


def image_repository(framework: str) -> str:
    """The repository a framework's images are tagged in (``matrun/<framework>``)."""
    return f"{REPOSITORY}/{framework}"


@dataclass(frozen=True)
class BuildContext:
    """A build context assembled on disk (``path``), with what its tag and labels say."""

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
    lock: str = ""  # a release's image: the lock it installs (a label: every run records it)

    @property
    def tag(self) -> str:
        # a release (``cpu@2.4.1``) tags as cpu-2.4.1-…: a tag has no '@'
        return f"{image_repository(self.framework)}:{self.variant.replace('@', '-')}-{self.content_hash[:12]}"

    def labels(self) -> dict[str, str]:
        variant, release = split_variant(self.variant)
        labels = {
            f"{LABEL}.framework": self.framework,
            f"{LABEL}.variant": variant,
            **({f"{LABEL}.release": release, f"{LABEL}.lock": self.lock} if release else {}),
            f"{LABEL}.content-hash": self.content_hash,
            f"{LABEL}.base-image": self.base_image,
            f"{LABEL}.wheels": " ".join(self.wheels),
            f"{LABEL}.recipe-hash": self.recipe_hash,
        }
        labels.update({f"{LABEL}.build-arg.{name}": value for name, value in self.build_args.items()})
        labels.update({f"{LABEL}.pin.{name}": version for name, version in self.pins.items()})
        return labels


# --- what to build ---------------------------------------------------------------------

def images_needed(cells: Iterable[Any]) -> list[tuple[str, str]]:
    """The (framework, variant) pairs of the cells, once each, in first-seen order.

    A cell is anything with ``params`` (``PlannedCell``), ``values`` (``CellParams``) or a
    mapping with ``framework`` and ``variant``.
    """
    seen: dict[tuple[str, str], None] = {}
    for cell in cells:
        values = cell if isinstance(cell, Mapping) else getattr(cell, "params", None) or cell.values
        seen.setdefault((values["framework"], env_variant(values)), None)  # a release: variant@version
    return list(seen)


def variant_of(framework: str, variant: str, images_dir: Path | None = None) -> Variant:
    """How a framework variant is built: ``[variants.<variant>]`` of its framework.toml (the
    package's, or ``images_dir``'s own); a folder without a framework.toml builds
    ``Dockerfile.<variant>`` from ``requirements-<variant>.txt``.  A release (``cpu@2.4.1``)
    is built as its variant is."""
    variant = split_variant(variant)[0]
    if images_dir is None:
        return get_framework(framework).variant(variant)
    found = load_framework(images_dir / framework)
    if found is not None:
        return found.variant(variant)
    return Variant(variant, f"Dockerfile.{variant}", f"requirements-{variant}.txt")


def build_args_of(var: Variant) -> dict[str, str]:
    """The build arguments an image of ``var`` is built with: its ``build_args``, and
    ``PIP_BUILD_CONSTRAINTS`` (its ``build_constraints``, space-separated) when it has any; the
    Dockerfile declares ``ARG PIP_BUILD_CONSTRAINTS``, writes them to a file and points
    ``PIP_CONSTRAINT`` at it for its pip install."""
    args = dict(var.build_args)
    if var.build_constraints:
        args["PIP_BUILD_CONSTRAINTS"] = " ".join(var.build_constraints)
    return args


def image_sources(framework: str, variant: str, images_dir: Path | None = None) -> tuple[Path, Path | None]:
    """The Dockerfile and the pip requirements (None: an image-only variant) of a framework
    variant, as ``[variants.<variant>]`` of its framework.toml names them (a release's image
    installs the release's lock in their place: ``prepare_context``)."""
    variant = split_variant(variant)[0]
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
    base, release = split_variant(variant)
    dockerfile, requirements = image_sources(framework, base, images_dir)
    digest = hashlib.sha256(f"matrun-recipe {CONTEXT_PROTOCOL}\n{framework}\n{base}\n".encode())
    if release:  # the release's request stands for the pins (its lock is resolved at build time)
        digest.update(f"release {release}\n".encode())
        digest.update("".join(f"requires {r}\n" for r in requirements_of(framework, base, release)).encode())
        requirements = None
    for path in filter(None, (dockerfile, requirements)):
        digest.update(f"{path.name}\0{_file_digest(path)}\n".encode())
    for name, value in sorted(build_args_of(var).items()):
        digest.update(f"arg {name}={value}\n".encode())
    for name, value in sorted(var.env.items()):  # the variant's cell variables (none: no other hash moves)
        digest.update(f"env {name}={value}\n".encode())
    return digest.hexdigest()


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


# --- the context -----------------------------------------------------------------------

def parse_pins(requirements: str) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by normalised project name."""
    pins = {}
    for line in requirements.splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[project_name(match.group(1))] = match.group(2)
    return pins


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
        pinned = pins.get(project_name(name))
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
    """Assemble the build context in ``dest`` (created) and hash it.  A release (``cpu@2.4.1``):
    the release's lock (resolved once, releases.py) under the variant's requirements name, so
    the variant's Dockerfile installs exactly it (pip checks every hash of a hashed file)."""
    var = variant_of(framework, variant, images_dir)
    base, release = split_variant(variant)
    dockerfile, requirements = image_sources(framework, base, images_dir)
    text = requirements.read_text(encoding="utf-8") if requirements else None
    if release and requirements is not None:
        text = lock_for(framework, base, release).text
    pins = parse_pins(text) if text is not None else {}
    wheels = select_wheels(wheelhouse, pins, device=var.device)
    (dest / WHEELS).mkdir(parents=True)
    shutil.copyfile(dockerfile, dest / dockerfile.name)
    if requirements is not None:
        (dest / requirements.name).write_text(text, encoding="utf-8")
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
                        tuple(w.name for w in wheels), base_image, recipe, build_args_of(var),
                        text if release and text is not None else "")
