"""Theano adapter (framework ``theano``, Theano 1.0.5, CPU): every network of the model zoo
built from its layer list as a Theano graph, trained by one compiled ``theano.function`` per
step, timed per call.

Theano is imported lazily, in ``configure``, once its flags are in ``THEANO_FLAGS``: Theano
reads them while it is imported (docs/frameworks/theano.md).

- ``blas.ldflags``: how Theano links the C code of its BLAS ops (Gemm, Dot22, the im2col +
  GEMM convolutions CorrMM*): the variant's ``env`` sets it (framework.toml; ``cpu``: empty,
  i.e. numpy's C API and numpy's bundled OpenBLAS; ``cpu-openblas``: ``-lopenblas``; the
  other Debian variants ``-lblas`` through Debian's alternatives).  Theano 1.0.5 cannot
  compute its own default with numpy >= 1.22, so a harness started by hand without the flag
  gets it empty here.
- ``threads`` = N: ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` /
  ``BLIS_NUM_THREADS`` = N (the host sets them too): the threads of the BLAS Theano's ops
  call, what study A varied (OPENBLAS_NUM_THREADS).  Theano's own OpenMP stays at its 1.0.5
  default, off, in every variant (docs/frameworks/theano.md: with a BLAS library it can be
  faster at 2 threads, with OpenBLAS's own threads it oversubscribes the CPUs, and with
  ``blas.ldflags`` empty it aborts: CorrMM's OpenMP loop would call numpy's C-API gemm from
  threads without the GIL, so ``openmp=True`` is turned off there, ``NO_OPENMP``).
  ``"unset"``: the BLAS's own thread count.
- ``floatX=float32`` (the only precision: fp16 / bf16 / tf32 are refused).
- ``base_compiledir``: where Theano compiles and caches its C modules.  It must be writable
  and allow executing what is written there (Theano loads the modules it compiled): the
  first of ``$MATRUN_COMPILE_CACHE`` (the docker executor mounts one per image there, the
  cells of an image share it), ``<tempdir>/matrun-theano-<uid>`` (a cache the cells of a
  host share), the
  working directory's ``.matrun-theano`` (a container's /tmp is ``noexec``: there the run
  directory, removed when the process ends) and the parent process's (the oneDNN check's
  short run, whose own directory is under /tmp, compiles into the cell's, which it warms).
  A ``base_compiledir`` already in ``THEANO_FLAGS`` wins.

Timing: Theano runs on the CPU synchronously, so each step is t0 → the compiled step
function (forward, backward, update; loss and correct count added to shared accumulators
inside it) → t1.  The function is compiled before the first step (its compilation is in
``time_to_first_step``, not in any step), and it serves every batch size.  A sampled step
(``phase_sampling``) reads the clock after a loader's fetch (``input``) and after the
function: one fused phase, ``forward+backward+update`` (``STEP_PHASE``); no device wait.

Fidelity to the framework-neutral definitions: weights and biases start uniform in
±1/sqrt(fan_in) (PyTorch's default) from ``numpy.random.RandomState(seed)``; convolutions
are cross-correlations (``filter_flip=False``) with symmetric zero padding; max pooling
ignores the padding (Theano's Pool excludes it for ``max``); BatchNorm uses the batch's
statistics in training and running averages with momentum 0.1 (PyTorch's; the running
variance unbiased, as PyTorch's) and eps 1e-5 (float32's next value above it: Theano refuses
float32(1e-5), which is just below 1e-5); dropout is ``MRG_RandomStreams`` (seeded)
inverted dropout; ``weight_decay`` is coupled L2 (added to the gradient) as in PyTorch;
optimizer constants follow PyTorch (SGD momentum ``v = μv + g; p -= lr·v``, Adam eps 1e-8,
Adadelta rho 0.9 eps 1e-6, RMSprop alpha 0.99 eps 1e-8 outside the square root).
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import HarnessError
from .. import distributed
from ..datasets import Dataset, Split, prefetched
from ..events import EventLog, StepSample
from ..layers import LayerOp, LayerOps
from ..models import MODELS as ZOO
from ..models import block_layers, forward_flops
from ..phases import StepClock
from ..spec import model_problem, setting
from . import TrainOutcome

NAME = "theano"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
COMPILE_DIR = ".matrun-theano"  # in a working directory, when no shared one can be used
CACHE_VARIABLE = "MATRUN_COMPILE_CACHE"  # a compile cache the executor mounted (docker: one per image)
BN_MOMENTUM = 0.1  # PyTorch's (Theano: running_average_factor)
BN_EPS = 1e-5  # given to Theano as float32's next value above it (_bn_eps)
#: Why Theano's OpenMP stays off without a BLAS library: CorrMM's OpenMP loop would call the
#: numpy C-API gemm (``PyArray_MatrixProduct2``) from threads that do not hold the GIL.
NO_OPENMP = ("THEANO_FLAGS asked openmp=True, set False: with blas.ldflags empty Theano's CorrMM would call numpy's "
             "C-API gemm from OpenMP threads without the GIL (\"Fatal Python error: PyEval_SaveThread\")")

# Imported by configure(), after THEANO_FLAGS is set.
theano: Any = None
T: Any = None
np: Any = None
_STATE: dict[str, Any] = {}  # what configure did: the flags, the compile directory


# --- the protocol ----------------------------------------------------------------------


def check(params: dict[str, Any]) -> str | None:
    """What Theano cannot run (the host refuses the same through framework.toml)."""
    model = params["model"]
    if model not in ZOO:
        return f"[params -> model] unknown model {model!r} for theano (known: {', '.join(ZOO)})"
    if setting(params, "compile") == "eager":
        return "[params -> compile] Theano compiles every graph into C (theano.function): it has no eager mode"
    if params["device"] != "cpu":
        return ("[params -> device] this Theano has no GPU back end (libgpuarray / pygpu are not part of it): "
                "cpu only")
    if params["layout"] != "nchw":
        return "[params -> layout] Theano's conv2d and pool_2d take NCHW tensors only"
    if params["precision"] != "fp32":
        return (f"[params -> precision] {params['precision']} is not supported by Theano 1.0.5 on the CPU "
                "(its C convolutions and BLAS ops compute in float32 / float64): fp32 only")
    if params["interop_threads"] != "unset":
        return "[params -> interop_threads] Theano runs a function's ops one after another: there is no inter-op pool"
    if int(params.get("workers") or 1) * int(params.get("nodes") or 1) > 1:
        return "[params -> workers] Theano has no multi-process training of its own: one process only"
    return model_problem(params)  # the input too small for the model (load_spec checks it too)


def configure(params: dict[str, Any]) -> None:
    """Thread variables, then THEANO_FLAGS (floatX, compile directory, blas.ldflags if absent,
    OpenMP off where it cannot run), then the import."""
    global theano, T, np
    env = os.environ
    threads = params["threads"]
    if _count(threads):  # the host has set them (a variant's env may hold one apart); a harness started by hand
        for var in THREAD_VARIABLES:
            env.setdefault(var, str(threads))
    given = _parse_flags(env.get("THEANO_FLAGS", ""))
    flags = [env.get("THEANO_FLAGS", "").strip(",")]
    notes = []
    if "blas.ldflags" not in given and "blas__ldflags" not in given:
        # Theano 1.0.5's own default reads numpy.distutils fields numpy >= 1.22 lacks
        flags.append("blas.ldflags=")
        notes.append("THEANO_FLAGS had no blas.ldflags (a harness started by hand): set empty (numpy's BLAS)")
    flags.append("floatX=float32")
    linked = bool(given.get("blas.ldflags", given.get("blas__ldflags", "")).strip())
    if not linked and given.get("openmp", "").strip().lower() in ("true", "1"):
        flags.append("openmp=False")  # Theano's own default; True would abort the process
        notes.append(NO_OPENMP)
    home, own = given.get("base_compiledir") or given.get("compiledir"), False
    if home is None:
        home, own = compile_home()
        flags.append(f"base_compiledir={home}")
        if own:  # the working directory's copy goes with the process that works there
            atexit.register(shutil.rmtree, home, True)
    env["THEANO_FLAGS"] = ",".join(f for f in flags if f)
    _STATE.update(flags=env["THEANO_FLAGS"], compile_home=home, compile_home_removed_at_exit=own, notes=notes)
    import numpy
    import theano as theano_module
    import theano.tensor as tensor

    theano, T, np = theano_module, tensor, numpy
    np.random.seed(params["seed"])


def probe(params: dict[str, Any]) -> dict[str, Any]:
    cfg = theano.config
    compiled = _load_blas()  # compile and run a dot product and a convolution: maps the BLAS they link
    pools = _threadpools()
    ldflags = cfg.blas.ldflags
    blas = _theano_blas(pools, ldflags)
    omp = next((p.get("num_threads") for p in pools if p.get("user_api") == "openmp"), None)
    openmp = bool(cfg.openmp)
    blas_threads = blas.get("num_threads") if blas else None
    if openmp:
        in_force_threads, source = omp, "Theano's OpenMP (openmp=True): libgomp's thread count (threadpoolctl)"
    elif blas_threads is not None:
        in_force_threads = blas_threads
        source = f"the BLAS Theano calls: {blas.get('filepath')} ({blas.get('threads_from') or 'threadpoolctl'})"
    elif blas and blas.get("serial"):
        in_force_threads, source = 1, f"the BLAS Theano calls is single-threaded ({blas.get('filepath')})"
    else:
        in_force_threads, source = None, "unknown: threadpoolctl sees no thread count for the BLAS Theano calls"
    in_force: dict[str, Any] = {
        "threads": in_force_threads,
        "threads_source": source,
        "openmp": openmp,
        "openmp_threads": omp,
        "blas_ldflags": ldflags,
        "blas": blas,
        "blas_threads": blas_threads,
        "interop_threads": None,
        "onednn": False,
        "onednn_available": False,
        "onednn_source": "Theano has no oneDNN: its convolutions are its own C code (CorrMM: im2col + the BLAS's gemm)",
        "device": cfg.device,
        "floatX": cfg.floatX,
        "layout": params["layout"],
        "compile": "compiled",  # theano.function: every graph is compiled (C)
        "precision": params["precision"],
        "linker": cfg.linker,
        "optimizer": cfg.optimizer,
        "allow_gc": bool(cfg.allow_gc),
        "cxx": cfg.cxx,
        "compiledir": cfg.compiledir,
        "compiled_in_c": compiled,
        "theano_flags": _STATE.get("flags"),
        "numpy_version": np.__version__,
        "scipy_version": _version("scipy"),
        "env": {var: os.environ.get(var) for var in THREAD_VARIABLES},
    }
    mismatches = []
    asked = params["threads"]
    if _count(asked) and in_force_threads is not None and in_force_threads != asked:
        mismatches.append(f"threads: asked {asked}, in force {in_force_threads}")
    if params["onednn"]:
        mismatches.append("onednn: asked true, but Theano has no oneDNN (nothing to turn on)")
    if params["device"] != "cpu":
        mismatches.append(f"device: asked {params['device']}, in force cpu (no GPU back end)")
    return {
        "framework_version": theano.__version__,
        "build": (f"theano {theano.__version__}; numpy {np.__version__}; blas.ldflags={ldflags!r}; "
                  f"openmp={openmp}; cxx={cfg.cxx}; linker {cfg.linker}; floatX {cfg.floatX}"),
        "in_force": in_force,
        "mismatches": mismatches,
    }


def train(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    net = build(params["model"], dataset.shape, dataset.classes, params["seed"])
    log.emit("model", name=params["model"], parameters=parameter_count(net),
             flops=forward_flops(params["model"], dataset.shape, dataset.classes))
    full = setting(params, "first_layer_backward") == "full"
    t0 = time.perf_counter()
    trainer = Trainer(net, params, input_gradient=full)
    evaluator = Evaluator(net)
    compile_s = time.perf_counter() - t0
    feed = Feed(params, dataset.train, dataset.shape)
    x_test, y_test = arrays(dataset.test, dataset.shape)
    held = arrays(dataset.validation, dataset.shape) if dataset.validation else None
    iterations, patience = params["iterations"], setting(params, "early_stopping")
    gradients = [0]
    notes = [*_STATE.get("notes", []),
             f"the training step is one theano.function, compiled before the first step ({compile_s:.1f} s with "
             f"the evaluation function; compile directory {_STATE.get('compile_home')}): time_to_first_step "
             "includes it"]

    def outcome(**more: Any) -> TrainOutcome:
        feed.close()
        return TrainOutcome(notes=notes, model=net, input_gradient_steps=gradients[0],
                            input_pipeline=feed.describe(), **more)

    epoch, done = 0, 0
    while (done < iterations) if iterations else (epoch < params["epochs"]):
        budget = iterations - done if iterations else None
        starts = distributed.batch_starts(len(feed.y), params["batch_size"], 1, budget)
        steps, loss, accuracy, seconds = train_epoch(trainer, feed, starts, epoch=epoch, seed=params["seed"],
                                                     record=log.steps.append, gradients=gradients if full else None,
                                                     clock_for=log.phase_clock)
        done += steps
        test_loss, test_accuracy, test_seconds = evaluator.run(x_test, y_test, params["eval_batch_size"])
        validation = evaluator.run(*held, params["eval_batch_size"]) if held else None
        log.epoch(epoch=epoch, steps=steps, train_loss=loss, train_accuracy=accuracy, test_loss=test_loss,
                  test_accuracy=test_accuracy, epoch_seconds=seconds, test_seconds=test_seconds,
                  validation=validation)
        if not math.isfinite(loss):
            notes.append(f"training loss became {loss} in epoch {epoch}; stopped")
            return outcome(diverged=True)
        if log.should_stop(patience):
            return outcome(stopped_early=True)
        epoch += 1
    return outcome()


def infer(params: dict[str, Any], dataset: Dataset, log: EventLog) -> TrainOutcome:
    """Forward passes over the test split in order (cycling), timed per batch."""
    net = build(params["model"], dataset.shape, dataset.classes, params["seed"])
    log.emit("model", name=params["model"], parameters=parameter_count(net),
             flops=forward_flops(params["model"], dataset.shape, dataset.classes))
    x, _ = arrays(dataset.test, dataset.shape)
    xv = T.tensor4("x", dtype="float32")
    forward = theano.function([xv], net.apply(xv, train=False)[0], name="forward")  # compiled before any batch
    n, batch = len(x), params["batch_size"]
    starts = list(range(0, n, batch))
    batches = [np.ascontiguousarray(x[s:s + batch]) for s in starts]
    total = params["iterations"] or len(starts)
    t_all = time.perf_counter()
    for index in range(total):
        xb = batches[index % len(starts)]
        t0 = time.perf_counter()
        forward(xb)
        t1 = time.perf_counter()
        log.steps.append((index // len(starts), t0, t1, xb.shape[0]))
    seconds = time.perf_counter() - t_all
    return TrainOutcome(model=net, inference_seconds=seconds,
                        notes=["forward passes are one theano.function, compiled before the first timed batch"])


def layer_ops(params: dict[str, Any], dataset: Dataset, model: Any) -> LayerOps:
    """Each layer of a sequential network as its own compiled function on one real batch.

    Forward: the layer alone on the real output of the layer before it (training: dropout on,
    BatchNorm on the batch's statistics).  Backward: the gradients of the layer's input and
    parameters given the real upstream gradient (``theano.grad`` with ``known_grads``); the
    first layer's input gradient only with ``first_layer_backward = "full"``, as in training.
    The upstream gradients are found walking back from the loss's gradient w.r.t. the logits
    through these backward functions (a dropout layer draws a new mask on each call)."""
    net: Network = model
    training = params["mode"] != "inference"
    split = dataset.train if training else dataset.test
    x, y = arrays(split.head(params["batch_size"]), dataset.shape)
    full = setting(params, "first_layer_backward") == "full"
    forwards, inputs, h = [], [], x
    for layer in net.layers:
        xv = _variable(h.ndim)
        fn = theano.function([xv], layer.apply(xv, training)[0], name=f"{layer.name}_forward")
        inputs.append(h)
        forwards.append(fn)
        h = fn(h)
    ops: list[LayerOp] = []
    backwards: list[Callable[[Any, Any], list[Any]] | None] = []
    for i, layer in enumerate(net.layers):
        if not training:
            backwards.append(None)
            continue
        xv = _variable(inputs[i].ndim)
        yv = layer.apply(xv, True)[0]
        gv = yv.type("upstream")
        wrt = ([] if i == 0 and not full else [xv]) + layer.params
        if not wrt:
            backwards.append(None)
            continue
        grads = theano.grad(None, wrt, known_grads={yv: gv}, disconnected_inputs="ignore")
        backwards.append(theano.function([xv, gv], grads, name=f"{layer.name}_backward",
                                         on_unused_input="ignore"))
    upstream: list[Any] = [None] * len(net.layers)
    if training:
        zv, yl = T.matrix("logits", dtype="float32"), T.ivector("y")
        loss = T.nnet.categorical_crossentropy(T.nnet.softmax(zv), yl).mean()
        upstream[-1] = theano.function([zv, yl], theano.grad(loss, zv))(h, y)
        for i in range(len(net.layers) - 1, 0, -1):
            upstream[i - 1] = backwards[i](inputs[i], upstream[i])[0]  # wrt starts with the input
    for i in range(len(net.layers)):
        forward = _bind(forwards[i], inputs[i])
        if not training:
            ops.append(LayerOp(forward=forward))
        elif backwards[i] is None:
            ops.append(LayerOp(forward=forward, backward=lambda: None))
        else:
            ops.append(LayerOp(forward=forward, backward=_bind(backwards[i], inputs[i], upstream[i])))
    return LayerOps(ops=ops, images=int(x.shape[0]), notes=[
        "layer profile (theano): each layer was compiled and timed as its own theano.function; the training step "
        "is one function that Theano's graph optimizer rewrites as a whole (elementwise work merged into Composite "
        "ops, the last bias, softmax and loss fused), so the layers' times do not add up to the step's"])


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


# --- what is in force --------------------------------------------------------------------


def _load_blas() -> dict[str, bool]:
    """Compile and run a dense product and a convolution with the cell's flags: the module of
    the BLAS op links what blas.ldflags names, so the BLAS is mapped for the probe to see.
    Returns op name -> whether it runs Theano's C code (Dot22 has none without blas.ldflags)."""
    from theano.tensor.nnet import conv2d

    a, b, x, w = T.fmatrix(), T.fmatrix(), T.ftensor4(), T.ftensor4()
    fn = theano.function([a, b, x, w], [T.exp(T.dot(a, b)), conv2d(x, w, filter_flip=False)], name="probe")
    m = np.ones((8, 8), np.float32)
    fn(m, m * 0.01, np.ones((2, 2, 8, 8), np.float32), np.ones((3, 2, 3, 3), np.float32))
    return {type(node.op).__name__: hasattr(thunk, "cthunk") for node, thunk in zip(fn.fn.nodes, fn.fn.thunks)}


def _threadpools() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info

        return [dict(p) for p in threadpool_info()]
    except Exception:  # fail soft: the probe never stops a run
        return []


def _theano_blas(pools: list[dict[str, Any]], ldflags: str) -> dict[str, Any] | None:
    """The BLAS Theano's ops call, as threadpoolctl sees it: numpy's bundled copy when
    blas.ldflags is empty, else the library linked (not numpy's nor scipy's)."""
    blas = [p for p in pools if p.get("user_api") == "blas"]
    numpys = [p for p in blas if "numpy" in str(p.get("filepath", ""))]
    if not ldflags.strip():
        return _pool(numpys[0]) if numpys else None
    own = [p for p in blas if not any(part in str(p.get("filepath", "")) for part in ("numpy", "scipy"))]
    if own:
        return _pool(own[0])
    # a library threadpoolctl cannot ask (Debian's reference BLAS; BLIS's libblas.so.3): from the maps
    from ..probe import blas_loaded

    found = blas_loaded(ask=False) or {}
    if not found.get("path"):
        return None
    out = {"filepath": found["path"], "internal_api": found.get("provider"), "num_threads": None,
           "serial": found.get("provider") == "reference"}
    if found.get("provider") == "blis":
        # Debian's BLIS libblas.so.3 exports no bli_* entry point to ask; BLIS sizes its pool
        # from BLIS_NUM_THREADS, else OMP_NUM_THREADS, else 1 (measured: docs/frameworks/theano.md)
        for var in ("BLIS_NUM_THREADS", "OMP_NUM_THREADS"):
            value = os.environ.get(var, "").strip()
            if value.isdigit():
                out.update(num_threads=int(value), threads_from=f"the environment ({var}): BLIS reads it")
                break
        else:
            out.update(num_threads=1, threads_from="BLIS's default (no BLIS_NUM_THREADS, no OMP_NUM_THREADS)")
    return out


def _pool(p: dict[str, Any]) -> dict[str, Any]:
    return {k: p.get(k) for k in ("filepath", "internal_api", "version", "num_threads", "threading_layer",
                                  "architecture")}


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001  (a missing distribution is "unknown", never a failure)
        return None


def _parse_flags(text: str) -> dict[str, str]:
    """THEANO_FLAGS as Theano reads it: comma-separated ``key=value``, a later key wins."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key:
            out[key.strip()] = value
    return out


def compile_home() -> tuple[str, bool]:
    """(Theano's base_compiledir, whether this process removes it when it ends): the first
    usable of the image's cache the docker executor mounts (``$MATRUN_COMPILE_CACHE``), the
    host's shared cache under the temporary directory, this working directory's
    ``.matrun-theano``, and the parent process's (the oneDNN check's run)."""
    candidates = []
    mounted = os.environ.get(CACHE_VARIABLE)
    if mounted:
        candidates.append((os.path.dirname(mounted.rstrip("/")) or "/", os.path.basename(mounted.rstrip("/")), False))
    candidates += [(tempfile.gettempdir(), f"matrun-theano-{os.getuid()}", False),
                   (os.getcwd(), COMPILE_DIR, True)]
    try:
        candidates.append((os.readlink(f"/proc/{os.getppid()}/cwd"), COMPILE_DIR, False))
    except OSError:
        pass
    tried = []
    for parent, name, own in candidates:
        path = os.path.join(parent, name)
        if _usable(parent, path):
            return path, own
        tried.append(path)
    raise HarnessError("Theano needs a compile directory that is writable and allows executing what is compiled "
                       f"there; none of {', '.join(tried)} is (set base_compiledir in THEANO_FLAGS)")


def _usable(parent: str, path: str) -> bool:
    try:
        if os.statvfs(parent).f_flag & os.ST_NOEXEC:
            return False
        os.makedirs(path, mode=0o700, exist_ok=True)
        return os.access(path, os.W_OK | os.X_OK) and not os.statvfs(path).f_flag & os.ST_NOEXEC
    except OSError:
        return False


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- data ------------------------------------------------------------------------------


def arrays(split: Split, shape: tuple[int, int, int]) -> tuple[Any, Any]:
    """float32 NCHW images normalised to [-1, 1] (/255, mean 0.5, std 0.5) and int32 labels."""
    x = np.frombuffer(bytes(split.images), np.uint8).reshape(split.count, *shape).astype(np.float32)
    x = (x / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    y = np.asarray(split.labels, dtype=np.int64).astype(np.int32)
    return x, y


@dataclass
class Feed:
    """What feeds the training steps (``input_pipeline``).

    ``preloaded``: the normalised training set is in memory; each epoch permutes it (untimed)
    and each step's batch is a contiguous slice, cut before the clock starts.
    ``loader``: the stored uint8 images stay as they are and a loader converts each batch
    (float32, /255, mean 0.5 / std 0.5) as it is fetched, inside the step's clock:
    ``loader_workers`` N > 0 threads of a ``ThreadPoolExecutor`` (numpy releases the GIL in
    the conversion) with 2·N batches submitted ahead, or 0: in the training thread.  Theano
    has no data loader of its own; the batches and their order equal the preloaded path's."""

    params: dict[str, Any]
    split: Split
    shape: tuple[int, int, int]
    loader: bool = False
    workers: int = 0
    batches: int = 0
    seen: dict[int, int] = field(default_factory=dict)  # thread id -> batches it converted (0: this thread)

    def __post_init__(self) -> None:
        self.loader = setting(self.params, "input_pipeline") == "loader"
        self.workers = setting(self.params, "loader_workers") if self.loader else 0
        self._pool: ThreadPoolExecutor | None = None
        if self.loader:
            self.x = np.frombuffer(bytes(self.split.images), np.uint8).reshape(self.split.count, *self.shape)
            self.y = np.asarray(self.split.labels, dtype=np.int64).astype(np.int32)
            self._main = threading.get_ident()
            if self.workers:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="matrun-loader")
        else:
            self.x, self.y = arrays(self.split, self.shape)

    def _convert(self, indices: Any) -> tuple[Any, Any]:
        x = (self.x[indices].astype(np.float32) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
        ident = threading.get_ident()
        key = 0 if ident == self._main else ident
        self.seen[key] = self.seen.get(key, 0) + 1
        return x, self.y[indices]

    def epoch(self, starts: list[tuple[int, int]], order: Any) -> Any:
        """The epoch's batches as an iterator whose ``next`` fetches one (numpy arrays)."""
        if not self.loader:
            xs, ys = self.x[order], self.y[order]
            for start, size in starts:
                self.batches += 1
                yield xs[start:start + size], ys[start:start + size]
            return
        picks = [order[start:start + size] for start, size in starts]
        if self._pool is None:
            for indices in picks:
                self.batches += 1
                yield self._convert(indices)
            return
        for batch in prefetched(self._pool, self._convert, picks, 2 * self.workers):
            self.batches += 1
            yield batch

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def describe(self) -> dict[str, Any]:
        """The summary's ``input_pipeline``: what really fed the steps."""
        if not self.loader:
            return {"kind": "preloaded"}
        return {"kind": "loader", "implementation": "concurrent.futures.ThreadPoolExecutor (numpy conversion per "
                "batch), 2 batches per thread submitted ahead" if self.workers else "in the training thread",
                "workers": self.workers, "workers_seen": len([t for t in self.seen if t != 0]),
                "batches": self.batches, "batches_in_process": self.seen.get(0, 0)}


# --- models ----------------------------------------------------------------------------


def _variable(ndim: int, name: str = "x") -> Any:
    return T.tensor4(name, dtype="float32") if ndim == 4 else T.matrix(name, dtype="float32")


def _shared(value: Any, name: str) -> Any:
    return theano.shared(np.asarray(value, dtype=np.float32), name=name, borrow=True)


def _uniform(rng: Any, bound: float, shape: tuple[int, ...]) -> Any:
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


class Layer:
    """One entry of a layer list: ``apply(x, train)`` -> (output, BatchNorm running-stat
    updates of a training pass); ``params``: its trainable shared variables; ``stats``: its
    BatchNorm running statistics (not trained)."""

    def __init__(self, spec: tuple[Any, ...], classes: int, s: dict[str, Any], rng: Any, srng: Any) -> None:
        self.spec, self.name, self.kind = spec, spec[1], spec[0]
        self.params: list[Any] = []
        self.stats: list[Any] = []
        self.parts: tuple[list[Layer], list[Layer]] = ([], [])
        self.srng = srng
        kind = self.kind
        if kind == "conv":
            _, name, out, k, stride, pad, bias = spec
            fan_in = s["c"] * k * k
            bound = 1.0 / math.sqrt(fan_in)
            self.W = _shared(_uniform(rng, bound, (out, s["c"], k, k)), f"{name}.W")
            self.params.append(self.W)
            self.b = _shared(_uniform(rng, bound, (out,)), f"{name}.b") if bias else None
            if bias:
                self.params.append(self.b)
            self.filter_shape = (out, s["c"], k, k)
            self.stride, self.pad = stride, pad
            s.update(c=out, h=(s["h"] + 2 * pad - k) // stride + 1, w=(s["w"] + 2 * pad - k) // stride + 1)
        elif kind == "bn":
            c = s["c"]
            self.gamma, self.beta = _shared(np.ones(c), f"{self.name}.gamma"), _shared(np.zeros(c), f"{self.name}.beta")
            self.mean, self.var = _shared(np.zeros(c), f"{self.name}.mean"), _shared(np.ones(c), f"{self.name}.var")
            self.params += [self.gamma, self.beta]
            self.stats += [self.mean, self.var]
        elif kind == "maxpool":
            _, _, k, stride, pad = spec
            self.window, self.stride, self.pad = k, stride, pad
            s.update(h=(s["h"] + 2 * pad - k) // stride + 1, w=(s["w"] + 2 * pad - k) // stride + 1)
        elif kind == "gap":
            s.update(flat=s["c"], h=1, w=1)
        elif kind == "flatten":
            s.update(flat=s["c"] * s["h"] * s["w"])
        elif kind == "dense":
            out = spec[2] or classes
            bound = 1.0 / math.sqrt(s["flat"])
            self.W = _shared(_uniform(rng, bound, (s["flat"], out)), f"{self.name}.W")
            self.b = _shared(_uniform(rng, bound, (out,)), f"{self.name}.b")
            self.params += [self.W, self.b]
            s.update(flat=out, c=out)
        elif kind == "dropout":
            self.rate = float(spec[2])
        elif kind == "block":
            _, name, bkind, width, stride = spec
            main, shortcut = block_layers(name, bkind, s["c"], width, stride)
            start = dict(s)
            main_layers = [Layer(sub, classes, s, rng, srng) for sub in main]
            end = dict(s)
            s.update(start)
            short_layers = [Layer(sub, classes, s, rng, srng) for sub in shortcut]
            s.update(end)
            self.parts = (main_layers, short_layers)
            for sub in main_layers + short_layers:
                self.params += sub.params
                self.stats += sub.stats
        elif kind != "relu":
            raise HarnessError(f"unknown layer kind {kind!r} in the model zoo")

    def apply(self, x: Any, train: bool) -> tuple[Any, list[tuple[Any, Any]]]:
        kind = self.kind
        if kind == "conv":
            from theano.tensor.nnet import conv2d

            y = conv2d(x, self.W, filter_shape=self.filter_shape, border_mode=(self.pad, self.pad),
                       subsample=(self.stride, self.stride), filter_flip=False)
            return (y + self.b.dimshuffle("x", 0, "x", "x") if self.b is not None else y), []
        if kind == "bn":
            from theano.tensor.nnet import bn

            g, b = self.gamma.dimshuffle("x", 0, "x", "x"), self.beta.dimshuffle("x", 0, "x", "x")
            m, v = self.mean.dimshuffle("x", 0, "x", "x"), self.var.dimshuffle("x", 0, "x", "x")
            if not train:
                return bn.batch_normalization_test(x, g, b, m, v, axes="spatial", epsilon=_bn_eps()), []
            y, _, _, new_m, new_v = bn.batch_normalization_train(
                x, g, b, axes="spatial", epsilon=_bn_eps(), running_average_factor=BN_MOMENTUM,
                running_mean=m, running_var=v)
            return y, [(self.mean, new_m.flatten()), (self.var, new_v.flatten())]
        if kind == "relu":
            return T.nnet.relu(x), []
        if kind == "maxpool":
            from theano.tensor.signal.pool import pool_2d

            return pool_2d(x, ws=(self.window, self.window), stride=(self.stride, self.stride),
                           pad=(self.pad, self.pad), ignore_border=True, mode="max"), []
        if kind == "gap":
            return x.mean(axis=(2, 3)), []
        if kind == "flatten":
            return x.flatten(2), []
        if kind == "dense":
            return T.dot(x, self.W) + self.b, []
        if kind == "dropout":
            if not train or self.rate <= 0:
                return x, []
            keep = 1.0 - self.rate
            mask = self.srng.binomial(x.shape, p=keep, dtype="float32")
            return x * mask / np.float32(keep), []
        if kind == "block":
            main, short = self.parts
            y, updates = x, []
            for sub in main:
                y, more = sub.apply(y, train)
                updates += more
            r = x
            for sub in short:
                r, more = sub.apply(r, train)
                updates += more
            return T.nnet.relu(y + r), updates
        raise HarnessError(f"unknown layer kind {kind!r}")


def _bn_eps() -> float:
    """1e-5 as Theano takes it: it refuses an epsilon whose float32 is below 1e-5 (cuDNN's
    minimum), and float32(1e-5) is (9.99999975e-06), so the next float32 up, 1.00000008e-05."""
    return float(np.nextafter(np.float32(BN_EPS), np.float32(1.0)))


class Network:
    """``models.MODELS[name]`` as Theano graph pieces: one ``Layer`` per entry of its layer
    list, applied in order."""

    def __init__(self, name: str, shape: tuple[int, int, int], classes: int, seed: int) -> None:
        from theano.sandbox.rng_mrg import MRG_RandomStreams

        rng = np.random.RandomState(seed)
        self.srng = MRG_RandomStreams(seed + 1)
        self.name, self.shape, self.classes = name, shape, classes
        state = {"c": shape[0], "h": shape[1], "w": shape[2], "flat": None}
        self.layers = [Layer(spec, classes, state, rng, self.srng) for spec in ZOO[name]]

    @property
    def params(self) -> list[Any]:
        return [p for layer in self.layers for p in layer.params]

    def apply(self, x: Any, *, train: bool) -> tuple[Any, list[tuple[Any, Any]]]:
        """Logits, and the BatchNorm running-statistics updates of a training pass."""
        updates: list[tuple[Any, Any]] = []
        for layer in self.layers:
            x, more = layer.apply(x, train)
            updates += more
        return x, updates


def build(name: str, shape: tuple[int, int, int], classes: int, seed: int = 0) -> Network:
    return Network(name, tuple(shape), classes, seed)


def parameter_count(net: Network) -> int:
    """Trainable parameters: the shared variables the optimizer updates (BatchNorm's running
    statistics are not among them); counted from their values, nothing compiled."""
    return int(sum(p.get_value(borrow=True).size for p in net.params))


# --- optimizer, steps ---------------------------------------------------------------------


def optimizer_updates(params: dict[str, Any], weights: list[Any], grads: list[Any]) -> list[tuple[Any, Any]]:
    """PyTorch's update rules as Theano updates; weight decay coupled (added to the gradient)."""
    name, lr, wd = params["optimizer"], np.float32(params["lr"]), np.float32(params["weight_decay"] or 0.0)
    f32 = np.float32
    updates: list[tuple[Any, Any]] = []

    def zeros(p: Any, tag: str) -> Any:
        return _shared(np.zeros(p.get_value(borrow=True).shape), f"{p.name}.{tag}")

    grads = [g + wd * p if wd else g for p, g in zip(weights, grads)]
    if name == "sgd":
        mu = f32(params["momentum"] or 0.0)
        for p, g in zip(weights, grads):
            if mu:
                v = zeros(p, "momentum")
                v_new = mu * v + g
                updates += [(v, v_new), (p, p - lr * v_new)]
            else:
                updates.append((p, p - lr * g))
    elif name == "adam":
        b1, b2, eps = f32(0.9), f32(0.999), f32(1e-8)
        t = theano.shared(np.float32(0.0), name="adam.step")
        t_new = t + f32(1.0)
        updates.append((t, t_new))
        c1, c2 = f32(1.0) - T.pow(b1, t_new), f32(1.0) - T.pow(b2, t_new)
        for p, g in zip(weights, grads):
            m, v = zeros(p, "m"), zeros(p, "v")
            m_new, v_new = b1 * m + (f32(1.0) - b1) * g, b2 * v + (f32(1.0) - b2) * g * g
            updates += [(m, m_new), (v, v_new),
                        (p, p - (lr / c1) * m_new / (T.sqrt(v_new) / T.sqrt(c2) + eps))]
    elif name == "adadelta":
        rho, eps = f32(0.9), f32(1e-6)
        for p, g in zip(weights, grads):
            sq, acc = zeros(p, "square_avg"), zeros(p, "acc_delta")
            sq_new = rho * sq + (f32(1.0) - rho) * g * g
            delta = T.sqrt(acc + eps) / T.sqrt(sq_new + eps) * g
            updates += [(sq, sq_new), (acc, rho * acc + (f32(1.0) - rho) * delta * delta), (p, p - lr * delta)]
    elif name == "rmsprop":
        alpha, eps = f32(0.99), f32(1e-8)
        for p, g in zip(weights, grads):
            sq = zeros(p, "square_avg")
            sq_new = alpha * sq + (f32(1.0) - alpha) * g * g
            updates += [(sq, sq_new), (p, p - lr * g / (T.sqrt(sq_new) + eps))]
    else:
        raise HarnessError(f"optimizer {name!r} is not supported by the theano adapter")
    return [(var, T.cast(value, var.dtype)) for var, value in updates]


class Trainer:
    """The training step: one compiled function ``step(x, y)`` that runs forward, backward and
    the update, and adds the batch's loss sum and correct count (and, with ``input_gradient``,
    whether the first layer's input gradient had a non-zero element) to shared accumulators,
    read once per epoch (``take``)."""

    def __init__(self, net: Network, params: dict[str, Any], *, input_gradient: bool) -> None:
        x, y = T.tensor4("x", dtype="float32"), T.ivector("y")
        logits, bn_updates = net.apply(x, train=True)
        losses = T.nnet.categorical_crossentropy(T.nnet.softmax(logits), y)
        loss_sum = losses.sum()
        loss = loss_sum / T.cast(y.shape[0], "float32")
        correct = T.eq(T.argmax(logits, axis=1), y).sum()
        weights = net.params
        wrt = ([x] if input_gradient else []) + weights
        grads = theano.grad(loss, wrt)
        self.loss_acc = theano.shared(np.float64(0.0), name="loss_sum")
        self.correct_acc = theano.shared(np.int64(0), name="correct")
        self.input_grad_acc = theano.shared(np.int64(0), name="input_gradient_steps")
        updates = [(self.loss_acc, self.loss_acc + T.cast(loss_sum, "float64")),
                   (self.correct_acc, self.correct_acc + T.cast(correct, "int64"))]
        if input_gradient:
            gx, grads = grads[0], grads[1:]
            # consumes the input's gradient, so the graph keeps conv1's backward-data pass
            updates.append((self.input_grad_acc, self.input_grad_acc + T.cast(T.neq(gx, 0).any(), "int64")))
        updates += bn_updates + optimizer_updates(params, weights, grads)
        self.fn = theano.function([x, y], [], updates=updates, name="train_step")

    def run(self, x: Any, y: Any) -> None:
        self.fn(x, y)

    def take(self) -> tuple[float, int, int]:
        """(loss sum, correct, input-gradient steps) since the last call; resets them."""
        out = (float(self.loss_acc.get_value()), int(self.correct_acc.get_value()),
               int(self.input_grad_acc.get_value()))
        self.loss_acc.set_value(np.float64(0.0))
        self.correct_acc.set_value(np.int64(0))
        self.input_grad_acc.set_value(np.int64(0))
        return out

    def ops(self) -> list[str]:
        """The compiled step's op names, in execution order (what Theano's optimizer made)."""
        return [type(node.op).__name__ for node in self.fn.maker.fgraph.toposort()]


#: The phase a sampled step's compiled function is marked with: Theano runs forward, backward
#: and the update as one ``theano.function``, one graph its optimizer rewrites and orders as a
#: whole (a layer's update runs as soon as its gradient is there, before the earlier layers'
#: backward), so there is no point between the three to read a clock at.
STEP_PHASE = "forward+backward+update"


def train_epoch(trainer: Trainer, feed: Feed, starts: list[tuple[int, int]], *, epoch: int, seed: int,
                record: Callable[[StepSample], None], gradients: list[int] | None = None,
                clock_for: Callable[[], StepClock | None] = lambda: None) -> tuple[int, float, float, float]:
    """One pass (or a budget of steps) over the shuffled data: (steps, loss, accuracy, seconds).

    Preloaded data: the batch is sliced before the clock starts, and only the compiled step
    sits between the two readings.  A loader: fetching the batch comes first, inside the
    clock.  ``clock_for``: the next step's phase clock (``log.phase_clock``; no device wait:
    Theano's CPU ops have finished when the function returns), None for a step that is not
    sampled; a loader's fetch is the ``input`` phase (preloaded slices have none), the
    compiled step ``STEP_PHASE``."""
    t_epoch = time.perf_counter()
    order = np.random.default_rng([seed, epoch]).permutation(len(feed.y))
    batches = feed.epoch(starts, order)
    seen = 0
    for _, size in starts:
        clock = clock_for()
        if feed.loader:
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
            xb, yb = next(batches)
            if clock is not None:
                clock.mark("input")
        else:
            xb, yb = next(batches)
            t0 = time.perf_counter()
            if clock is not None:
                clock.start()
        trainer.run(xb, yb)
        if clock is not None:
            clock.mark(STEP_PHASE)
        t1 = time.perf_counter()
        record((epoch, t0, t1, size))
        if clock is not None:
            clock.end()
        seen += size
    loss_sum, correct, computed = trainer.take()
    if gradients is not None:
        gradients[0] += computed
    seconds = time.perf_counter() - t_epoch
    steps = len(starts)
    return steps, (loss_sum / seen if seen else math.nan), (correct / seen if seen else 0.0), seconds


class Evaluator:
    """Mean cross-entropy and accuracy over a split (BatchNorm on its running statistics,
    dropout off), one compiled function over batches."""

    def __init__(self, net: Network) -> None:
        x, y = T.tensor4("x", dtype="float32"), T.ivector("y")
        logits, _ = net.apply(x, train=False)
        loss_sum = T.nnet.categorical_crossentropy(T.nnet.softmax(logits), y).sum()
        correct = T.eq(T.argmax(logits, axis=1), y).sum()
        self.fn = theano.function([x, y], [loss_sum, correct], name="evaluate")

    def run(self, x: Any, y: Any, batch_size: int) -> tuple[float, float, float]:
        n = len(y)
        t0 = time.perf_counter()
        loss, correct = 0.0, 0
        for start in range(0, n, batch_size):
            part_loss, part_correct = self.fn(x[start:start + batch_size], y[start:start + batch_size])
            loss += float(part_loss)
            correct += int(part_correct)
        return loss / n, correct / n, time.perf_counter() - t0
