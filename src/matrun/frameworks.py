"""What the host knows about each framework, read from ``images/<name>/framework.toml``.

A framework is one harness adapter module plus one ``images/<name>/`` folder holding its
pinned requirements and this description: the import check used after an environment build,
the environment variables that carry thread and oneDNN settings into the cell (they must be
set before the framework starts), and the combinations it cannot run (refused at plan time).
Format: docs/FRAMEWORKS.md.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from matrun.errors import InputError
from matrun.runner.harness import UNSET



@dataclass(frozen=True)
class Unsupported:
    when: Mapping[str, Any]
    reason: str

    def matches(self, params: Mapping[str, Any]) -> bool:
        return all(params.get(k) == v for k, v in self.when.items())


PROMISE_KEYS = ("framework_version", "python", "cuda", "cudnn", "blas", "onednn", "openmp")


@dataclass(frozen=True)
class Variant:
    """How one variant of a framework is built (``[variants.<name>]`` of framework.toml).

    ``requirements``: the pip pins of the variant (the local executor's virtual environment
    and the image), or None for an image-only variant (e.g. Debian's python3-torch).
    ``promises``: what the probe must find in the built image (``runner/environments/images.py``
    ``broken_promises``), per oneDNN setting when ``promises_onednn_off`` is given.
    """

    name: str
    dockerfile: str
    requirements: str | None
    build_args: Mapping[str, str] = field(default_factory=dict)
    base_image: str | None = None  # the Dockerfile's own default when None
    device: str = "cpu"
    promises: Mapping[str, str] = field(default_factory=dict)
    promises_onednn_off: Mapping[str, str] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class Framework:
    name: str
    adapter: str
    import_check: str
    thread_vars: tuple[str, ...] = ()
    interop_vars: tuple[str, ...] = ()
    onednn_vars: tuple[str, ...] = ()
    fixed_env: Mapping[str, str] = field(default_factory=dict)
    unsupported: tuple[Unsupported, ...] = ()
    variants: Mapping[str, Variant] = field(default_factory=dict)

    def variant(self, name: str) -> Variant:
        try:
            return self.variants[name]
        except KeyError:
            raise InputError(f"framework {self.name} has no variant {name!r}; known: "
                             f"{', '.join(self.variants) or 'none'} (images/{self.name}/framework.toml)") from None

    def environment(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Variables that carry these parameters into the cell (besides ``fixed_env``)."""
        env: dict[str, str] = {}
        if params["threads"] != UNSET:
            env.update({v: str(params["threads"]) for v in self.thread_vars})
        if params["interop_threads"] != UNSET:
            env.update({v: str(params["interop_threads"]) for v in self.interop_vars})
        env.update({v: "1" if params["onednn"] else "0" for v in self.onednn_vars})
        return env

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        for rule in self.unsupported:
            if rule.matches(params):
                return rule.reason
        return None


@functools.cache
def frameworks() -> dict[str, Framework]:
    """Every framework that has an ``images/<name>/framework.toml``, by name."""
    found: dict[str, Framework] = {}
    for folder in sorted(resources.files("matrun.images").iterdir(), key=lambda p: p.name):
        desc = folder / "framework.toml"
        if desc.is_file():
            fw = _parse(folder.name, tomllib.loads(desc.read_text(encoding="utf-8")))
            found[fw.name] = fw
    return found


def load_framework(folder: Path) -> Framework | None:
    """The framework described in ``folder/framework.toml`` (an images folder outside the
    package, e.g. a user's own), or None when the folder has no description."""
    desc = folder / "framework.toml"
    if not desc.is_file():
        return None
    try:
        doc = tomllib.loads(desc.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{desc}: not valid TOML: {exc}") from None
    return _parse(folder.name, doc)


def get_framework(name: str) -> Framework:
    try:
        return frameworks()[name]
    except KeyError:
        raise InputError(f"unknown framework {name!r}; known: {', '.join(frameworks())}") from None


def _parse(folder: str, doc: dict[str, Any]) -> Framework:
    env = doc.get("env", {})
    name = doc.get("name", folder)
    if name != folder:
        raise InputError(f"images/{folder}/framework.toml names framework {name!r}; it must be {folder!r}")
    return Framework(
        name=name,
        adapter=doc["adapter"],
        import_check=doc["import_check"],
        thread_vars=tuple(env.get("threads", ())),
        interop_vars=tuple(env.get("interop_threads", ())),
        onednn_vars=tuple(env.get("onednn", ())),
        fixed_env=dict(env.get("fixed", {})),
        unsupported=tuple(Unsupported(dict(r["when"]), r["reason"]) for r in doc.get("unsupported", ())),
        variants={k: _parse_variant(folder, k, v) for k, v in doc.get("variants", {}).items()},
    )


_VARIANT_KEYS = {"dockerfile", "requirements", "build_args", "base_image", "device", "promises",
                 "promises_onednn_off", "description"}


def _parse_variant(folder: str, name: str, doc: dict[str, Any]) -> Variant:
    where = f"images/{folder}/framework.toml [variants.{name}]"
    unknown = set(doc) - _VARIANT_KEYS
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("promises", "promises_onednn_off"):
        bad = set(doc.get(key, {})) - set(PROMISE_KEYS)
        if bad:
            raise InputError(f"{where}: {key} names {', '.join(sorted(bad))}, which the probe does not report "
                             f"(it reports {', '.join(PROMISE_KEYS)})")
    args = doc.get("build_args", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
        raise InputError(f"{where}: build_args must map names to strings")
    return Variant(
        name=name,
        dockerfile=doc.get("dockerfile", f"Dockerfile.{name}"),
        requirements=doc.get("requirements", f"requirements-{name}.txt") or None,
        build_args=dict(args),
        base_image=doc.get("base_image"),
        device=doc.get("device", "cpu"),
        promises={k: str(v) for k, v in doc.get("promises", {}).items()},
        promises_onednn_off={k: str(v) for k, v in doc.get("promises_onednn_off", {}).items()},
        description=doc.get("description", ""),
    )
