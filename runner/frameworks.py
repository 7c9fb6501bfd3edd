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
from typing import Any, Mapping

from matrun.errors import InputError
from matrun.runner.harness import UNSET



@dataclass(frozen=True)
class Unsupported:
    when: Mapping[str, Any]
    reason: str

    def matches(self, params: Mapping[str, Any]) -> bool:
        return all(params.get(k) == v for k, v in self.when.items())


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
    )
