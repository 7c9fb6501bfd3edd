"""``matrun envs``, ``build``, ``images`` and ``matrun engine …``: framework environments, images, the engine.

Thin wrappers over ``runner/environments/`` (``venvs``: local virtual environments;
``system``: the site's own interpreters, ``variant = "system"``, nothing to build;
``contexts`` and ``builds``: the images a matrix needs, building and probing them; ``engine``:
the Docker engine) and ``warehouse/images.py`` (the images recorded); docs/IMAGES.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from matrun.errors import InputError
from matrun.frameworks import default_framework, get_framework
from matrun.runner.cli.common import (
    MatrixArg, ProfileOpt, WarehouseOpt, WhereOpt, app, command, err, group, out, resolve_warehouse,
)
from matrun.runner.environments import engine
from matrun.runner.environments.builds import build_images
from matrun.runner.environments.contexts import images_needed
from matrun.runner.environments.home import matrun_home
from matrun.runner.environments.releases import env_variant, lock_for
from matrun.runner.environments.system import list_system_envs
from matrun.runner.environments.venvs import ensure_env, list_envs
from matrun.runner.harness.spec import SYSTEM_VARIANT
from matrun.runner.planning.identity import plan_cells
from matrun.runner.planning.matrix import load_matrix
from matrun.warehouse.images import list_images, record_images
from matrun.runner.planning.selection import parse_where, select

engine_app = group(
    "engine", help="Start, stop or check the local Docker engine (dockerd --bridge=none --iptables=false).")


@command(app)
def envs(
    matrix: MatrixArg = Path("matrix.toml"),
    profile: ProfileOpt = None,
    build: Annotated[bool, typer.Option("--build", help="Build the environments the matrix needs.")] = False,
    relock: Annotated[bool, typer.Option("--relock", help="With --build: resolve the matrix's releases (cells with "
                                         "version) with pip again; an environment whose lock changed is rebuilt.")] = False,
) -> None:
    """List the framework environments built here and the site's own interpreters probed here
    (variant = "system"); --build prepares those the matrix needs."""
    if relock and not build:
        raise InputError("--relock resolves the releases of the environments --build builds: give --build too")
    if build:
        m = load_matrix(matrix, profile)
        if relock:
            for fw, variant, version in sorted({(c.values["framework"], c.values["variant"], c.values["version"])
                                                for c in m.cells if c.values.get("version")}):
                lock_for(fw, variant, version, relock=True, log=lambda t: typer.echo(t, err=True))
        for fw, variant in sorted({(c.values["framework"], env_variant(c.values)) for c in m.cells}):
            if variant == SYSTEM_VARIANT:
                typer.echo(f"{fw}:{variant}: nothing to build (the site's own Python, named by python)")
                continue
            env = ensure_env(fw, variant, log=lambda t: typer.echo(t, err=True))
            typer.echo(f"{env.spec.env_id}: {env.path}")
    table = Table(title="environments")
    for col in ("env id", "framework", "variant", "version", "python", "path"):
        table.add_column(col)
    for e in [*list_envs(), *list_system_envs()]:
        table.add_row(e["env_id"], e["framework"], e["variant"], e.get("framework_version", ""), e["python"], e["path"])
    out.print(table)


def _default_wheelhouse() -> Optional[Path]:
    """pip's own find-links directory, when it names one (the local CPU torch wheel lives there)."""
    for item in (os.environ.get("PIP_FIND_LINKS") or "").split():
        if Path(item).is_dir():
            return Path(item)
    return None


def _default_ca_bundle() -> Optional[Path]:
    value = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
    return Path(value) if value and Path(value).is_file() else None


def _parse_image(text: str) -> tuple[str, str]:
    framework, sep, variant = text.partition(":")
    if not sep or not framework or not variant:
        raise InputError(f"--image {text!r}: expected FRAMEWORK:VARIANT, e.g. {default_framework()}:cpu")
    if variant != SYSTEM_VARIANT:  # the site's own Python: said to have nothing to build
        get_framework(framework).variant(variant)  # unknown names: a clear InputError
    else:
        get_framework(framework)
    return framework, variant


def wanted_images(matrix: Path, where: list[str], image: list[str],
                  profile: str | None = None) -> list[tuple[str, str]]:
    """The (framework, variant) images to build: ``--image`` ones, else those of the matrix's cells."""
    if image:
        return list(dict.fromkeys(_parse_image(text) for text in image))
    cells = select(plan_cells(load_matrix(matrix, profile), lambda fw, variant: f"{fw}-{variant}"),
                   parse_where(where))
    return images_needed(cells)


@command(app)
def build(
    matrix: Annotated[Path, typer.Argument(
        metavar="MATRIX", help="The matrix file whose cells' images to build.")] = Path("matrix.toml"),
    profile: ProfileOpt = None,
    where: WhereOpt = [],
    image: Annotated[list[str], typer.Option(
        "--image", metavar="FRAMEWORK:VARIANT", help="Build this image instead of the matrix's (repeatable).")] = [],
    base_image: Annotated[Optional[str], typer.Option(
        "--base-image", metavar="IMAGE", help="Base image of every image built (default: each variant's pinned base).")] = None,
    make_base: Annotated[bool, typer.Option(
        "--make-base", help="Make the base image with debootstrap when the engine lacks it "
        "(where no registry can be reached; default base matrun-base:bookworm).")] = False,
    wheelhouse: Annotated[Optional[Path], typer.Option(
        "--wheelhouse", metavar="DIR", help="Directory of wheels pip takes first (default: $PIP_FIND_LINKS when it is a directory).")] = None,
    ca_bundle: Annotated[Optional[Path], typer.Option(
        "--ca-bundle", metavar="FILE", help="CA bundle pip trusts inside the build, for a TLS-intercepting proxy "
        "(default: $PIP_CERT).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Build even when an image with the same tag exists.")] = False,
    no_probe: Annotated[bool, typer.Option("--no-probe", help="Skip the probe and the variant's promise check.")] = False,
    warehouse: Annotated[Optional[Path], typer.Option(
        "--warehouse", metavar="DIR", help="The warehouse to record the images in (default: the matrix's).")] = None,
) -> None:
    """Build the framework images the matrix needs (only those), probe them, record them."""
    images = wanted_images(matrix, where, image, profile)
    system = [(fw, v) for fw, v in images if v == SYSTEM_VARIANT]
    if system:  # the site's own Python: nothing of matrun's to build
        typer.echo(f"{', '.join(f'{fw}:{v}' for fw, v in system)}: nothing to build (the site's own Python, "
                   "named by python; its cells run with --executor local)", err=True)
        images = [pair for pair in images if pair not in system]
        if not images:
            return
    if not images:
        raise InputError("no cells selected: nothing to build")
    if wheelhouse is None:
        wheelhouse = _default_wheelhouse()
    elif not wheelhouse.is_dir():
        raise InputError(f"wheelhouse {wheelhouse} is not a directory")
    if ca_bundle is None:
        ca_bundle = _default_ca_bundle()
    elif not ca_bundle.is_file():
        raise InputError(f"CA bundle {ca_bundle} is not a file")
    client = engine.connect(timeout=engine.BUILD_TIMEOUT)
    if make_base:
        base = base_image or engine.BASE_IMAGE
        _, seconds = engine.ensure_base_image(client, base)
        if seconds is not None:
            typer.echo(f"made base image {base} with debootstrap in {seconds:.0f} s", err=True)
        base_image = base
    typer.echo(f"building {len(images)} image(s): {', '.join(f'{f}:{v}' for f, v in images)}"
               f"{f' on {base_image}' if base_image else ''}; wheelhouse {wheelhouse or 'none'}; "
               f"CA bundle {ca_bundle or 'pip default'}", err=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, disable=not err.is_terminal)
    tasks: dict[tuple[str, str], Any] = {}

    def on_event(event: Any) -> None:
        key = (event.framework, event.variant)
        name = f"{event.framework}:{event.variant}"
        if event.kind == "step":
            if key not in tasks:
                tasks[key] = progress.add_task(name, total=event.steps)
            progress.update(tasks[key], completed=event.step, total=event.steps,
                            description=f"{name} {event.text[:60]}")
            if not err.is_terminal:
                typer.echo(f"{name}: step {event.step}/{event.steps} {event.text[:100]}", err=True)
        elif event.kind in ("cached", "built", "probe", "pull", "cleanup"):
            words = {"cached": "already built", "built": "built", "probe": "probe", "pull": "pulling base",
                     "cleanup": "cleanup:"}
            if err.is_terminal:
                progress.console.print(f"{name}: {words[event.kind]} {event.text}", markup=False, highlight=False)
            else:
                typer.echo(f"{name}: {words[event.kind]} {event.text}", err=True)

    progress.start()
    try:
        built = build_images(images, client=client, base_image=base_image, wheelhouse=wheelhouse,
                             ca_bundle=ca_bundle, progress=on_event, force=force, probe=not no_probe)
    finally:
        progress.stop()
    target = warehouse or (resolve_warehouse(None) if image else _matrix_warehouse(matrix))
    record_images(target, built)
    table = Table(title=f"images (recorded in {target})")
    for col in ("tag", "build s", "size", "blas", "onednn", "python"):
        table.add_column(col)
    for b in built:
        p = b.probe
        table.add_row(b.tag, "cached" if b.build_seconds is None else f"{b.build_seconds:.0f}",
                      f"{b.size_bytes / 1e6:,.0f} MB", str(getattr(p, "blas", "-")), str(getattr(p, "onednn", "-")),
                      str(getattr(p, "python", "-")))
    out.print(table)


def _matrix_warehouse(matrix: Path) -> Path:
    return load_matrix(matrix).sweep.warehouse


@command(app)
def images(warehouse: WarehouseOpt = None) -> None:
    """List the images `matrun build` recorded: pins, what the probe found, size, build time."""
    rows = list_images(resolve_warehouse(warehouse))
    table = Table(title="images")
    for col in ("tag", "framework", "version", "python", "blas", "onednn", "cuda", "cudnn", "size", "build s", "recorded"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["tag"], r["framework"], str(r["framework_version"] or "-"), str(r["python"] or "-"),
                      str(r["blas"] or "-"), str(r["onednn"] or "-"), str(r["cuda"] or "-"), str(r["cudnn"] or "-"),
                      f"{(r['size_bytes'] or 0) / 1e6:,.0f} MB",
                      "-" if r["build_seconds"] is None else f"{r['build_seconds']:.0f}",
                      f"{r['recorded_at']:%Y-%m-%d %H:%M}")
    out.print(table)
    if not rows:
        typer.echo("no images recorded; build them with `matrun build`")


def _state_dir() -> Path:
    return matrun_home() / "engine"


@command(engine_app, "start")
def engine_start() -> None:
    """Start dockerd --bridge=none --iptables=false in its own session (needs root); PID recorded."""
    url = engine.engine_url()
    if engine.find_engine() is not None:
        typer.echo(f"a Docker engine already answers at {url}; nothing started")
        return
    if not url.startswith("unix://"):
        raise InputError(f"DOCKER_HOST is {url}: `matrun engine start` only starts an engine on a unix socket")
    started = engine.start_engine(state_dir=_state_dir(), socket=url[len("unix://"):])
    typer.echo(f"started dockerd (pid {started.pid}) at {url} in {started.seconds:.2f} s; log {started.log}")


@command(engine_app, "stop")
def engine_stop() -> None:
    """Stop the dockerd that `matrun engine start` started (that PID only)."""
    pid_file = _state_dir() / "dockerd.pid"
    if engine.stop_engine(pid_file):
        typer.echo("stopped the dockerd matrun started")
    else:
        typer.echo("no dockerd started by matrun is running; nothing stopped")


@command(engine_app, "status")
def engine_status() -> None:
    """Say whether a Docker engine answers, and its version."""
    url = engine.engine_url()
    client = engine.find_engine()
    if client is None:
        typer.echo(f"no Docker engine answers at {url}")
        raise typer.Exit(1)
    version = client.version()
    info = client.info()
    typer.echo(f"Docker engine {version.get('Version')} answers at {url}: storage {info.get('Driver')}, "
               f"cgroup v{info.get('CgroupVersion', '?')}, {info.get('NCPU')} CPUs, "
               f"GPU runtimes: {', '.join(r for r in (info.get('Runtimes') or {}) if 'nvidia' in r) or 'none'}")
