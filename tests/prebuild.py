"""Build the environments and images the heavy test files' session fixtures use, ahead of them.

`make test` runs this in the background (niced) beside the test workers: on a machine with
nothing installed, building six framework environments and eleven images is about 20 minutes of
which much is waiting on the network and the disk (pip downloads, debootstrap, image layers),
time the light files' CPU work can fill; a heavy test that needs an item first waits on its
build lock and finds it built.
Each item goes through the very path its fixture takes (`ensure_env`; conftest.built_image:
`engine.ensure_base_image` then `builds.build_images`), so a fixture then finds it built; the
image's probe and the variant's promise check are left to the fixture (it runs them on an image
found built too: probing here would do that work twice).  An item that fails here is built
again by its fixture, whose test fails with the reason.  Prints one line per item and
exits 1 when an item failed (`make test` reports it and runs the tests all the same).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import _ca_bundle, _wheelhouse  # noqa: E402
from test_probe_blas import DEBIAN_BLAS  # noqa: E402
from test_theano import VARIANTS as THEANO_VARIANTS  # noqa: E402

#: What the fixtures of tests/conftest.py, test_jax.py, test_theano.py, test_chainer.py and
#: test_knobs.py build with ``ensure_env``.
ENVS = [(framework, "cpu") for framework in ("torch", "tensorflow", "mxnet", "jax", "theano", "chainer")]
#: What ``built_image`` builds across the tests (cpu_images, torch_image, test_chainer,
#: test_probe_blas, test_theano, test_docker_faults, test_workers).
IMAGES = ([(framework, "cpu") for framework in ("torch", "tensorflow", "mxnet", "jax", "chainer")]
          + [("torch", f"cpu-{blas}") for blas in DEBIAN_BLAS]
          + [("theano", variant) for variant in THEANO_VARIANTS])


def _item(what: str, build) -> bool:
    t0 = time.monotonic()
    try:
        build()
    except Exception as exc:  # reported; the fixture builds it again and its test says why
        print(f"prebuild: {what}: FAILED after {time.monotonic() - t0:.0f} s: {type(exc).__name__}: {exc}",
              flush=True)
        traceback.print_exc(limit=3, file=sys.stdout)
        return False
    print(f"prebuild: {what}: ready in {time.monotonic() - t0:.0f} s", flush=True)
    return True


def main() -> int:
    from matrun.runner.environments import builds, engine
    from matrun.runner.environments.venvs import ensure_env

    t0 = time.monotonic()
    ok = all([_item(f"environment {fw}:{variant}", lambda fw=fw, variant=variant: ensure_env(fw, variant))
              for fw, variant in ENVS])
    try:
        client = engine.connect(timeout=engine.BUILD_TIMEOUT)
        engine.ensure_base_image(client)
    except Exception as exc:
        print(f"prebuild: no Docker engine or base image, images left to their tests: {exc}", flush=True)
        return 1
    for fw, variant in IMAGES:
        ok = _item(f"image {fw}:{variant}", lambda fw=fw, variant=variant: builds.build_images(
            [(fw, variant)], client=client, base_image=engine.BASE_IMAGE, wheelhouse=_wheelhouse(),
            ca_bundle=_ca_bundle(), probe=False)) and ok
    print(f"prebuild: {'everything ready' if ok else 'some items failed'} after {time.monotonic() - t0:.0f} s",
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
