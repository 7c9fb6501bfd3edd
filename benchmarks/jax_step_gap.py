"""JAX: matrun's training step against a plain Flax/optax step of the same network, side by side
in one process, to split a matrun/oracle gap (issue 26: bf16 ResNet-50 at 0.87-0.90 on an H100)
into the device's own time and the host's time around each step.

    python benchmarks/jax_step_gap.py [--device gpu|cpu] [--precision bf16] [--steps 40]

For each side it prints the median step (ms and img/s) in three ways:

- *timed as matrun times it*: each step waited for before the next starts (matrun's
  ``Trainer.run``: it waits on the step's three small outputs, its step counter put on the
  device ahead of the clock; the oracle waits on its loss);
- *matrun before*: the same compiled step waited for on every output (the new state's ~500
  arrays too), its step counter put on the device inside the clock, as matrun did up to
  this benchmark;
- *pipelined*: ``--steps`` steps dispatched back to back and one wait at the end: the
  device's own time per step, the host's dispatch hidden behind it (equal on both sides when
  the two XLA programs cost the same).

and the time each side took to make its initial weights (matrun: ``Network.init``; the oracle:
``jax.jit(net.init)`` and optax's init) and to compile its step.  Ratios are to the oracle's timed step.  ``--device cpu``:
ResNet-50 on 3×32×32, batch 8 (the rehearsal on a host without a GPU; CPU ratios).  Run it
alone on the host.  Exit 2 on bad input (no GPU for ``--device gpu``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_check import JAX_RESNET50  # noqa: E402  (the oracle's network and step, written without matrun)


def median_ms(fn: Callable[[], Any], steps: int, warmup: int) -> float:
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def pipelined_ms(fn: Callable[[], Any], wait: Callable[[Any], Any], steps: int) -> float:
    wait(fn())
    t0 = time.perf_counter()
    out = None
    for _ in range(steps):
        out = fn()
    wait(out)
    return (time.perf_counter() - t0) / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        print("Error: --steps and --warmup must be at least 1", file=sys.stderr)
        return 2
    gpu = args.device == "gpu"
    shape, classes, batch = ((3, 224, 224), 1000, 128) if gpu else ((3, 32, 32), 10, 8)
    params = {"model": "resnet50", "device": args.device, "precision": args.precision, "conv_algo": "autotune",
              "layout": "nhwc", "threads": None, "gpus": None, "lr": 0.01, "optimizer": "sgd", "momentum": 0.9,
              "weight_decay": 0.0, "seed": 0}
    from runner.harness.adapters import jax as adapter

    adapter.configure(params)  # XLA flags (autotune on a GPU), the platform, the imports
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    if gpu and not jax.devices()[0].platform == "gpu":
        print(f"Error: --device gpu but JAX sees {jax.devices()[0].platform} (jax {jax.__version__})", file=sys.stderr)
        return 2
    jax.block_until_ready(jnp.zeros(()))
    rows: list[tuple[str, float]] = []
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; ResNet-50 {args.precision} NHWC, "
          f"batch {batch}, {shape}, {classes} classes", flush=True)

    # --- matrun's step -------------------------------------------------------------------------
    place = adapter.placement(params)
    net = adapter.build("resnet50", shape, classes, "nhwc")
    t0 = time.perf_counter()
    state = adapter.init_state(net, params, shape, place)
    jax.block_until_ready(state)
    init_now = time.perf_counter() - t0
    trainer = adapter.Trainer(net, params, state, place, input_gradient=False)
    rng = np.random.default_rng(0)
    xb = rng.random((batch, *net.input_shape(1)[1:]), dtype=np.float32)
    yb = rng.integers(0, classes, batch).astype(np.int32)
    x, y, w = trainer.batch(xb, yb, batch)
    t0 = time.perf_counter()
    trainer.prepare([batch])
    compile_s = time.perf_counter() - t0
    trainer.indices(args.warmup + args.steps)
    rows.append(("matrun, timed as matrun times it", median_ms(lambda: trainer.run(batch, x, y, w),
                                                              args.steps, args.warmup)))
    step = trainer._compiled[batch]

    def before() -> None:
        out = step(trainer.state, x, y, w, trainer._index(trainer.step_index))
        jax.block_until_ready(out)
        trainer.state, trainer.step_index = out[0], trainer.step_index + 1

    rows.append(("matrun before (waits on every output, counter put in the clock)",
                 median_ms(before, args.steps, args.warmup)))
    index = trainer._index(0)

    def dispatch() -> Any:
        out = step(trainer.state, x, y, w, index)
        trainer.state = out[0]
        return out[1]

    rows.append(("matrun pipelined (the device's own time)", pipelined_ms(dispatch, jax.block_until_ready, args.steps)))
    del trainer, state, step

    # --- the oracle ----------------------------------------------------------------------------
    dtype = {"bf16": jnp.bfloat16}.get(args.precision, jnp.float32)
    scope: dict[str, Any] = {"dtype": dtype, "functools": functools, "jax": jax, "jnp": jnp, "nn": nn,
                             "optax": optax}
    exec(JAX_RESNET50, scope)  # noqa: S102 (the benchmark's own text)
    onet = scope["ResNet50"](classes)
    key = jax.random.PRNGKey(0)
    c, h, wd = shape
    ox = jax.random.uniform(key, (batch, h, wd, c), dtype=jnp.float32).astype(dtype)
    oy = jax.random.randint(key, (batch,), 0, classes)
    t0 = time.perf_counter()
    variables = jax.jit(functools.partial(onet.init, train=False))(key, ox[:1])
    tx = optax.sgd(0.01, momentum=0.9)
    carry = [variables["params"], variables["batch_stats"], tx.init(variables["params"])]
    jax.block_until_ready(carry)
    init_oracle = time.perf_counter() - t0

    ostep = scope["oracle_step"](onet, tx)

    def oracle_step() -> Any:
        p, s, o, loss = ostep(*carry, ox, oy)
        carry[:] = [p, s, o]
        return loss

    t0 = time.perf_counter()
    oracle_step().block_until_ready()
    ocompile = time.perf_counter() - t0
    rows.append(("oracle, timed (waits on its loss)", median_ms(lambda: oracle_step().block_until_ready(),
                                                               args.steps, args.warmup)))
    rows.append(("oracle pipelined (the device's own time)", pipelined_ms(oracle_step, jax.block_until_ready,
                                                                          args.steps)))
    base = rows[3][1]
    print("\n| step | ms | img/s | oracle timed / this |\n|---|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {batch / ms * 1e3:,.0f} | {base / ms:.3f} |")
    print("\n| making the initial weights and compiling | s |\n|---|---|")
    print(f"| matrun init (Network.init, optax init) | {init_now:.2f} |")
    print(f"| oracle init (jax.jit(net.init), optax init) | {init_oracle:.2f} |")
    print(f"| matrun step compile (ahead of time) | {compile_s:.2f} |")
    print(f"| oracle first step (its compile and one step) | {ocompile:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
