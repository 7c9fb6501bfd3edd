"""What the host knows about each framework, read from ``images/<name>/framework.toml``.

A framework is a folder: ``images/<name>/`` (its Dockerfiles, pinned requirements and this
description), the in-cell adapter ``runner/harness/adapters/<name>.py`` and its notes
``docs/frameworks/<name>.md``.  Everything else matrun knows about a framework is data read
here: its display name, how each variant is built, the environment variables that carry the
thread and oneDNN settings into the cell (set before the framework starts), the combinations
it cannot run (refused at plan time), its own default settings, the hyper-parameters of its
official examples (``preset = "framework-default"``) and of the other presets
(``[presets-<name>.<family>]``, e.g. ``preset = "study-a"``), a BLAS built into it, and how the
processes of a multi-worker cell find each other.  The warehouse renders what its views need
into SQL macros (``matrun.warehouse.framework_sql``).  Format and every key:
docs/FRAMEWORKS.md.

The core layer: imports only the standard library, ``matrun.errors`` and the harness's
parameter declaration (the preset names).
"""

from __future__ import annotations

import functools
import json
import re
import string
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

from matrun.errors import InputError
from matrun.runner.harness import distributed
from matrun.runner.harness.models import is_transformer
from matrun.runner.harness.spec import PARAMS, PRESETS, RELEASE
from matrun.tomltext import TomlError, loads as toml_loads


@dataclass(frozen=True)
class Unsupported:
    """A refused combination: every ``when`` parameter has its value and every ``when_not``
    parameter has another value than the one given."""

    when: Mapping[str, Any]
    reason: str
    when_not: Mapping[str, Any] = field(default_factory=dict)
    # A version guard: the rule holds only for a cell whose ``version`` names a release older
    # than this one (a cell without ``version`` runs today's pins, newer than every guard).
    releases_before: str | None = None

    def matches(self, params: Mapping[str, Any]) -> bool:
        if self.releases_before is not None:
            version = params.get("version")
            if not version or release_key(str(version)) >= release_key(self.releases_before):
                return False
        return (all(params.get(k) == v for k, v in self.when.items())
                and all(params.get(k) != v for k, v in self.when_not.items()))


def release_key(version: str) -> tuple:
    """A sortable key of a release (``spec.RELEASE``'s grammar): ``2.4.1`` < ``2.5.0rc1`` <
    ``2.5.0`` < ``2.5.0.post1``; missing parts are zeros (``2.4`` == ``2.4.0``)."""
    m = re.match(r"^([0-9.]+?)(?:(a|b|rc)([0-9]+))?(?:\.post([0-9]+))?(?:\.dev([0-9]+))?\Z", version)
    if not m:
        raise ValueError(f"not a release: {version!r}")
    numbers = [int(p) for p in m.group(1).split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    pre = (0, "", 0) if m.group(2) is None else (-1, m.group(2), int(m.group(3)))
    dev = (1, 0) if m.group(5) is None else (0, int(m.group(5)))
    return (tuple(numbers), pre, int(m.group(4) or -1), dev)


@dataclass(frozen=True)
class Releases:
    """``[releases]``: how a cell's ``version`` becomes an environment (docs/RELEASES.md).

    ``package``: the project on the package index whose release ``version`` names.
    ``requires``: the top-level requirements of one release, ``{version}`` standing for it;
    pip resolves them once per release and the result is locked with hashes.
    ``extra``: (``releases_before``, requirements): added for releases older than that one
    (e.g. ``numpy<2`` for a torch built against NumPy 1).  ``variants``: the variants a
    release can be built for (their own pins stand for today's release)."""

    package: str
    requires: tuple[str, ...]
    variants: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    since: str | None = None  # the oldest release the adapter drives (older: refused with the reason)
    since_reason: str = ""

    def requirements(self, version: str) -> list[str]:
        out = [r.replace("{version}", version) for r in self.requires]
        for before, reqs in self.extra:
            if release_key(version) < release_key(before):
                out.extend(reqs)
        return out


#: What an ``[[unsupported]]`` rule may name beside the cell's parameters: facts derived from
#: them (``derived``), so that a rule can say "a transformer over several processes".
DERIVED_KEYS = ("model_family", "several_processes", "several_gpus")


def derived(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``DERIVED_KEYS`` of a cell: ``model_family`` "transformer" or "cnn" (the zoo's
    convolutional and dense models), ``several_processes`` (the cell runs as several worker
    processes, or with a parameter server: harness/distributed.py ``multi_process``) and
    ``several_gpus`` (a gpu cell on more than one GPU)."""
    return {"model_family": "transformer" if is_transformer(str(params.get("model"))) else "cnn",
            "several_processes": distributed.multi_process(params),
            "several_gpus": params.get("device") == "gpu" and int(params.get("gpus") or 1) > 1}


PROMISE_KEYS = ("framework_version", "python", "cuda", "cudnn", "blas", "onednn", "openmp")


@dataclass(frozen=True)
class Variant:
    """How one variant of a framework is built (``[variants.<name>]`` of framework.toml).

    ``requirements``: the pip pins of the variant (the local executor's virtual environment
    and the image), or None for an image-only variant (e.g. a distribution's own package).
    ``promises``: what the probe must find in the built image (``runner/environments/probes.py``),
    per oneDNN setting when ``promises_onednn_off`` is given.
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
    # Constraints pip applies to the isolated build environments of packages it builds from
    # source (``PIP_CONSTRAINT``; venv and image, the image gets them as the build argument
    # PIP_BUILD_CONSTRAINTS), e.g. ("setuptools<81",) for an sdist whose setup.py imports
    # pkg_resources, which the newest setuptools no longer has.
    build_constraints: tuple[str, ...] = ()
    # Variables every cell of this variant starts with (``[variants.<v>] env``), set over
    # ``[env] fixed`` and the host's: what tells the framework how this build runs (Theano:
    # ``THEANO_FLAGS=blas.ldflags=…``, the BLAS it links its compiled ops against).
    env: Mapping[str, str] = field(default_factory=dict)


#: Port slots of ``[workers] ports``, each host's ports in the order listed: ``rendezvous``
#: one port (node 0's is where the others meet: a TCP store, a scheduler), ``servers`` one
#: per parameter server, ``workers`` one per worker process of the host.
PORT_SLOTS = ("rendezvous", "servers", "workers")
#: Tables of ``[workers.env]``: ``all`` for every process of the cell, then one per role.
ENV_ROLES = ("all", "scheduler", "server", "worker")
#: What an environment template may name (docs/FRAMEWORKS.md "Multi-worker cells").
PLACEHOLDERS = ("rank", "local_rank", "world", "local_world", "node_rank", "addr", "iface",
                "rendezvous_addr", "rendezvous_port", "port", "servers", "worker_addresses")
_PORT_OF_ROLE = {"worker": "workers", "server": "servers", "scheduler": "rendezvous"}


@dataclass(frozen=True)
class Workers:
    """How the processes of a multi-worker cell find each other (``[workers]``).

    ``ports``: the port slots each host's processes listen on (``PORT_SLOTS``), in order.
    ``parameter_servers``: with a ``dist_*`` kvstore, node 0 runs a scheduler and this many
    server processes before the workers (0: the workers alone).
    ``binds_every_interface``: why the framework's servers need a private network namespace
    under the local executor (they listen on every interface), or None.
    ``server_code``: the Python source the scheduler and server processes run (``python -c``;
    required with parameter servers, e.g. ``import mxnet``, whose import runs the role).
    ``env``: per ``ENV_ROLES`` table, variable -> template: a ``str.format`` string over
    ``PLACEHOLDERS``, or ``{"json": value}`` whose strings are templates (one that is exactly
    ``"{name}"`` takes the value itself: a number, a list), written as compact JSON.
    """

    ports: tuple[str, ...] = ()
    parameter_servers: int = 0
    binds_every_interface: str | None = None
    env: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    server_code: str = ""

    def ports_needed(self, local: int) -> int:
        """Ports each host of a cell with ``local`` workers per host listens on."""
        return sum(self._slot_size(slot, local) for slot in self.ports)

    def port(self, ports: list[int], slot: str, index: int, local: int) -> int | None:
        """The ``index``-th port of ``slot`` in one host's ``ports``, or None without that slot."""
        offset = 0
        for name in self.ports:
            if name == slot:
                return ports[offset + index]
            offset += self._slot_size(name, local)
        return None

    def _slot_size(self, slot: str, local: int) -> int:
        return {"rendezvous": 1, "servers": self.parameter_servers, "workers": local}[slot]

    def environment(self, role: str, values: Mapping[str, Any]) -> dict[str, str]:
        """The variables of one process of ``role``: ``env.all`` then ``env.<role>``, with
        ``values`` (``PLACEHOLDERS`` -> value) filled in."""
        text = {k: ",".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in values.items()}
        out: dict[str, str] = {}
        for table in (self.env.get("all", {}), self.env.get(role, {})):
            for name, template in table.items():
                if isinstance(template, str):
                    out[name] = template.format_map(text)
                else:
                    out[name] = json.dumps(_fill(template["json"], values, text), separators=(",", ":"))
        return out


def _fill(value: Any, values: Mapping[str, Any], text: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        names = _placeholders(value)
        if len(names) == 1 and value == "{" + names[0] + "}":
            return values[names[0]]
        return value.format_map(text)
    if isinstance(value, list):
        return [_fill(v, values, text) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, values, text) for k, v in value.items()}
    return value


def _placeholders(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


@dataclass(frozen=True)
class Framework:
    """One framework: ``images/<name>/framework.toml``, read and checked.

    ``host_prefixes``: prefixes of the variables the framework reads (a host's own are dropped).
    ``presets``: dataset family -> the parameters of the framework's official example
    (``preset = "framework-default"``).  ``named_presets``: the other presets, preset name ->
    dataset family -> parameters (``[presets-<name>.<family>]``; ``preset_for`` reads both).
    ``defaults``: parameter -> the value that is the framework's own behaviour when told
    nothing (``layout``; ``conv_algo`` on the GPU).  ``default``: the framework of a cell
    that names none (exactly one framework says so).  ``builtin_blas``: the BLAS the probe
    reports when no BLAS library is loaded (the framework's dense kernels are its own).
    """

    name: str
    import_check: str
    display_name: str = ""
    thread_vars: tuple[str, ...] = ()
    interop_vars: tuple[str, ...] = ()
    onednn_vars: tuple[str, ...] = ()
    fixed_env: Mapping[str, str] = field(default_factory=dict)
    host_prefixes: tuple[str, ...] = ()
    unsupported: tuple[Unsupported, ...] = ()
    variants: Mapping[str, Variant] = field(default_factory=dict)
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    named_presets: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)
    builtin_blas: str | None = None
    workers: Workers = field(default_factory=Workers)
    default: bool = False
    # False: the framework has no oneDNN at all (Theano, Chainer): a cell's ``onednn`` does not
    # apply and the host nulls it (``unused_keys``), as ``kvstore`` for a framework without
    # parameter servers
    onednn: bool = True
    # True: the framework compiles code when a cell starts that later cells can load (Theano's
    # C modules): the docker executor gives its cells a cache per image (``compile_cache``)
    compile_cache: bool = False
    # Whether the adapter builds the transformers (models.TRANSFORMERS); a framework without
    # them refuses a gpt-* / vit-* cell at plan time with ``transformers_reason``
    transformers: bool = False
    transformers_reason: str = ""
    # Whether ``layer_profile`` times a transformer's units (its adapter's ``layer_ops``)
    transformer_layer_profile: bool = False
    # ``[releases]``: how a cell's ``version`` is built (None: the framework has one release here)
    releases: Releases | None = None
    releases_reason: str = ""  # why it has none (shown when a cell names a version)

    def preset_for(self, preset: str, family: str) -> Mapping[str, Any] | None:
        """The parameters ``preset`` gives this framework for a dataset family, or None."""
        tables = self.presets if preset == DEFAULT_PRESET else self.named_presets.get(preset, {})
        return tables.get(family)

    def variant(self, name: str) -> Variant:
        try:
            return self.variants[name]
        except KeyError:
            raise InputError(f"framework {self.name} has no variant {name!r}; known: "
                             f"{', '.join(self.variants) or 'none'} (images/{self.name}/framework.toml)") from None

    def environment(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Variables that carry these parameters into the cell (besides ``fixed_env``), and the
        cell's variant's own ``env``.  A thread count is an integer; "unset" (anything else)
        sets nothing."""
        env: dict[str, str] = {}
        if _count(params["threads"]):
            env.update({v: str(params["threads"]) for v in self.thread_vars})
        if _count(params["interop_threads"]):
            env.update({v: str(params["interop_threads"]) for v in self.interop_vars})
        env.update({v: "1" if params["onednn"] else "0" for v in self.onednn_vars})
        variant = self.variants.get(params.get("variant", ""))
        if variant is not None:
            env.update(variant.env)  # the variant's own variables (``[variants.<v>] env``) win
        return env

    def refusal(self, params: Mapping[str, Any]) -> str | None:
        """The reason of the first ``[[unsupported]]`` rule the cell matches (its parameters
        and their ``derived`` facts), or None."""
        if not self.unsupported:
            return None
        facts = {**params, **derived(params)}
        for rule in self.unsupported:
            if rule.matches(facts):
                return rule.reason
        return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def frameworks() -> dict[str, Framework]:
    """Every framework that has an ``images/<name>/framework.toml``, by name."""
    found: dict[str, Framework] = {}
    for folder in sorted(resources.files("matrun.images").iterdir(), key=lambda p: p.name):
        desc = folder / "framework.toml"
        if desc.is_file():
            fw = _parse(folder.name, _load(desc.read_text(encoding="utf-8"), f"images/{folder.name}/framework.toml"))
            found[fw.name] = fw
    return found


def load_framework(folder: Path) -> Framework | None:
    """The framework described in ``folder/framework.toml`` (an images folder outside the
    package, e.g. a user's own), or None when the folder has no description."""
    desc = folder / "framework.toml"
    if not desc.is_file():
        return None
    return _parse(folder.name, _load(desc.read_text(encoding="utf-8"), str(desc)))


def get_framework(name: str) -> Framework:
    try:
        return frameworks()[name]
    except KeyError:
        raise InputError(f"unknown framework {name!r}; known: {', '.join(frameworks())}") from None


def host_env_prefixes() -> tuple[str, ...]:
    """Prefixes of the variables some framework reads (``[env] host_prefixes``): a host's own
    are never passed into a cell, whose environment is only what matrun sets."""
    return tuple(sorted({p for fw in frameworks().values() for p in fw.host_prefixes}))


def default_framework() -> str:
    """The framework of a cell that names none: the one whose framework.toml says
    ``default = true``."""
    chosen = [fw.name for fw in frameworks().values() if fw.default]
    if len(chosen) != 1:
        raise InputError(f"exactly one images/*/framework.toml must say default = true; "
                         f"{', '.join(chosen) or 'none'} do")
    return chosen[0]


def parameter_server_frameworks() -> tuple[str, ...]:
    """The frameworks whose gradient exchange the ``kvstore`` parameter chooses (their
    ``[workers] parameter_servers`` > 0)."""
    return tuple(fw.name for fw in frameworks().values() if fw.workers.parameter_servers)


def display_name(name: str) -> str:
    """How prose names a framework (its ``display_name``); an unknown one by its value."""
    fw = frameworks().get(name)
    return (fw.display_name or fw.name) if fw else name


# --- reading framework.toml --------------------------------------------------------------------

#: The preset whose tables are ``[presets.<family>]``; every other preset value P but "none"
#: has ``[presets-P.<family>]`` (docs/PRESETS.md).
DEFAULT_PRESET = "framework-default"
NAMED_PRESETS = tuple(p for p in PRESETS if p not in ("none", DEFAULT_PRESET))
_TOP_KEYS = ("name", "display_name", "default", "import_check", "builtin_blas", "onednn", "compile_cache", "transformers",
             "transformers_reason", "transformer_layer_profile", "env", "releases", "releases_reason",
             "unsupported",
             "defaults",
             "presets", *(f"presets-{p}" for p in NAMED_PRESETS), "workers", "variants")
_ENV_KEYS = ("threads", "interop_threads", "onednn", "fixed", "host_prefixes")
_DEFAULT_KEYS = ("layout", "conv_algo")
_WORKER_KEYS = ("ports", "parameter_servers", "server_code", "binds_every_interface", "env")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a variable name (``[variants.<v>] env``)
# A pip constraint of ``[variants.<v>] build_constraints``: a project and its version clauses.
_VERSION_CLAUSE = r"(?:===|[<>=!~]=|[<>])[^\s,;<>=!~]+"
_CONSTRAINT = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]*{_VERSION_CLAUSE}(?:,{_VERSION_CLAUSE})*\Z")
_VARIANT_KEYS = ("dockerfile", "requirements", "build_args", "base_image", "device", "promises",
                 "promises_onednn_off", "description", "build_constraints", "env")


def _load(text: str, where: str) -> dict[str, Any]:
    try:
        return toml_loads(text)
    except TomlError as exc:
        raise InputError(f"{where}: not valid TOML: {exc}") from None


def _table(where: str, doc: Any, what: str = "a table") -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected {what}, got {doc!r}")
    return doc


def _keys(where: str, doc: Any, allowed: Iterable[str], what: str = "a table") -> dict[str, Any]:
    unknown = set(_table(where, doc, what)) - set(allowed)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    return doc


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _texts(where: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{where}: {key} must be a list of strings, got {value!r}")
    return tuple(value)


def _text_map(where: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InputError(f"{where}: {key} must map names to strings")
    return dict(value)


def _parse(folder: str, doc: dict[str, Any]) -> Framework:
    file = f"images/{folder}/framework.toml"
    _keys(file, doc, _TOP_KEYS)
    name = doc.get("name", folder)
    if name != folder:
        raise InputError(f"{file} names framework {name!r}; it must be {folder!r}")
    if "import_check" not in doc:
        raise InputError(f"{file}: import_check is missing (the line run after an environment build)")
    env = _keys(f"{file} [env]", doc.get("env", {}), _ENV_KEYS)
    builtin_blas = doc.get("builtin_blas")
    return Framework(
        name=name,
        display_name=_text(file, "display_name", doc.get("display_name", name)),
        default=_flag(file, "default", doc.get("default", False)),
        import_check=_text(file, "import_check", doc["import_check"]),
        thread_vars=_texts(f"{file} [env]", "threads", env.get("threads", [])),
        interop_vars=_texts(f"{file} [env]", "interop_threads", env.get("interop_threads", [])),
        onednn_vars=_texts(f"{file} [env]", "onednn", env.get("onednn", [])),
        fixed_env=_text_map(f"{file} [env]", "fixed", env.get("fixed", {})),
        host_prefixes=_texts(f"{file} [env]", "host_prefixes", env.get("host_prefixes", [])),
        unsupported=_parse_unsupported(file, doc.get("unsupported", [])),
        variants={k: _parse_variant(folder, k, v) for k, v in _table(f"{file} [variants]", doc.get("variants", {})).items()},
        presets=_parse_presets(file, doc.get("presets", {})),
        named_presets={p: _parse_presets(file, doc[f"presets-{p}"], f"presets-{p}")
                       for p in NAMED_PRESETS if f"presets-{p}" in doc},
        defaults={k: _text(f"{file} [defaults]", k, v)
                  for k, v in _keys(f"{file} [defaults]", doc.get("defaults", {}), _DEFAULT_KEYS).items()},
        builtin_blas=None if builtin_blas is None else _text(file, "builtin_blas", builtin_blas),
        onednn=_flag(file, "onednn", doc.get("onednn", True)),
        compile_cache=_flag(file, "compile_cache", doc.get("compile_cache", False)),
        transformers=_flag(file, "transformers", doc.get("transformers", False)),
        transformers_reason=_text(file, "transformers_reason", doc.get("transformers_reason", "")),
        transformer_layer_profile=_flag(file, "transformer_layer_profile", doc.get("transformer_layer_profile", False)),
        workers=_parse_workers(file, doc.get("workers", {})),
        releases=_parse_releases(file, doc["releases"]) if "releases" in doc else None,
        releases_reason=_text(file, "releases_reason", doc.get("releases_reason", "")),
    )


_RELEASE_KEYS = ("package", "requires", "variants", "extra", "since", "since_reason")


def _release(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not RELEASE.match(value):
        raise InputError(f"{where}: {key} must be a release such as \"2.0\", got {value!r}")
    return value


def _parse_releases(file: str, doc: Any) -> Releases:
    where = f"{file} [releases]"
    _keys(where, doc, _RELEASE_KEYS)
    for key in ("package", "requires", "variants"):
        if key not in doc:
            raise InputError(f"{where}: {key} is missing")
    requires = _texts(where, "requires", doc["requires"])
    if not any("{version}" in r for r in requires):
        raise InputError(f"{where}: requires must name the release as {{version}} (e.g. \"package=={{version}}\")")
    extra = []
    if not isinstance(doc.get("extra", []), list):
        raise InputError(f"{where}: extra must be an array of tables ([[releases.extra]])")
    for n, item in enumerate(doc.get("extra", [])):
        w = f"{file} [[releases.extra]] {n + 1}"
        _keys(w, item, ("releases_before", "requires"))
        if "releases_before" not in item or "requires" not in item:
            raise InputError(f"{w}: needs releases_before = \"…\" and requires = [\"…\"]")
        extra.append((_release(w, "releases_before", item["releases_before"]), _texts(w, "requires", item["requires"])))
    since = doc.get("since")
    return Releases(package=_text(where, "package", doc["package"]), requires=requires,
                    variants=_texts(where, "variants", doc["variants"]), extra=tuple(extra),
                    since=None if since is None else _release(where, "since", since),
                    since_reason=_text(where, "since_reason", doc.get("since_reason", "")))


def _flag(file: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{file}: {key} must be true or false, got {value!r}")
    return value


def _parse_unsupported(file: str, rules: Any) -> tuple[Unsupported, ...]:
    if not isinstance(rules, list):
        raise InputError(f"{file}: unsupported must be an array of tables ([[unsupported]])")
    out = []
    for n, rule in enumerate(rules):
        where = f"{file} [[unsupported]] {n + 1}"
        _keys(where, rule, ("when", "when_not", "reason", "releases_before"))
        when, when_not = rule.get("when", {}), rule.get("when_not", {})
        before = rule.get("releases_before")
        if before is not None:
            _release(where, "releases_before", before)
        if (not isinstance(when, dict) or not isinstance(when_not, dict) or not (when or when_not or before)
                or "reason" not in rule):
            raise InputError(f"{where}: needs when = {{ parameter = value, … }} (and/or when_not = {{ … }}) "
                             "and reason = \"…\"")
        unknown = sorted(k for k in (*when, *when_not) if k not in PARAMS and k not in DERIVED_KEYS)
        if unknown:
            raise InputError(f"{where}: {', '.join(unknown)} is neither a cell parameter nor one of "
                             f"{', '.join(DERIVED_KEYS)}")
        out.append(Unsupported(dict(when), _text(where, "reason", rule["reason"]), dict(when_not), before))
    return tuple(out)


def _parse_presets(file: str, doc: Any, table: str = "presets") -> dict[str, dict[str, Any]]:
    """``[<table>.<family>]``: parameter -> value (names and values are checked against the
    cell parameters by ``runner/planning/presets.py``, which applies them).  A preset sets at
    most one length, ``epochs`` or ``iterations``."""
    out = {}
    for family, values in _table(f"{file} [{table}]", doc).items():
        where = f"{file} [{table}.{family}]"
        if not isinstance(values, dict):
            raise InputError(f"{where}: expected a table of parameter values, got {values!r}")
        for key, value in values.items():
            if not isinstance(value, (str, int, float, bool)):
                raise InputError(f"{where}: {key} must be a string, a number or a boolean, got {value!r}")
        if "epochs" in values and "iterations" in values:
            raise InputError(f"{where}: sets both epochs and iterations; a preset gives one length")
        out[family] = dict(values)
    return out


def _parse_workers(file: str, doc: Any) -> Workers:
    where = f"{file} [workers]"
    _keys(where, doc, _WORKER_KEYS)
    ports = _texts(where, "ports", doc.get("ports", []))
    bad = [p for p in ports if p not in PORT_SLOTS]
    if bad or len(set(ports)) != len(ports):
        raise InputError(f"{where}: ports lists each of {', '.join(PORT_SLOTS)} at most once, got {list(ports)}")
    servers = doc.get("parameter_servers", 0)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
        raise InputError(f"{where}: parameter_servers must be a non-negative integer, got {servers!r}")
    if bool(servers) != ("servers" in ports) or (servers and "rendezvous" not in ports):
        raise InputError(f"{where}: parameter servers need the ports \"rendezvous\" (the scheduler) and "
                         "\"servers\", and those ports need parameter_servers > 0")
    reason = doc.get("binds_every_interface")
    code = _text(where, "server_code", doc.get("server_code", ""))
    if bool(servers) != bool(code.strip()):
        raise InputError(f"{where}: server_code (what the scheduler and servers run) is needed exactly "
                         "when parameter_servers > 0")
    env_doc = _keys(f"{file} [workers.env]", doc.get("env", {}), ENV_ROLES)
    roles = {"all", "worker"} | ({"scheduler", "server"} if servers else set())
    env: dict[str, dict[str, Any]] = {}
    for role, table in env_doc.items():
        at = f"{file} [workers.env.{role}]"
        if role not in roles:
            raise InputError(f"{at}: a framework without parameter servers has no {role} process")
        if not isinstance(table, dict):
            raise InputError(f"{at}: expected a table of variables, got {table!r}")
        for var, template in table.items():
            _check_template(at, var, template, role, ports)
        env[role] = dict(table)
    return Workers(ports=ports, parameter_servers=servers,
                   binds_every_interface=None if reason is None else _text(where, "binds_every_interface", reason),
                   env=env, server_code=code)


def _check_template(where: str, var: str, template: Any, role: str, ports: tuple[str, ...]) -> None:
    if isinstance(template, dict):
        _keys(f"{where} {var}", template, ("json",), 'a string or { json = … }')
        if "json" not in template:
            raise InputError(f"{where} {var}: expected a string or {{ json = … }}")
        strings = list(_strings(template["json"]))
    elif isinstance(template, str):
        strings = [template]
    else:
        raise InputError(f"{where}: {var} must be a string or {{ json = … }}, got {template!r}")
    needs = {"rendezvous_addr": "rendezvous", "rendezvous_port": "rendezvous", "worker_addresses": "workers",
             "port": _PORT_OF_ROLE.get(role)}
    for text in strings:
        try:
            fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(text)
                      if name is not None]
        except ValueError as exc:
            raise InputError(f"{where}: {var} is not a valid template ({exc}): {text!r}") from None
        for name, spec, conv in fields:
            if name not in PLACEHOLDERS or spec or conv:
                raise InputError(f"{where}: {var} names {{{name}{'!' + conv if conv else ''}"
                                 f"{':' + spec if spec else ''}}}; a template may name "
                                 f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
            if name == "port" and role == "all":
                raise InputError(f"{where}: {var} names {{port}}, each role's own port: set it in "
                                 "[workers.env.<role>]")
            if needs.get(name) and needs[name] not in ports:
                raise InputError(f"{where}: {var} names {{{name}}}, which needs \"{needs[name]}\" in "
                                 "[workers] ports")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def _parse_variant(folder: str, name: str, doc: dict[str, Any]) -> Variant:
    where = f"images/{folder}/framework.toml [variants.{name}]"
    _keys(where, doc, _VARIANT_KEYS)
    for key in ("promises", "promises_onednn_off"):
        bad = set(doc.get(key, {})) - set(PROMISE_KEYS)
        if bad:
            raise InputError(f"{where}: {key} names {', '.join(sorted(bad))}, which the probe does not report "
                             f"(it reports {', '.join(PROMISE_KEYS)})")
    args = doc.get("build_args", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
        raise InputError(f"{where}: build_args must map names to strings")
    constraints = _texts(where, "build_constraints", doc.get("build_constraints", []))
    bad = [c for c in constraints if not _CONSTRAINT.match(c)]
    if bad:
        raise InputError(f"{where}: build_constraints are pip constraints, each a project name and its versions "
                         f"with no spaces (e.g. \"setuptools<81\"), got {bad!r}")
    if constraints and "PIP_BUILD_CONSTRAINTS" in args:
        raise InputError(f"{where}: build_args names PIP_BUILD_CONSTRAINTS, which build_constraints sets")
    env = _text_map(where, "env", doc.get("env", {}))
    bad_names = [k for k in env if not _ENV_NAME.match(k)]
    if bad_names:
        raise InputError(f"{where}: env names {', '.join(map(repr, bad_names))}, which are not variable names")
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
        build_constraints=constraints,
        env=env,
    )
