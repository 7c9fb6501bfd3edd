"""Framework environments for the local executor: one virtual environment per variant.

An environment is built from the pinned requirements in
``images/<framework>/requirements-<variant>.txt`` (the same pins the Docker images use).
Its identity (``env_id``) hashes those pins, the Python version and the harness protocol,
so changing any of them gives a new environment and re-runs the cells that used the old one
(``HARNESS_PROTOCOL`` is kept with the staged harness, in ``home.py``).

Environments live under ``$MATRUN_HOME/envs/<env_id>/`` (default ``~/.cache/matrun``);
a marker file written after a successful build and import check is what makes one usable,
so an interrupted build is rebuilt from scratch the next time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from matrun.errors import EnvironmentBuildError, InputError
from matrun.frameworks import get_framework, release_key
from matrun.runner.environments.home import HARNESS_PROTOCOL, matrun_home
from matrun.runner.environments.releases import lock_for, python_tag, requirements_of, split_variant

MARKER = ".matrun-env.json"


@dataclass(frozen=True)
class EnvSpec:
    framework: str
    variant: str
    requirements: str
    # pins for the isolated build environments of sdists (framework.toml build_constraints)
    build_constraints: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # the variant's cell variables (framework.toml env)
    # A cell's ``version`` (releases.py): ``requirements`` is then what the release asks for
    # ([releases] requires), which the id hashes, and ``lock`` what pip chose for it, resolved
    # when the environment is built (a recipe and its build, as an image's: docs/RELEASES.md)
    release: str = ""
    lock: str = ""

    @property
    def python_version(self) -> str:
        return python_tag()

    @property
    def env_id(self) -> str:
        text = f"{self.framework}\n{self.variant}\n{self.python_version}\n{HARNESS_PROTOCOL}\n{self.requirements}"
        if self.build_constraints:  # hashed only when given, so that no other environment's id moves
            text += "\nbuild_constraints " + " ".join(self.build_constraints)
        if self.env:  # the same: hashed only when the variant sets variables
            text += "".join(f"\nenv {name}={value}" for name, value in self.env)
        if self.release:  # a release's environment: its request is the requirements hashed above
            text += f"\nrelease {self.release}"
            digest = hashlib.sha256(text.encode()).hexdigest()
            return f"{self.framework}-{self.variant}-{self.release}-{digest[:12]}"
        digest = hashlib.sha256(text.encode()).hexdigest()
        return f"{self.framework}-{self.variant}-{digest[:12]}"


@dataclass(frozen=True)
class Env:
    spec: EnvSpec
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def env_spec(framework: str, variant: str, *, log=None) -> EnvSpec:
    """The pinned requirements of a framework variant (package data under ``images/``); for
    ``variant@version`` (a cell's ``version``, releases.py) what the release asks for (its lock
    is resolved by ``ensure_env``, not here: planning needs no package index)."""
    variant, release = split_variant(variant)
    var = get_framework(framework).variant(variant)
    if release:
        requested = requirements_of(framework, variant, release)
        return EnvSpec(framework, variant, "".join(f"{r}\n" for r in requested), var.build_constraints,
                       tuple(sorted(var.env.items())), release)
    if var.requirements is None:
        raise InputError(
            f"variant {variant} of {framework} is image-only ({var.description or var.dockerfile}): "
            f"the local executor has no environment for it; build it with `matrun build` and run it "
            f"with --executor docker")
    req = resources.files("matrun.images") / framework / var.requirements
    if not req.is_file():
        raise InputError(f"no environment {framework}:{variant}: images/{framework}/{var.requirements} "
                         f"does not exist")
    return EnvSpec(framework, variant, req.read_text(encoding="utf-8"), var.build_constraints,
                   tuple(sorted(var.env.items())))


def ensure_env(framework: str, variant: str, *, log=None) -> Env:
    """Return the environment, building it first if it is missing or half-built (a release's:
    also when its lock was resolved again since, ``matrun envs --relock``)."""
    spec = env_spec(framework, variant, log=log)
    if spec.release:
        spec = replace(spec, lock=lock_for(framework, spec.variant, spec.release, log=log).text)
    root = matrun_home() / "envs"
    root.mkdir(parents=True, exist_ok=True)
    env = Env(spec, root / spec.env_id)
    if _usable(env):
        return env
    with open(root / f".{spec.env_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another matrun may be building the same env
        if not _usable(env):
            failed = root / f"{spec.env_id}.failed"
            try:
                _build(env, log=log)
            except EnvironmentBuildError as exc:  # nothing half-built is used; the reason is kept
                shutil.rmtree(env.path, ignore_errors=True)
                failed.write_text(f"{exc}\n", encoding="utf-8")
                raise
            failed.unlink(missing_ok=True)
    return env


def _usable(env: Env) -> bool:
    """Built (its marker written after the import check) and, for a release, from its lock."""
    try:
        marker = json.loads((env.path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return not env.spec.release or (isinstance(marker, dict) and marker.get("lock") == env.spec.lock)


def built_env(framework: str, variant: str) -> tuple[Env, bool]:
    """The variant's environment and whether it is built (its marker written); nothing is
    built.  ``InputError`` as ``env_spec`` (an image-only variant, pins missing)."""
    spec = env_spec(framework, variant)
    env = Env(spec, matrun_home() / "envs" / spec.env_id)
    return env, (env.path / MARKER).is_file()


def _build(env: Env, *, log) -> None:
    if log:
        log(f"building environment {env.spec.env_id} at {env.path} (once; later sweeps reuse it)")
    shutil.rmtree(env.path, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(env.path)], "create the virtual environment", env)
    req = env.path / "requirements.txt"
    req.write_text(env.spec.lock or env.spec.requirements, encoding="utf-8")
    pip_env = None
    if env.spec.build_constraints:  # pip hands PIP_CONSTRAINT on to the builds of sdists
        constraints = env.path / "build-constraints.txt"
        constraints.write_text("".join(f"{c}\n" for c in env.spec.build_constraints), encoding="utf-8")
        pip_env = {**os.environ, "PIP_CONSTRAINT": str(constraints)}
    # A release is installed from its lock alone: every file by its hash, nothing resolved again
    locked = ["--no-deps", "--require-hashes", "--no-cache-dir"] if env.spec.release else []
    _run([str(env.python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
          "-q", *locked, "-r", str(req)], "install the pinned requirements", env, pip_env)
    check = get_framework(env.spec.framework).import_check
    version = _run([str(env.python), "-c", check], "import the framework", env).strip()
    marker = {"env_id": env.spec.env_id, "framework": env.spec.framework, "variant": env.spec.variant,
              "python": env.spec.python_version, "framework_version": version.splitlines()[-1] if version else ""}
    if env.spec.release:
        found = marker["framework_version"]
        if not _same_release(found, env.spec.release):
            raise EnvironmentBuildError(f"environment {env.spec.env_id}: the lock installed {env.spec.framework} "
                                        f"{found or '(no version)'}, not the release {env.spec.release}")
        marker["release"] = env.spec.release
        marker["lock"] = env.spec.lock
    (env.path / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _same_release(found: str, release: str) -> bool:
    """Whether the framework's own version string names the release (``2.4.1+cu121`` is
    2.4.1; TensorFlow 2.15.0.post1 says 2.15.0: a post-release changes no code)."""
    try:
        return release_key(found.split("+")[0])[:2] == release_key(release)[:2]
    except ValueError:
        return False


def _run(cmd: list[str], what: str, env: Env, environ: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environ)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise EnvironmentBuildError(f"environment {env.spec.env_id}: could not {what} "
                                    f"(exit {proc.returncode}):\n{tail}")
    return proc.stdout


def release_record(env_id: str) -> dict:
    """What a release environment (a cell's ``version``) was built from, as every run of it
    keeps it (``result.json`` ``release``: version, framework version, lock); {} for any other
    environment or none built here."""
    try:
        marker = json.loads((matrun_home() / "envs" / env_id / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(marker, dict) or not marker.get("lock"):
        return {}
    return {"version": marker.get("release"), "framework_version": marker.get("framework_version"),
            "lock": marker["lock"]}


def list_envs() -> list[dict[str, str]]:
    """The environments built under $MATRUN_HOME, from their markers."""
    root = matrun_home() / "envs"
    found = []
    for marker in sorted(root.glob(f"*/{MARKER}")) if root.is_dir() else []:
        try:
            info = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.append({**info, "path": str(marker.parent)})
    return found

