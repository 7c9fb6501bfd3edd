"""The cell parameters, declared once: every key of a cell's ``params`` with its check, its
default, its help text, whether it is part of the cell's identity and its allowed values.

Both sides read this module.  The host builds its registry from ``PARAMS``
(``runner/planning/params.py``) and checks every matrix.toml value with the same ``check``,
which also returns the value's canonical form; the harness checks ``spec.json`` key by key
with ``first_problem`` (``cell.load_spec``).  ``unused_keys`` is the one rule of which keys a
cell does not use: the host sets them to null (``runner/planning/matrix.py: canonical``) and
the harness accepts null for them.

Each check takes a raw value and returns the canonical value, or raises ``ParamError`` with
the words that follow the key path in the user's message, e.g. ``expected a positive
integer, got "big"``.  Standard library only, like the rest of the harness.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .cpusets import CPUSET, parse_cpuset
from .datasets import DATASETS, IDX_SHAPES, SYNTHETIC
from .models import (MODELS, TRANSFORMERS, is_language_model, is_transformer, sequence_problem, sequential_models,
                     vit_patches, walk)
from .text import SYNTHETIC_TEXT, TEXT_DATASETS

UNSET = "unset"  # threads / interop_threads: leave the framework's own default
DEVICES = ("cpu", "gpu")
MODES = ("train", "inference")
OPTIMIZERS = ("sgd", "adam", "adadelta", "rmsprop")
LAYOUTS = ("nchw", "nhwc")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
CONV_ALGOS = ("heuristic", "autotune")
PRESETS = ("none", "framework-default", "study-a")
FIRST_LAYER_BACKWARD = ("skip", "full")
INPUT_PIPELINES = ("preloaded", "loader")
SCALINGS = ("weak", "strong")
KVSTORES = ("device", "dist_sync", "dist_async")
#: ``compile``: the framework's own default, eager op-by-op execution, or a compiled graph
#: (docs/TRANSFORMERS.md "Compilation").  ``attention``: the default, an explicit softmax(QKᵀ)V, or
#: the framework's fused scaled-dot-product kernel.
DEFAULT = "default"
COMPILE_MODES = (DEFAULT, "eager", "compiled")
ATTENTIONS = (DEFAULT, "explicit", "fused")
MAX_SEQ_LEN = 1 << 20

MAX_THREADS = 1024
MAX_WORKERS = 256
MAX_NODES = 1024
MAX_LOADER_WORKERS = 256
DIST_KVSTORES = ("dist_sync", "dist_async")  # the parameter-server values (as distributed.py)
MIN_MEMORY_LIMIT = 6 * 1024**2  # the Docker engine refuses less than 6 MiB

# How spec.json carries a parameter (``Param.in_spec``).
REQUIRED = "required"  # always there; missing is an error
OPTIONAL = "optional"  # added after the first harness: absent, it means the default
HOST_ONLY = "host"  # a host-side setting (the executor enforces it); the harness ignores it

_VARIANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}\Z")
#: The variant of every framework that runs in the site's own Python (``python``), not in an
#: environment matrun builds (runner/environments/system.py; docs/IMAGES.md "The site's own Python").
SYSTEM_VARIANT = "system"
#: The longest ``python`` path (Linux's PATH_MAX).
MAX_INTERPRETER_BYTES = 4096
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MEMORY = re.compile(r"^([0-9]{1,15})([kmg]?)b?\Z", re.I)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


class ParamError(ValueError):
    """A value failed its check; the message is the part after the key path."""


def show(value: Any) -> str:
    """A value as the user wrote it, for messages (strings quoted, JSON's true / false / null,
    long ones cut)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    else:
        text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- checks ------------------------------------------------------------------------------


def _describe_int(minimum: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")


def integer(minimum: int, maximum: int | None = None, what: str = "") -> Callable[[Any], int]:
    """An integer (not a boolean) from ``minimum`` to ``maximum``."""
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(f"expected {what or _describe_int(minimum)}, got {show(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f" at most {maximum:,}" if maximum is not None else ""
            raise ParamError(f"expected {what or _describe_int(minimum)}{bound}, got {show(value)}")
        return value

    return check


def number(minimum: float, maximum: float | None, *, open_min: bool, what: str) -> Callable[[Any], float]:
    """A finite number above (``open_min``) or from ``minimum``, below ``maximum``; as a float."""
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(f"expected {what}, got {show(value)}")
        v = float(value)
        too_low = v <= minimum if open_min else v < minimum
        too_high = maximum is not None and v >= maximum
        if too_low or too_high or v != v or v in (float("inf"), float("-inf")):
            raise ParamError(f"expected {what}, got {show(value)}")
        return v

    return check


@dataclass(frozen=True)
class Choice:
    """One of a closed list of strings (the check of ``Param.choices``)."""

    options: tuple[str, ...]

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.options:
            listed = ", ".join(f'"{o}"' for o in self.options)
            raise ParamError(f"expected one of {listed}, got {show(value)}")
        return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamError(f"expected true or false, got {show(value)}")
    return value


def text(value: Any) -> str:
    """Any string: the harness's check of ``framework``, whose choices each side knows (the
    host: images/<name>/framework.toml; the harness: its adapters)."""
    if not isinstance(value, str):
        raise ParamError(f"expected a string, got {show(value)}")
    return value


def threads(value: Any) -> int | str:
    if value == UNSET:
        return UNSET
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise ParamError(f'expected a thread count from 1 to {MAX_THREADS} or "unset", got {show(value)}')
    return value


def cpuset(value: Any) -> str:
    if not isinstance(value, str) or (value and not CPUSET.match(value)):
        raise ParamError(f'expected a CPU list such as "0-3,6" (or "" for no pinning), got {show(value)}')
    try:
        parse_cpuset(value)
    except ValueError as exc:  # a range that runs backwards
        raise ParamError(str(exc)) from None
    return value


def variant(value: Any) -> str:
    if not isinstance(value, str) or not _VARIANT.match(value):
        raise ParamError(f"expected a variant name of lower-case letters, digits, '.', '_' or '-', got {show(value)}")
    return value


#: A framework release as ``version`` names it: PEP 440's public versions without epochs or
#: local labels (``2.4.1``, ``0.4.30``, ``2.15.0.post1``, ``2.5.0rc1``).
RELEASE = re.compile(r"^[0-9]{1,4}(\.[0-9]{1,6}){0,3}((a|b|rc)[0-9]{1,4})?(\.post[0-9]{1,4})?(\.dev[0-9]{1,6})?\Z")


def release(value: Any) -> str:
    """``version``: a release of the cell's framework ("": the variant's own pins)."""
    if not isinstance(value, str):
        raise ParamError(f'expected a release of the framework as a string, such as "2.4.1", got {show(value)}')
    if value and not RELEASE.match(value):
        raise ParamError(f'expected a release such as "2.4.1" or "0.4.30" (digits and dots, optionally '
                         f'a1/b1/rc1, .post1, .dev1), got {show(value)}')
    return value


def interpreter(value: Any) -> str:
    """The site's own Python of a ``variant = "system"`` cell: the absolute path of an
    executable file, or "" (none: the variant's own environment).  A host-only key, so the
    harness never checks it; the host's check looks at the file too (it must exist now: the
    sweep probes it while planning)."""
    what = 'expected the absolute path of a Python interpreter, such as "/usr/bin/python3"'
    if not isinstance(value, str):
        raise ParamError(f"{what}, got {show(value)}")
    if value == "":
        return value
    if _CONTROL_CHARS.search(value):
        raise ParamError(f"{what}, without control characters, got {show(value)}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_INTERPRETER_BYTES:
        raise ParamError(f"{what}, of at most {MAX_INTERPRETER_BYTES:,} bytes, got {show(value)}")
    if not value.startswith("/"):
        raise ParamError(f"{what} (a relative path would depend on where matrun runs), got {show(value)}")
    path = f'"{value}"'  # in full: checked for control characters and length above
    try:
        info = os.stat(value)
    except FileNotFoundError:
        raise ParamError(f"{path}: no such file (expected the absolute path of a Python interpreter)") from None
    except (OSError, ValueError) as exc:
        raise ParamError(f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ParamError(f"{path} is a directory, not a Python interpreter (name its bin/python)")
    if not stat.S_ISREG(info.st_mode):
        raise ParamError(f"{path} is not a regular file, not a Python interpreter")
    if not os.access(value, os.X_OK):
        raise ParamError(f"{path} is not executable, not a Python interpreter")
    return value


def memory(value: Any) -> int:
    """Bytes, from an integer or a string such as "512m" / "2g" (binary units, as Docker's)."""
    if isinstance(value, bool):
        raise ParamError(f'expected a memory size such as "512m" or "2g" (0: no limit), got {show(value)}')
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and _MEMORY.match(value.strip()):
        digits, unit = _MEMORY.match(value.strip()).groups()  # type: ignore[union-attr]
        size = int(digits) * _UNITS[unit.lower()]
    else:
        raise ParamError(f'expected a memory size such as "512m" or "2g" (0: no limit), got {show(value)}')
    if size != 0 and not MIN_MEMORY_LIMIT <= size <= 2**50:
        raise ParamError(f"expected a memory limit from 6m to 1024t (0: no limit), got {show(value)}")
    return size


def shape(value: Any) -> list[int]:
    if (not isinstance(value, list) or len(value) != 3
            or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096 for v in value)):
        raise ParamError(f"expected [channels, height, width], three integers from 1 to 4096, got {show(value)}")
    return list(value)


# --- the parameters ----------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One cell parameter.

    ``check``: raw value -> canonical value, or ``ParamError``.  ``identity``: False for an
    execution setting that does not change what is measured (left out of the cell id).
    ``in_spec``: ``REQUIRED``, ``OPTIONAL`` or ``HOST_ONLY`` (how spec.json carries it).
    """

    name: str
    check: Callable[[Any], Any]
    default: Any
    help: str
    identity: bool = True
    in_spec: str = REQUIRED

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed values when they are a closed list, else ()."""
        return self.check.options if isinstance(self.check, Choice) else ()


# In the order the host lists them (matrix values, spec.json, ``matrun plan`` columns).
PARAMS: dict[str, Param] = {p.name: p for p in (
    # The host's default is the framework.toml that says ``default = true`` (the harness cannot
    # read images/; spec.json always names the framework).
    Param("framework", text, "", "framework adapter (runner/harness/adapters/<framework>.py)"),
    Param("variant", variant, "cpu", "environment variant of the framework (images/<framework>/requirements-<variant>.txt), "
                                     'or "system": the site\'s own Python, named by python'),
    Param("python", interpreter, "",
          'the site\'s own Python a variant = "system" cell runs in (an absolute path); its environment id '
          "comes from a probe of that interpreter, so the path itself is not part of the identity",
          identity=False, in_spec=HOST_ONLY),
    Param("version", release, "",
          'a release of the framework, e.g. "2.4.1": matrun builds one environment per release, its '
          'requirements resolved once and locked with hashes ("": the variant\'s own pins; docs/RELEASES.md)',
          in_spec=HOST_ONLY),
    Param("device", Choice(DEVICES), "cpu", "device the cell runs on"),
    Param("gpus", integer(1, 64), 1, "GPUs used by a gpu cell (single-host data parallel)"),
    Param("workers", integer(1, MAX_WORKERS), 1,
          "data-parallel worker processes on each host (each framework's own mechanism: "
          "docs/frameworks/<framework>.md): over CPU processes on the CPU, one GPU each on the GPU",
          in_spec=OPTIONAL),
    Param("nodes", integer(1, MAX_NODES), 1, "hosts of a multi-node cell (`workers` on each); > 1 runs only "
                                             'with the slurm executor and [slurm] runtime = "local"',
          in_spec=OPTIONAL),
    Param("scaling", Choice(SCALINGS), "weak",
          'weak: batch_size is per worker (the global batch grows with the workers); strong: batch_size '
          "is the global batch, split across the workers", in_spec=OPTIONAL),
    Param("kvstore", Choice(KVSTORES), "device",
          "gradient exchange of a framework with parameter servers (framework.toml [workers]): device "
          "(one process), dist_sync or dist_async (a parameter server on the cell's host); null for "
          "other frameworks", in_spec=OPTIONAL),
    Param("mode", Choice(MODES), "train", "train, or inference (forward passes only, timed per batch)"),
    Param("model", Choice(tuple(MODELS) + tuple(TRANSFORMERS)), "lenet5",
          "network (runner/harness/models.py): a CNN, or a transformer (gpt-*: token data; vit-*: images)"),
    Param("dataset", Choice(DATASETS + TEXT_DATASETS), "fashion-mnist",
          "dataset: images (fashion-mnist, mnist, cifar10, synthetic) or text for the gpt-* models "
          "(synthetic-text, fortunes)"),
    Param("synthetic_shape", shape, [1, 28, 28], "[C, H, W] of synthetic samples"),
    Param("synthetic_classes", integer(2, 100_000), 10, "classes of synthetic data"),
    Param("synthetic_train", integer(1, 10_000_000), 2048, "synthetic training samples"),
    Param("synthetic_test", integer(1, 10_000_000), 512, "synthetic test samples"),
    Param("synthetic_vocab", integer(2, 1 << 20), 256, "token vocabulary of synthetic-text",
          in_spec=OPTIONAL),
    Param("seq_len", integer(0, MAX_SEQ_LEN), 0,
          "tokens in a sequence of a gpt-* model (0: as many as the model has positions)", in_spec=OPTIONAL),
    Param("train_limit", integer(0), 0, "use only the first N training samples (0: all)"),
    Param("test_limit", integer(0), 0, "use only the first N test samples (0: all)"),
    Param("epochs", integer(1, 100_000), 1, "training epochs (ignored when iterations > 0)"),
    Param("iterations", integer(0, 100_000_000), 0, "train for exactly N optimizer steps (0: use epochs)"),
    Param("batch_size", integer(1, 1_048_576), 64, "training batch size"),
    Param("eval_batch_size", integer(1, 1_048_576), 1000, "evaluation batch size"),
    Param("optimizer", Choice(OPTIMIZERS), "sgd", "optimizer"),
    Param("lr", number(0.0, None, open_min=True, what="a positive learning rate"), 0.01, "learning rate"),
    Param("momentum", number(0.0, 1.0, open_min=False, what="a momentum in [0, 1)"), 0.9, "SGD momentum"),
    Param("weight_decay", number(0.0, None, open_min=False, what="a non-negative weight decay"), 0.0,
          "weight decay"),
    Param("warmup_steps", integer(0, 1_000_000), 5, "first steps recorded apart and excluded from throughput"),
    Param("threads", threads, UNSET, 'intra-op threads (framework switch and OMP/MKL/OpenBLAS variables), or "unset"'),
    Param("interop_threads", threads, UNSET, 'inter-op threads, or "unset"'),
    Param("cpuset", cpuset, "", 'CPUs the cell is pinned to, e.g. "0-1" ("" : no pinning)'),
    Param("memory_limit", memory, 0,
          'memory limit of the cell\'s container, e.g. "2g" (swap included; over it the run is oom); '
          "0: none.  Enforced by the docker executor", in_spec=HOST_ONLY),
    Param("onednn", boolean, True, "oneDNN (MKL-DNN) primitives on or off"),
    Param("layout", Choice(LAYOUTS), "nchw", "data layout of activations"),
    Param("precision", Choice(PRECISIONS), "fp32", "fp32, tf32, bf16 or fp16 (mixed precision)"),
    Param("conv_algo", Choice(CONV_ALGOS), "heuristic",
          "convolution algorithm choice on the GPU: heuristic, or autotune (exhaustive search)"),
    Param("compile", Choice(COMPILE_MODES), DEFAULT,
          "eager, or compiled (the framework's graph compiler: docs/TRANSFORMERS.md \"Compilation\"); "
          "default: the framework's own behaviour, recorded in force", in_spec=OPTIONAL),
    Param("attention", Choice(ATTENTIONS), DEFAULT,
          "a transformer's attention: explicit softmax(QKᵀ)V, or the framework's fused scaled-dot-product "
          "kernel; default: the framework's own choice, recorded in force", in_spec=OPTIONAL),
    Param("layer_profile", boolean, False, "also time every layer's forward and backward pass"),
    Param("preset", Choice(PRESETS), "none",
          "framework-default: the optimizer, learning rate, batch size and epochs of the "
          "framework's own official example for the dataset; study-a: the defaults study A's "
          "Tables II and III list (iterations where the example counted them; docs/PRESETS.md)"),
    Param("first_layer_backward", Choice(FIRST_LAYER_BACKWARD), "skip",
          "skip: the first layer's input gradient is not computed (autograd prunes it); full: "
          "computed at every training step too, as study E found one framework doing (docs/HARNESS.md)",
          in_spec=OPTIONAL),
    Param("validation", integer(0, 10_000_000), 0,
          "hold the last N training samples out as a validation split (not trained on), "
          "evaluated after every epoch (0: none)", in_spec=OPTIONAL),
    Param("early_stopping", integer(0, 100_000), 0,
          "patience in epochs: stop when validation accuracy has not improved for that many "
          "epochs (0: off; needs validation > 0 and an epoch-counted run)", in_spec=OPTIONAL),
    Param("input_pipeline", Choice(INPUT_PIPELINES), "preloaded",
          "preloaded: batches sliced from tensors already in memory; loader: the framework's "
          "data loader feeds each step, inside the step's clock (docs/HARNESS.md)", in_spec=OPTIONAL),
    Param("loader_workers", integer(0, MAX_LOADER_WORKERS), 0,
          'worker processes (threads for tf.data) of input_pipeline = "loader" (0: load in the '
          "training process)", in_spec=OPTIONAL),
    Param("seed", integer(0, 2**31 - 1), 0, "random seed"),
    Param("timeout", number(0.0, None, open_min=True, what="a positive number of seconds"), 1800.0,
          "seconds before the cell is killed and recorded as timeout", identity=False, in_spec=HOST_ONLY),
    Param("phase_sampling", integer(0, 1_000_000), 20,
          "time the phases (input, h2d, forward, backward, exchange, update) of every Nth timed "
          "step, kept out of the throughput (0: none; docs/MODEL.md)", identity=False, in_spec=OPTIONAL),
    Param("onednn_check", boolean, True,
          "count the oneDNN primitives that really execute (a short verbose run before the cell)",
          identity=False),
)}


# --- rules between keys ------------------------------------------------------------------

#: The knobs of the training loop: an inference cell keeps their defaults (``knob_problem``).
TRAINING_KNOBS = ("first_layer_backward", "validation", "early_stopping", "input_pipeline", "loader_workers")


def unused_keys(params: Mapping[str, Any], *, parameter_servers: bool | None = None,
                onednn: bool | None = None) -> set[str]:
    """The keys a cell does not use, given its other values (docs/BUNDLE.md): the host sets
    them to null, so that they leave the cell's identity, and the harness accepts null there.

    ``synthetic_*`` unless the dataset is synthetic; the optimizer's keys and ``epochs`` in
    inference; ``momentum`` for an optimizer other than SGD; ``epochs`` when ``iterations`` > 0;
    ``gpus`` on the CPU; ``kvstore`` for a framework without a parameter server.  (The
    training knobs keep their defaults where they do not apply: ``knob_problem``.)
    ``parameter_servers``: whether the cell's framework has them (framework.toml ``[workers]``,
    which the host reads); None in the cell, which cannot read it: there a null ``kvstore`` is
    the host's word that the framework has none.  ``onednn`` likewise: whether the framework
    has oneDNN at all (framework.toml ``onednn``); ``onednn`` is unused where it has none.
    """
    unused: set[str] = set()
    iterations = params.get("iterations")
    if isinstance(iterations, int) and not isinstance(iterations, bool) and iterations > 0:
        unused.add("epochs")
    if params.get("mode") == "inference":
        unused |= {"optimizer", "lr", "momentum", "weight_decay", "epochs"}
    elif params.get("optimizer") != "sgd":
        unused.add("momentum")
    if params.get("dataset") != SYNTHETIC:
        unused |= {"synthetic_shape", "synthetic_classes"}
        if params.get("dataset") != SYNTHETIC_TEXT:  # synthetic text counts its sequences with them
            unused |= {"synthetic_train", "synthetic_test"}
    if params.get("dataset") != SYNTHETIC_TEXT:
        unused.add("synthetic_vocab")
    if not is_language_model(str(params.get("model"))):
        unused.add("seq_len")
    if is_transformer(str(params.get("model"))):
        unused.add("layout")  # an image layout of CNN activations (``transformer_problem``)
    if params.get("device") == "cpu":
        unused.add("gpus")
    if not parameter_servers if parameter_servers is not None else params.get("kvstore") is None:
        unused.add("kvstore")
    if not onednn if onednn is not None else params.get("onednn", True) is None:
        unused.add("onednn")
    return unused


def first_problem(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first key of spec.json's ``params`` that fails its check, with the problem, or None.

    Every ``REQUIRED`` key must be there; an ``OPTIONAL`` one is checked when present; null
    passes for an unused key (``unused_keys``); ``HOST_ONLY`` keys and keys this harness does
    not know are ignored.  The values are checked, not changed.
    """
    unused = unused_keys(params)
    ordered = sorted((p for p in PARAMS.values() if p.in_spec != HOST_ONLY), key=lambda p: p.in_spec == OPTIONAL)
    for param in ordered:
        if param.name not in params:
            if param.in_spec == REQUIRED:
                return param.name, "is missing"
            continue
        value = params[param.name]
        if value is None and param.name in unused:
            continue
        try:
            param.check(value)
        except ParamError as exc:
            return param.name, str(exc)
    return None


def input_shape(params: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The (C, H, W) the cell's dataset will have, or None when it is not known before loading."""
    if params["dataset"] == SYNTHETIC:
        return tuple(params["synthetic_shape"])  # type: ignore[return-value]
    return IDX_SHAPES.get(params["dataset"])


def model_problem(params: Mapping[str, Any]) -> str | None:
    """``"[params -> key] ..."`` when the model cannot take the dataset's input size, else None."""
    found = transformer_problem(params)
    if found:
        return f"[params -> {found[0]}] {found[1]}"
    if is_transformer(params["model"]):
        return None
    size = input_shape(params)
    if size is None:
        return None
    try:
        for _ in walk(params["model"], size, 2):
            pass
    except ValueError as exc:
        key = "synthetic_shape" if params["dataset"] == SYNTHETIC else "model"
        return f"[params -> {key}] {exc}"
    return None


def transformer_problem(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """What does not fit between the model, the dataset and the transformer keys, as (key, the
    words after it), or None: a language model needs token data and images need a CNN or a ViT;
    a sequence longer than the model's positions, a vocabulary larger than its embedding, a ViT
    patch that does not divide the image; ``layout`` (an image layout), ``first_layer_backward``
    and the data loader are not for transformers (yet: docs/TRANSFORMERS.md);
    ``attention`` needs a transformer."""
    model, dataset = params["model"], params["dataset"]
    text = dataset in TEXT_DATASETS
    if is_language_model(model) != text:
        if text:
            return ("dataset", f"{dataset} is token data, for the gpt-* models; {model} takes images")
        return ("dataset", f"{model} is a language model: it needs token data (synthetic-text or fortunes), "
                           f"not {dataset}")
    if not is_transformer(model):
        if setting(params, "attention") != DEFAULT:
            return ("attention", f"{model} has no attention (a transformer's setting: gpt-*, vit-*)")
        return None
    if params.get("layout") not in (None, "nchw"):
        return ("layout", f"is an image layout of the CNNs' activations; {model} is a transformer (its "
                          "activations are tokens × width): leave layout out")
    if setting(params, "first_layer_backward") != "skip":
        return ("first_layer_backward", f"is a CNN setting; {model} has no first layer of that kind")
    if setting(params, "input_pipeline") != "preloaded":
        return ("input_pipeline", f"the data loader feeds the CNNs; {model} trains on preloaded batches")
    if is_language_model(model):
        seq_len = setting(params, "seq_len") or TRANSFORMERS[model].positions
        vocab = setting(params, "synthetic_vocab") if dataset == SYNTHETIC_TEXT else 256
        problem = sequence_problem(model, seq_len, vocab)
        if problem:
            return ("seq_len" if problem.startswith(model) else
                    "synthetic_vocab" if dataset == SYNTHETIC_TEXT else "model", problem)
        return None
    size = input_shape(params)
    if size is not None:
        try:
            vit_patches(model, size)
        except ValueError as exc:
            return ("synthetic_shape" if dataset == SYNTHETIC else "model", str(exc))
    return None


def layer_profile_problem(params: Mapping[str, Any]) -> str | None:
    """Why ``layer_profile`` cannot time the model's layers one by one (a network with residual
    blocks), as the words after the key, or None."""
    if params["layer_profile"] and not is_transformer(params["model"]) and params["model"] not in sequential_models():
        return (f"needs a sequential network ({', '.join(sequential_models())}) or a transformer, "
                f"not {params['model']}")
    return None


def interpreter_problem(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """``variant = "system"`` and ``python`` go together: (key, the words after it), or None.
    The host refuses the one without the other at plan time (``matrix.py: canonical``)."""
    system = params.get("variant") == SYSTEM_VARIANT
    if system and not params.get("python"):
        return ("python", 'is missing: a variant = "system" cell runs in the site\'s own Python, named by '
                          'python = "/absolute/path/to/python"')
    if params.get("python") and not system:
        return ("python", f'is only for variant = "system" (the site\'s own Python); variant '
                          f'{show(params.get("variant"))} runs in the environment matrun builds for it')
    return None


def setting(params: Mapping[str, Any], name: str) -> Any:
    """The value of an ``OPTIONAL`` key as the cell uses it: the default when spec.json leaves
    it out (a host older than the key) or nulls it (unused, ``unused_keys``)."""
    value = params.get(name)
    return PARAMS[name].default if value is None else value


def knob_problem(params: Mapping[str, Any]) -> tuple[str, str] | None:
    """The training knobs that cannot run as asked, as (key, the words after it), or None.

    An inference cell leaves every training knob (``TRAINING_KNOBS``) at its default;
    ``loader_workers`` needs ``input_pipeline = "loader"``; ``early_stopping`` needs a
    validation split, an epoch-counted run (``iterations`` = 0) and one process (the stop
    decision is rank 0's alone: other workers would wait for it in their next exchange);
    ``validation`` must leave training samples, where the training split's size is known
    before loading (``train_limit`` > 0, or synthetic data).  The host refuses these at plan
    time (``runner/planning/matrix.py: canonical``) and ``load_spec`` refuses them in the cell.
    """
    if params.get("mode") == "inference":
        for name in TRAINING_KNOBS:
            if setting(params, name) != PARAMS[name].default:
                return (name, f"is a training setting: an inference cell leaves it at its default "
                              f"({show(PARAMS[name].default)}), not {show(params[name])}")
        return None
    if setting(params, "loader_workers") and setting(params, "input_pipeline") != "loader":
        return ("loader_workers", f"needs input_pipeline = \"loader\" (the workers of a data loader), "
                                  f"not {show(setting(params, 'input_pipeline'))}")
    patience = setting(params, "early_stopping")
    validation = setting(params, "validation")
    if patience:
        if not validation:
            return ("early_stopping", "needs validation > 0: it watches the accuracy on held-out "
                                      "training samples")
        iterations = params.get("iterations")
        if isinstance(iterations, int) and iterations > 0:
            return ("early_stopping", f"counts epochs: it needs iterations = 0 (an epoch-counted run), "
                                      f"not iterations = {iterations}")
        world = int(params.get("workers") or 1) * int(params.get("nodes") or 1)
        if world > 1 or params.get("kvstore") in DIST_KVSTORES:
            return ("early_stopping", "needs one process (workers = 1, nodes = 1, kvstore = \"device\"): "
                                      "the workers of a multi-worker cell cannot stop together")
    if validation:
        known = params.get("train_limit") or 0
        if params.get("dataset") == SYNTHETIC and isinstance(params.get("synthetic_train"), int):
            known = min(known, params["synthetic_train"]) if known else params["synthetic_train"]
        if known and validation >= known:
            return ("validation", f"must be smaller than the training split ({known:,} samples), got {validation:,}")
    return None
