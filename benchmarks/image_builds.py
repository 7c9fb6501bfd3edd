"""Image build times and sizes per framework variant, measured by building each image again.

Each requested image is rebuilt from scratch through matrun's own build path (`--force`: the
same context, tag and labels as `matrun build`; apt and pip downloads are not cached by the
engine, the build stage's layers are shared between the variants of one Dockerfile), then
probed (oneDNN on, and off where the variant says) and checked against its promises.  Prints
one row per image: build seconds, probe seconds, size, and what the probe found.

    python benchmarks/image_builds.py [--image torch:cpu ...] [--base-image matrun-base:bookworm]

Default images: every CPU variant of every framework.  Needs a Docker engine (matrun engine
start) and the base image (made with debootstrap when it is missing).  Takes minutes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from matrun.runner.environments import builds, engine
from matrun.frameworks import frameworks


def cpu_variants() -> list[tuple[str, str]]:
    return [(fw.name, v.name) for fw in frameworks().values() for v in fw.variants.values() if v.device == "cpu"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", action="append", default=[], help="FRAMEWORK:VARIANT (repeatable)")
    ap.add_argument("--base-image", default=engine.BASE_IMAGE)
    args = ap.parse_args()
    images = [tuple(i.split(":", 1)) for i in args.image] or cpu_variants()
    client = engine.connect()
    _, made = engine.ensure_base_image(client, args.base_image)
    if made is not None:
        print(f"base image {args.base_image}: debootstrap + import {made:.1f} s")
    wheelhouse = next((Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if Path(p).is_dir()), None)
    ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    rows = []
    for framework, variant in images:
        started = time.perf_counter()
        (built,) = builds.build_images([(framework, variant)], client=client, base_image=args.base_image,
                                      wheelhouse=wheelhouse, ca_bundle=ca if ca.is_file() else None,
                                      force=True)
        total = time.perf_counter() - started
        p = built.probe
        rows.append((f"{framework}:{variant}", built.build_seconds, total - (built.build_seconds or 0),
                     built.size_bytes / 1e6, f"{p.framework_version}", p.blas, p.onednn, built.tag))
        print(f"{rows[-1][0]}: built in {built.build_seconds:.0f} s, {built.size_bytes / 1e6:,.0f} MB", flush=True)
    print()
    print(f"{'image':<22} {'build s':>8} {'probe s':>8} {'size MB':>9}  {'version':<14} {'blas':<18} {'onednn':<8} tag")
    for name, seconds, probe_s, size, version, blas, onednn, tag in rows:
        print(f"{name:<22} {seconds:>8.0f} {probe_s:>8.1f} {size:>9,.0f}  {version:<14} {str(blas):<18} "
              f"{str(onednn):<8} {tag}")


if __name__ == "__main__":
    main()
