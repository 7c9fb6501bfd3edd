"""GPU check: matrun's training throughput against an independently written training step of
the same network, on a host's own Python (``variant = "system"``), for every framework that
Python has; and each matrun cell's fixed cost.  One command on a GPU host (issue 26):

    python benchmarks/gpu_check.py --python /path/to/site/python [--out DIR]

It runs, in order, each step printing what it does:

1. ``matrun doctor`` (the GPU, driver and CUDA as matrun sees them);
2. a small GPU matrix through ``matrun sweep --executor local``: ResNet-50, synthetic
   3×224×224 with 1,000 classes, batch 128, 60 iterations (10 warm-up), one repeat, for each
   framework the Python has (PyTorch: fp32, tf32 and bf16 in NCHW, bf16 in NHWC; JAX: fp32
   and bf16 in NHWC), at each framework's own GPU defaults (docs/MATRIX.md "Framework
   defaults");
3. for each of those configurations an oracle, written here without matrun: PyTorch's
   ``torchvision.models.resnet50`` with ``torch.optim.SGD``; JAX a plain Flax ResNet-50 (v1.5,
   as matrun's and torchvision's) with an optax SGD step under ``jax.jit``.  The same batch,
   optimizer (SGD, lr 0.01, momentum 0.9), precision, layout and convolution-algorithm choice;
   random tensors already on the device; every step timed with the device synchronised
   (``torch.cuda.synchronize``, ``block_until_ready``), the median of the timed steps;
4. the table: per configuration matrun's img/s (the warehouse's ``throughput``, the median of
   its timed steps), the oracle's, and matrun/oracle (the goal: ≥ 0.97 everywhere); then each
   matrun run's fixed cost — its wall time less its timed steps and evaluation — split into
   the framework's import and device start (measured bare by the oracle), the warm-up steps
   (compilation, autotuning), the data set's making, and the rest (the goal: the rest ≤ 2 s).

TensorFlow and MXNet have no oracle here yet: a Python that has them gets their matrun cells
and a line saying no oracle compared them.

``--device cpu`` runs the same check on the CPU at a small size (ResNet-50 on 3×32×32, batch
8, 8 iterations, 2 warm-up; fp32 only), which is how this script is rehearsed on a host without
a GPU; its ratios are CPU ratios.  Everything lands under ``--out`` (default
``./gpu-check``): the matrix, the warehouse, the results, ``oracles.jsonl``, ``check.json``
(every number printed) and ``check.txt`` (the table).  Do not run anything else on the host
meanwhile.  Exit status: 0 when it ran (whatever the ratios), 2 on bad input (a ``--python``
that is not an interpreter, no GPU on a ``--device gpu`` check).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The matrix's configurations: framework -> list of (precision, layout or None for the framework's
# default).  CPU rehearsal: fp32 only.
GPU_CONFIGS: dict[str, list[tuple[str, str | None]]] = {
    "torch": [("fp32", "nchw"), ("tf32", "nchw"), ("bf16", "nchw"), ("bf16", "nhwc")],
    "jax": [("fp32", None), ("bf16", None)],
    "tensorflow": [("fp32", None), ("bf16", None)],
    "mxnet": [("fp32", None), ("fp16", None)],
}
CPU_CONFIGS: dict[str, list[tuple[str, str | None]]] = {
    "torch": [("fp32", "nchw")], "jax": [("fp32", None)], "tensorflow": [("fp32", None)], "mxnet": [("fp32", None)],
}
# framework -> the modules the site's Python needs for matrun's cell (and, for the oracle, more)
NEEDS = {"torch": ("torch",), "jax": ("jax", "flax", "optax"), "tensorflow": ("tensorflow",), "mxnet": ("mxnet",)}
ORACLE_NEEDS = {"torch": ("torch", "torchvision"), "jax": ("jax", "flax", "optax")}


def framework_default(fw: str, key: str) -> str:
    """A framework's own GPU ``layout`` / ``conv_algo``: ``[defaults]`` of its framework.toml,
    the values matrun resolves an unset GPU cell to (docs/MATRIX.md "Framework defaults")."""
    from matrun.frameworks import get_framework

    return get_framework(fw).defaults[key]
GOAL_RATIO = 0.97
GOAL_FIXED_S = 2.0


class CheckError(Exception):
    """Bad input: printed as one ``Error:`` line, exit status 2."""


def sizes(device: str) -> dict[str, Any]:
    if device == "gpu":
        return {"shape": [3, 224, 224], "classes": 1000, "batch": 128, "iterations": 60, "warmup": 10,
                "train": 1536, "test": 256, "eval_batch": 256, "timeout": 900}
    return {"shape": [3, 32, 32], "classes": 10, "batch": 8, "iterations": 8, "warmup": 2,
            "train": 64, "test": 16, "eval_batch": 16, "timeout": 900}


# --- the site's Python ---------------------------------------------------------------------


def site_python(path: str) -> tuple[str, dict[str, bool]]:
    """(the interpreter's absolute path, module -> importable) or CheckError."""
    p = Path(path)
    if "\n" in path or "\x00" in path or not path.strip():
        raise CheckError(f"--python {path!r}: not a path")
    if not p.is_absolute():
        found = shutil.which(path)
        if found is None:
            raise CheckError(f"--python {path}: no such file (give an absolute path to a Python interpreter)")
        p = Path(found)
    if not p.exists():
        raise CheckError(f"--python {p}: no such file")
    if p.is_dir() or not os.access(p, os.X_OK):
        raise CheckError(f"--python {p}: not an executable file (a Python interpreter is wanted)")
    modules = sorted({m for ms in (*NEEDS.values(), *ORACLE_NEEDS.values()) for m in ms})
    code = ("import importlib.util, json, sys; print(json.dumps({'version': list(sys.version_info[:3]), "
            f"'have': {{m: importlib.util.find_spec(m) is not None for m in {modules!r}}}}}))")
    try:
        proc = subprocess.run([str(p), "-c", code], capture_output=True, text=True, timeout=120)
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise CheckError(f"--python {p}: not a working Python interpreter ({type(exc).__name__})") from None
    if proc.returncode != 0 or not isinstance(out, dict):
        raise CheckError(f"--python {p}: not a working Python interpreter (exit {proc.returncode})")
    return str(p), out["have"]


def gpu_present(python: str) -> str | None:
    """A line naming the GPU(s) NVML sees, or None when there is none."""
    code = ("import pynvml\npynvml.nvmlInit()\nn = pynvml.nvmlDeviceGetCount()\n"
            "print(n, [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)])")
    for cmd in ([python, "-c", code], ["nvidia-smi", "-L"]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0 and proc.stdout.strip() and not proc.stdout.startswith("0 "):
            return proc.stdout.strip()
    return None


# --- matrun ----------------------------------------------------------------------------------


MATRUN = [sys.executable, "-c", "from matrun.runner.cli.main import main; main()"]


def configs_for(fw: str, device: str, precisions: list[str]) -> list[tuple[str, str | None]]:
    configs = (GPU_CONFIGS if device == "gpu" else CPU_CONFIGS)[fw]
    return [c for c in configs if not precisions or c[0] in precisions]


def matrix_text(python: str, frameworks: list[str], device: str, size: dict[str, Any], out: Path,
                precisions: list[str] | None = None, repeats: int = 1) -> str:
    # one [[zip]] row per configuration (a matrix of [[include]] rows alone would also run the
    # [fixed]-only cell); layout written out: on the CPU matrun keeps nchw unless told
    picks = [(fw, precision, layout or framework_default(fw, "layout")) for fw in frameworks
             for precision, layout in configs_for(fw, device, precisions or [])]
    rows = ["[[zip]]\n" + "".join(f"{key} = {json.dumps([p[i] for p in picks])}\n"
                                   for i, key in enumerate(("framework", "precision", "layout")))]
    threads = "" if device == "gpu" else "threads = 2\n"
    return (f'[sweep]\nname = "gpu-check"\nresults = "{out / "results"}"\nwarehouse = "{out / "warehouse"}"\n'
            f'repeats = {repeats}\ntimeout = {size["timeout"]}\nexecutor = "local"\n\n'
            f'[fixed]\nvariant = "system"\npython = {json.dumps(python)}\ndevice = "{device}"\n'
            f'model = "resnet50"\ndataset = "synthetic"\nsynthetic_shape = {json.dumps(size["shape"])}\n'
            f'synthetic_classes = {size["classes"]}\nsynthetic_train = {size["train"]}\n'
            f'synthetic_test = {size["test"]}\nbatch_size = {size["batch"]}\n'
            f'eval_batch_size = {size["eval_batch"]}\niterations = {size["iterations"]}\n'
            f'warmup_steps = {size["warmup"]}\nonednn_check = false\n{threads}\n' + "\n".join(rows))


def run(cmd: list[str], *, log: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd[:1] + ["…"] + cmd[3:] if cmd[:3] == MATRUN else cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ {cmd}\n-- exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n")
    return proc


def matrun_runs(out: Path, env: dict[str, str], log: Path) -> list[dict[str, Any]]:
    sql = ("SELECT r.run_id, r.cell_id, r.status, r.wall_seconds, r.throughput, r.train_seconds, r.test_seconds, "
           "r.time_to_first_step, r.bundle_path, "
           "json_extract_string(r.params, '$.framework') AS framework, "
           "json_extract_string(r.params, '$.precision') AS precision, "
           "json_extract_string(r.params, '$.layout') AS layout, "
           "json_extract_string(r.params, '$.conv_algo') AS conv_algo, "
           "(SELECT sum(s.seconds) FROM steps s WHERE s.run_id = r.run_id AND s.phase <> 'warmup') AS timed_s, "
           "(SELECT sum(s.seconds) FROM steps s WHERE s.run_id = r.run_id AND s.phase = 'warmup') AS warmup_s "
           "FROM runs r ORDER BY r.started_at")
    proc = run([*MATRUN, "query", "--warehouse", str(out / "warehouse"), "--format", "json", sql],
               log=log, timeout=300, env=env)
    if proc.returncode != 0:
        print(f"  (the warehouse query failed: {proc.stderr.strip()[-300:]})")
        return []
    rows = json.loads(proc.stdout)
    for row in rows:
        row["data_s"], row["eval_s"] = bundle_times(Path(row["bundle_path"] or ""))
    return rows


def bundle_times(bundle: Path) -> tuple[float | None, float | None]:
    """From a bundle's own events: the data set's making (seconds) and every epoch's evaluation
    summed (the first epoch's holds the evaluation program's compilation); None when absent."""
    data_s = eval_s = None
    events = bundle / "events.jsonl"
    if not events.is_file():
        return None, None
    for line in events.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a run killed mid-line
            break
        if not isinstance(record, dict):
            continue
        if record.get("type") == "data":
            data_s = record.get("load_seconds")
        elif record.get("type") == "epoch":
            spent = sum(record.get(k) or 0.0 for k in ("test_seconds", "validation_seconds"))
            eval_s = (eval_s or 0.0) + spent
    return data_s, eval_s


# --- the oracles -----------------------------------------------------------------------------


TORCH_ORACLE = r'''
import contextlib, json, statistics, sys, time
t0 = time.perf_counter()
import torch, torchvision
cfg = json.loads(sys.argv[1])
gpu = cfg["device"] == "gpu"
dev = torch.device("cuda" if gpu else "cpu")
sync = torch.cuda.synchronize if gpu else (lambda: None)
if gpu:
    torch.zeros(1, device=dev); sync()
else:
    torch.set_num_threads(cfg["threads"])
ready = time.perf_counter() - t0
tf32 = cfg["precision"] == "tf32"
torch.backends.cuda.matmul.allow_tf32 = tf32
torch.backends.cudnn.allow_tf32 = tf32
torch.backends.cudnn.benchmark = cfg["conv_algo"] == "autotune"
torch.manual_seed(0)
model = torchvision.models.resnet50(num_classes=cfg["classes"]).to(dev)
nhwc = cfg["layout"] == "nhwc"
if nhwc:
    model = model.to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.rand(cfg["batch"], *cfg["shape"], device=dev)
y = torch.randint(0, cfg["classes"], (cfg["batch"],), device=dev)
if nhwc:
    x = x.contiguous(memory_format=torch.channels_last)
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg["precision"])
amp = (lambda: torch.autocast(dev.type, dtype=dtype)) if dtype is not None else contextlib.nullcontext
model.train()
def step():
    opt.zero_grad(set_to_none=True)
    with amp():
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
times = []
for i in range(cfg["iterations"]):
    s = time.perf_counter(); step(); sync(); times.append(time.perf_counter() - s)
timed = times[cfg["warmup"]:]
print(json.dumps({"ready_s": ready, "median_step_s": statistics.median(timed),
                  "img_s": cfg["batch"] / statistics.median(timed), "warmup_s": sum(times[:cfg["warmup"]]), "timed_s": sum(timed),
                  "version": torch.__version__}))
'''

# A plain Flax ResNet-50 (v1.5) and its optax training step (``oracle_step``: jitted, the state
# donated), written without matrun; ``dtype``, ``functools``, ``jax``, ``jnp``, ``nn`` and ``optax``
# come from the code it is pasted into (the oracle below; benchmarks/jax_step_gap.py).
JAX_RESNET50 = r'''
class Bottleneck(nn.Module):
    filters: int
    strides: int
    @nn.compact
    def __call__(self, x, train):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=dtype)
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=dtype)
        y = nn.relu(norm()(conv(self.filters, (1, 1))(x)))
        y = nn.relu(norm()(conv(self.filters, (3, 3), (self.strides, self.strides), padding=((1, 1), (1, 1)))(y)))
        y = norm()(conv(self.filters * 4, (1, 1))(y))
        if x.shape != y.shape:
            x = norm()(conv(self.filters * 4, (1, 1), (self.strides, self.strides))(x))
        return nn.relu(x + y)

class ResNet50(nn.Module):
    classes: int
    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(64, (7, 7), (2, 2), padding=((3, 3), (3, 3)), use_bias=False, dtype=dtype)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=dtype)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
        for stage, blocks in enumerate((3, 4, 6, 3)):
            for i in range(blocks):
                x = Bottleneck(64 * 2 ** stage, 2 if stage > 0 and i == 0 else 1)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.classes, dtype=dtype)(x).astype(jnp.float32)

def oracle_step(net, tx):
    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, stats, opt_state, x, y):
        def loss_fn(p):
            logits, new = net.apply({"params": p, "batch_stats": stats}, x, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new["batch_stats"]
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss
    return step
'''

JAX_ORACLE = r'''
import functools, json, os, statistics, sys, time
cfg = json.loads(sys.argv[1])
if cfg["device"] == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
t0 = time.perf_counter()
import jax, jax.numpy as jnp, flax.linen as nn, optax
jnp.zeros(()).block_until_ready()
ready = time.perf_counter() - t0
if cfg["device"] == "gpu":
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if cfg["precision"] == "tf32" else "highest")
dtype = {"bf16": jnp.bfloat16, "fp16": jnp.float16}.get(cfg["precision"], jnp.float32)

''' + JAX_RESNET50 + r'''
c, h, w = cfg["shape"]
key = jax.random.PRNGKey(0)
x = jax.random.uniform(key, (cfg["batch"], h, w, c), dtype=jnp.float32).astype(dtype)
y = jax.random.randint(key, (cfg["batch"],), 0, cfg["classes"])
net = ResNet50(cfg["classes"])
t_init = time.perf_counter()
variables = jax.jit(functools.partial(net.init, train=False))(key, x[:1])
params, stats = variables["params"], variables["batch_stats"]
tx = optax.sgd(0.01, momentum=0.9)
opt_state = tx.init(params)
jax.block_until_ready(opt_state)
init = time.perf_counter() - t_init

step = oracle_step(net, tx)

times = []
for i in range(cfg["iterations"]):
    s = time.perf_counter()
    params, stats, opt_state, loss = step(params, stats, opt_state, x, y)
    loss.block_until_ready()
    times.append(time.perf_counter() - s)
timed = times[cfg["warmup"]:]
print(json.dumps({"ready_s": ready, "init_s": init, "median_step_s": statistics.median(timed),
                  "img_s": cfg["batch"] / statistics.median(timed), "warmup_s": sum(times[:cfg["warmup"]]), "timed_s": sum(timed),
                  "version": jax.__version__}))
'''

ORACLES = {"torch": TORCH_ORACLE, "jax": JAX_ORACLE}


def oracle(python: str, fw: str, cfg: dict[str, Any], out: Path, log: Path) -> dict[str, Any]:
    script = out / f"oracle_{fw}.py"
    script.write_text(ORACLES[fw], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "TF_", "MXNET_"))}
    if cfg["device"] == "gpu" and cfg["conv_algo"] == "heuristic" and fw == "jax":
        env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    if cfg["device"] == "cpu":
        env.update(OMP_NUM_THREADS=str(cfg["threads"]), CUDA_VISIBLE_DEVICES="")
    t0 = time.perf_counter()
    try:
        proc = run([python, str(script), json.dumps(cfg)], log=log, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1][:300]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


# --- the check -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the site's Python interpreter (its frameworks are checked)")
    parser.add_argument("--out", default="gpu-check", help="where everything lands (default: ./gpu-check)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="cpu: a small rehearsal on a host without a GPU")
    parser.add_argument("--precisions", default="", help="comma-separated subset of the precisions (default: all)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each matrun cell and of each oracle (the table shows medians)")
    parser.add_argument("--frameworks", default="",
                        help="comma-separated subset (default: every framework the Python has)")
    args = parser.parse_args(argv)
    try:
        return check(args)
    except CheckError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


def check(args: argparse.Namespace) -> int:
    python, have = site_python(args.python)
    wanted = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = [f for f in wanted if f not in NEEDS]
    if unknown:
        raise CheckError(f"--frameworks: unknown {', '.join(unknown)}; known: {', '.join(NEEDS)}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    known = sorted({p for cs in GPU_CONFIGS.values() for p, _ in cs})
    if [p for p in precisions if p not in known]:
        raise CheckError(f"--precisions: unknown {', '.join(p for p in precisions if p not in known)}; "
                         f"known: {', '.join(known)}")
    if not 1 <= args.repeats <= 20:
        raise CheckError(f"--repeats: {args.repeats} is not from 1 to 20")
    frameworks = [fw for fw in (wanted or list(NEEDS)) if all(have.get(m) for m in NEEDS[fw])]
    lacking = [fw for fw in (wanted or []) if fw not in frameworks]
    if lacking:
        raise CheckError(f"--frameworks: {python} cannot import {', '.join(lacking)}")
    if not frameworks:
        raise CheckError(f"--python {python}: has none of {', '.join(NEEDS)}")
    if args.device == "gpu":
        gpus = gpu_present(python)
        if gpus is None:
            raise CheckError("no GPU on this host (neither NVML through --python nor nvidia-smi sees one); "
                             "--device cpu rehearses the check on the CPU")
        print(f"GPU: {gpus}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    size = sizes(args.device)
    env = {**os.environ, "MATRUN_HOME": str(out / "home")}
    report: dict[str, Any] = {"python": python, "device": args.device, "frameworks": frameworks, "size": size}
    started = time.time()

    matrix = out / "matrix.toml"
    matrix.write_text(matrix_text(python, frameworks, args.device, size, out, precisions, args.repeats),
                      encoding="utf-8")
    print("== 1. matrun doctor", flush=True)
    proc = run([*MATRUN, "doctor", str(matrix)], log=log, timeout=300, env=env)
    print(proc.stdout[-3000:])
    report["doctor_exit"] = proc.returncode

    print("== 2. matrun sweep (local executor, the site's Python)", flush=True)
    t0 = time.perf_counter()
    proc = run([*MATRUN, "sweep", str(matrix), "--executor", "local"], log=log, timeout=3600, env=env)
    report["sweep_exit"], report["sweep_s"] = proc.returncode, time.perf_counter() - t0
    print(proc.stdout[-2000:] + proc.stderr[-2000:])
    runs = matrun_runs(out, env, log)
    report["runs"] = runs
    (out / "check.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    explained = []
    for r in runs:  # what matrun explain says of each cell (its phases, its comparisons)
        if r["status"] == "ok":
            proc = run([*MATRUN, "explain", r["cell_id"], "--warehouse", str(out / "warehouse")], log=log,
                       timeout=300, env=env)
            explained.append(f"## {r['framework']} {r['precision']} {r['layout']} ({r['cell_id']})\n"
                             f"{proc.stdout}{proc.stderr}")
    (out / "explain.txt").write_text("\n".join(explained), encoding="utf-8")

    print("== 3. oracles", flush=True)
    oracles = []
    threads = 2 if args.device == "cpu" else None
    for fw in frameworks:
        for precision, layout in configs_for(fw, args.device, precisions):
            cfg = {"framework": fw, "device": args.device, "precision": precision,
                   "layout": layout or framework_default(fw, "layout"),
                   "conv_algo": framework_default(fw, "conv_algo") if args.device == "gpu"
                   else "heuristic", "batch": size["batch"], "iterations": size["iterations"],
                   "warmup": size["warmup"], "shape": size["shape"], "classes": size["classes"], "threads": threads}
            if fw not in ORACLES or not all(have.get(m) for m in ORACLE_NEEDS[fw]):
                oracles.append({**cfg, "error": "no oracle for this framework here"})
                continue
            for _ in range(args.repeats):
                result = oracle(python, fw, cfg, out, log)
                print(f"  {fw} {precision} {cfg['layout']}: {result}", flush=True)
                oracles.append({**cfg, **result})
                with (out / "oracles.partial.jsonl").open("a", encoding="utf-8") as f:  # kept if cut short
                    f.write(json.dumps(oracles[-1]) + "\n")
    (out / "oracles.jsonl").write_text("".join(json.dumps(o) + "\n" for o in oracles), encoding="utf-8")
    report["oracles"] = oracles

    lines = table(runs, oracles)
    report["seconds"] = time.time() - started
    (out / "check.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    (out / "check.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("== 4. results\n" + "\n".join(lines))
    return 0


def table(runs: list[dict[str, Any]], oracles: list[dict[str, Any]]) -> list[str]:
    """The ratio table (medians over the repeats of each side) and the fixed-cost table (per
    matrun run, against the median of its configuration's oracle runs)."""
    lines = ["| framework | precision | layout | conv_algo | matrun img/s | oracle img/s | matrun/oracle |",
             "|---|---|---|---|---|---|---|"]
    fixed = ["", "| framework | precision | layout | wall s | timed steps s | evaluation s | matrun fixed s | "
                 "oracle fixed s | beyond the oracle s | data s | oracle import + device s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for o in oracles:
        groups.setdefault((o["framework"], o["precision"], o["layout"]), []).append(o)
    for (fw, precision, layout), group in groups.items():
        mine = [r for r in runs if (r["framework"], r["precision"], r["layout"]) == (fw, precision, layout)]
        ok = [r for r in mine if r["status"] == "ok" and r["throughput"]]
        theirs_all = [o["img_s"] for o in group if o.get("img_s")]
        ours = statistics.median(r["throughput"] for r in ok) if ok else None
        theirs = statistics.median(theirs_all) if theirs_all else None
        if ours and theirs:
            ratios.append(ours / theirs)
        spread = lambda xs: f" ({min(xs):,.0f}–{max(xs):,.0f}, n={len(xs)})" if len(xs) > 1 else ""
        status = "" if not mine or ok else f" ({mine[0]['status']})"
        conv = mine[0]["conv_algo"] if mine else "-"
        lines.append(f"| {fw} | {precision} | {layout} | {conv} | "
                     f"{f'{ours:,.0f}' if ours else '-'}{status}{spread([r['throughput'] for r in ok])} | "
                     f"{f'{theirs:,.0f}' if theirs else group[0].get('error', '-')}{spread(theirs_all)} | "
                     f"{f'{ours / theirs:.3f}' if ours and theirs else '-'} |")
        done = [o for o in group if o.get("process_s")]
        theirs_fixed = statistics.median(o["process_s"] - o["timed_s"] for o in done) if done else None
        ready = statistics.median(o["ready_s"] for o in done) if done else None
        for r in ok:
            if r["wall_seconds"] is None or theirs_fixed is None:
                continue
            evaluation = r.get("eval_s")
            if evaluation is None:  # no epoch records read: the last epoch's, from the warehouse
                evaluation = r["test_seconds"] or 0.0
            ours_fixed = r["wall_seconds"] - (r["timed_s"] or 0.0) - evaluation
            data = r["data_s"] if r["data_s"] is not None else float("nan")
            fixed.append(f"| {fw} | {precision} | {layout} | {r['wall_seconds']:.1f} | {r['timed_s'] or 0.0:.2f} | "
                         f"{evaluation:.2f} | {ours_fixed:.2f} | {theirs_fixed:.2f} | "
                         f"{ours_fixed - theirs_fixed:+.2f} | {data:.2f} | {ready:.2f} |")
    lines.append(f"\nratios: {len(ratios)}; min {min(ratios):.3f}; goal >= {GOAL_RATIO}" if ratios
                 else "\nratios: none (no configuration has both sides)")
    return lines + fixed + [
        "(matrun fixed: the run's wall time less its timed steps and every epoch's evaluation (the first's "
        "holds the evaluation step's compilation): starting Python and the "
        "harness, importing the framework, starting the device, making the data, building and compiling "
        "the model, the warm-up steps, writing the results; oracle fixed: the same for the oracle's "
        f"process (the median over its runs), which makes no data set and evaluates nothing; goal: beyond "
        f"the oracle <= {GOAL_FIXED_S} s)"]


if __name__ == "__main__":
    sys.exit(main())
