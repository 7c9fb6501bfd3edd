"""The image probe: run the harness probe inside a built image and check what it finds.

The probe runs in a container with no network, no capabilities, a read-only root (a private
/tmp, where what is written may be executed) and the staged harness mounted read-only at
``HARNESS_MOUNT`` (one GPU for a GPU variant: its framework may need the driver to import).
It reports the framework, Python, CUDA / cuDNN, BLAS, oneDNN and OpenMP it finds
(``summarise_probe``), which are checked against what the variant promises in framework.toml
(``variant_promises``, ``broken_promises``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrun.errors import EnvironmentBuildError
from matrun.frameworks import frameworks, get_framework
from matrun.runner.environments.contexts import LABEL, variant_of
from matrun.runner.environments.releases import split_variant
from matrun.runner.environments.home import HARNESS_MOUNT, stage_harness
from matrun.runner.planning.params import PARAMS

if TYPE_CHECKING:  # the Docker SDK is imported only when an engine is used
    import docker

PROBE_MARK = "MATRUN-PROBE "
PROBE_TIMEOUT = 300.0
LOG_TAIL_LINES = 40  # of a failed probe's output, in its error

_NUMPY_LIB = re.compile(r"numpy|scipy_openblas")


@dataclass(frozen=True)
class ImageProbe:
    """What the harness probe found inside an image (``raw``: the probe event's fields)."""

    framework: str
    framework_version: str | None
    python: str | None
    cuda: str | None
    cudnn: str | None
    blas: str | None
    onednn: str | None
    openmp: str | None
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


_PROBE_SCRIPT = f"""
import importlib, json, sys
from matrun.runner.harness import probe
from matrun.runner.harness.adapters import ADAPTERS
params = json.loads(sys.argv[1])
adapter = importlib.import_module("matrun.runner.harness.adapters." + ADAPTERS[params["framework"]])
adapter.configure(params)
fields = probe.collect(params["framework"], params, adapter.probe(params))
print({PROBE_MARK!r} + json.dumps(fields, default=str))
"""


def probe_params(framework: str, variant: str, *, onednn: bool = True) -> dict[str, Any]:
    """Every cell parameter at its default, for this framework variant on the CPU."""
    params = {name: param.default for name, param in PARAMS.items()}
    base, release = split_variant(variant)  # a release's image: its variant, and version
    params.update(framework=framework, variant=base, version=release, device="cpu", onednn=onednn)
    return params


def probe_image(client: "docker.DockerClient", tag: str, framework: str, variant: str, *,
                harness_dir: Path | None = None, timeout: float = PROBE_TIMEOUT,
                onednn: bool = True, gpu: bool = False) -> ImageProbe:
    """Run the harness probe inside the image (oneDNN on or off) and summarise what it found."""
    params = probe_params(framework, variant, onednn=onednn)
    fw = get_framework(framework)
    env = {**fw.fixed_env, **fw.environment(params), "PYTHONPATH": HARNESS_MOUNT}
    container = client.containers.run(
        tag, ["python3", "-c", _PROBE_SCRIPT, json.dumps(params)], detach=True,
        environment=env, network_mode="none", user="1000:1000", cap_drop=["ALL"],
        # /tmp allows executing what is written there (the engine's default is noexec): a
        # framework that compiles its kernels when it starts (Theano) loads them from there
        security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": "exec"},
        volumes={str(harness_dir or stage_harness()): {"bind": HARNESS_MOUNT, "mode": "ro"}},
        labels={f"{LABEL}.role": "probe"}, **_gpu_request(gpu))
    return summarise_probe(_probe_fields(container, f"the probe of {tag}", timeout))


def _probe_fields(container: Any, what: str, timeout: float) -> dict[str, Any]:
    """Wait for a probe's container (killed past ``timeout``), remove it, and return the JSON
    of its last ``PROBE_MARK`` line; ``EnvironmentBuildError`` (``what`` and the log's tail)
    when it timed out, failed or printed none."""
    try:
        try:
            status = container.wait(timeout=timeout)
        except Exception as exc:  # the SDK raises a requests timeout
            container.kill()
            raise EnvironmentBuildError(f"{what} did not finish in {timeout:.0f} s") from exc
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    found = [line[len(PROBE_MARK):] for line in logs.splitlines() if line.startswith(PROBE_MARK)]
    if status.get("StatusCode") != 0 or not found:
        tail = "\n".join(logs.splitlines()[-LOG_TAIL_LINES:])
        raise EnvironmentBuildError(f"{what} failed (exit {status.get('StatusCode')}):\n{tail}")
    return json.loads(found[-1])


#: The CUDA libraries a GPU image's library probe looks for, and how each reports its version:
#: (file name prefix, C function, how it answers).  None of these needs a GPU or the driver.
CUDA_LIBRARIES = (("cuda_runtime", "libcudart.so", "cudaRuntimeGetVersion", "out"),
                  ("cudnn", "libcudnn.so", "cudnnGetVersion", "return"),
                  ("nccl", "libnccl.so", "ncclGetVersion", "out"))
#: Where the library probe looks after the venv's nvidia-* wheels: NVIDIA's base images, Debian's.
CUDA_SYSTEM_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                    "/usr/lib")

#: Run in a GPU image on a host without a GPU (python3 -c; no harness, no network): the
#: framework imported as framework.toml's import_check does (a CUDA framework may refuse to
#: import without the driver: recorded, not fatal), then each CUDA library the process has
#: mapped, else the first found in the venv's nvidia-* wheels, else in the system's folders
#: (``CUDA_SYSTEM_DIRS``: NVIDIA's base images, Debian's packages), loaded with ctypes and asked
#: its version.
_CUDA_LIBRARIES_SCRIPT = r"""
import contextlib, ctypes, glob, io, json, os, platform, sys
import_check, libraries, system = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = {"python": platform.python_version(), "gpu": False, "framework_output": None, "framework_error": None}
buf = io.StringIO()
try:
    with contextlib.redirect_stdout(buf):
        exec(import_check, {})
    out["framework_output"] = buf.getvalue().strip()
except BaseException as exc:
    out["framework_error"] = (type(exc).__name__ + ": " + str(exc))[:300]
try:
    mapped = [line.split()[-1] for line in open("/proc/self/maps") if "/" in line]
except OSError:
    mapped = []
sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
def candidates(prefix):
    seen = [p for p in mapped if os.path.basename(p).startswith(prefix + ".")]
    for site in sites:
        seen += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", prefix + ".*")))
    for folder in system:
        seen += sorted(glob.glob(os.path.join(folder, prefix + ".*")))
    return [p for p in dict.fromkeys(seen) if not p.endswith((".a", ".alt"))]
for key, prefix, function, how in libraries:
    entry = {"path": None, "raw": None, "loaded_by_framework": False, "error": None}
    for path in candidates(prefix):
        try:
            lib = ctypes.CDLL(path)
            fn = getattr(lib, function)
            if how == "out":
                value = ctypes.c_int()
                code = fn(ctypes.byref(value))
                if code != 0:
                    raise OSError(function + " returned " + str(code))
                raw = value.value
            else:
                fn.restype = ctypes.c_size_t
                raw = fn()
        except (OSError, AttributeError) as exc:
            entry["error"] = (path + ": " + str(exc))[:300]
            continue
        entry.update(path=os.path.realpath(path), raw=int(raw), error=None, loaded_by_framework=path in mapped)
        break
    out[key] = entry
print(%r + json.dumps(out))
""" % (PROBE_MARK,)


def cuda_version_text(key: str, raw: int | None) -> str | None:
    """A CUDA library's integer version as its makers write it: the runtime's 13000 -> "13.0"
    (major*1000 + minor*10), cuDNN 9's 92000 -> "9.20.0" (major*10000 + minor*100 + patch; cuDNN
    8's 8907 -> "8.9.7", major*1000 + minor*100 + patch), NCCL's 22907 -> "2.29.7" (the same as
    cuDNN 9 since NCCL 2.9; 2804 -> "2.8.4" before)."""
    if raw is None:
        return None
    if key == "cuda_runtime":
        return f"{raw // 1000}.{raw % 1000 // 10}"
    if raw >= 10000:
        return f"{raw // 10000}.{raw % 10000 // 100}.{raw % 100}"
    return f"{raw // 1000}.{raw % 1000 // 100}.{raw % 100}"


def summarise_cuda_libraries(framework: str, fields: Mapping[str, Any]) -> ImageProbe:
    """What a GPU image's library probe found (``probe_cuda_libraries``) as an ``ImageProbe``:
    the CUDA runtime and cuDNN really inside, NCCL in ``raw``; BLAS, oneDNN and OpenMP are a
    harness probe's, on a GPU (None here)."""
    versions = {key: cuda_version_text(key, (fields.get(key) or {}).get("raw")) for key, *_ in CUDA_LIBRARIES}
    output = str(fields.get("framework_output") or "").strip()
    return ImageProbe(framework=framework, framework_version=output.splitlines()[-1] if output else None,
                      python=fields.get("python"), cuda=versions["cuda_runtime"], cudnn=versions["cudnn"],
                      blas=None, onednn=None, openmp=None,
                      raw={**fields, "versions": versions, "probe": "cuda libraries, no GPU"})


def probe_cuda_libraries(client: "docker.DockerClient", tag: str, framework: str, *,
                         timeout: float = PROBE_TIMEOUT) -> ImageProbe:
    """The CUDA runtime, cuDNN and NCCL inside a GPU image, read on a host without a GPU: a
    container like the harness probe's (no network, no capabilities, read-only root) runs
    ``_CUDA_LIBRARIES_SCRIPT``; none of the three libraries needs the driver to say its version."""
    fw = get_framework(framework)
    container = client.containers.run(
        tag, ["python3", "-c", _CUDA_LIBRARIES_SCRIPT, fw.import_check,
              json.dumps([list(item) for item in CUDA_LIBRARIES]), json.dumps(CUDA_SYSTEM_DIRS)], detach=True,
        environment=dict(fw.fixed_env), network_mode="none", user="1000:1000", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": ""},
        labels={f"{LABEL}.role": "probe"})
    return summarise_cuda_libraries(framework, _probe_fields(container, f"the library probe of {tag}", timeout))


def _gpu_request(gpu: bool) -> dict[str, Any]:
    """One GPU for the probe of a GPU image (the framework needs the driver to import)."""
    if not gpu:
        return {}
    import docker

    return {"device_requests": [docker.types.DeviceRequest(count=1, capabilities=[["gpu"]])]}


def summarise_probe(fields: Mapping[str, Any]) -> ImageProbe:
    """Framework, Python, CUDA / cuDNN, BLAS, oneDNN and OpenMP from a probe event's fields.

    The framework's BLAS comes from its build information where it says MKL (PyTorch links MKL
    statically: ``BLAS_INFO=mkl``), else from the BLAS library the probe found mapped
    (``blas_loaded``: Debian's alternatives resolved to OpenBLAS / BLIS / reference), else
    from the BLAS libraries threadpoolctl found loaded,
    leaving out numpy's own bundled OpenBLAS (loaded by every image, used by none of the
    frameworks' operators).
    """
    in_force = fields.get("in_force") or {}
    build = str(fields.get("build") or "")
    libs = fields.get("libraries") or []

    def pools(api: str) -> list[dict[str, Any]]:
        return [lib for lib in libs if lib.get("user_api") == api]

    blas = None
    loaded = fields.get("blas_loaded") or {}
    match = re.search(r"BLAS_INFO=(\w+)", build)
    if match and match.group(1) == "mkl":
        blas = "mkl"  # linked statically: no library of its own in the process to see
    elif isinstance(loaded, Mapping) and loaded.get("provider") not in (None, "unknown"):
        # The library really mapped, through Debian's alternatives (python3-torch says "generic").
        blas = " ".join(str(x) for x in (loaded["provider"], loaded.get("version")) if x)
    elif match:
        blas = match.group(1)
    else:
        own = [lib for lib in pools("blas") if not _NUMPY_LIB.search(str(lib.get("path") or lib.get("name")))]
        if own:
            blas = " ".join(str(x) for x in (own[0].get("internal_api"), own[0].get("version")) if x)
        else:
            # no BLAS library loaded: the framework's own dense kernels (framework.toml builtin_blas)
            fw = frameworks().get(str(fields.get("framework")))
            blas = fw.builtin_blas if fw else None
    onednn = None
    match = re.search(r"(?:oneDNN|MKL-DNN|DNNL)\s+v?([\d.]+)", build)
    if match:
        onednn = match.group(1)
    elif _onednn_built_in(in_force, libs):
        onednn = "present"
    openmp = ", ".join(str(lib.get("name")) for lib in pools("openmp")) or None
    return ImageProbe(
        framework=str(fields.get("framework")),
        framework_version=fields.get("framework_version"),
        python=fields.get("python"),
        cuda=in_force.get("cuda_version"),
        cudnn=None if in_force.get("cudnn_version") is None else str(in_force["cudnn_version"]),
        blas=blas, onednn=onednn, openmp=openmp, raw=dict(fields))


def _onednn_built_in(in_force: Mapping[str, Any], libs: list[dict[str, Any]]) -> bool:
    """oneDNN is in the build: the adapter says so (torch / MXNet ``onednn_available``,
    TensorFlow ``IsMklEnabled``), or a oneDNN library is loaded."""
    if in_force.get("onednn_available"):
        return True
    if str(in_force.get("onednn_source", "")).startswith("IsMklEnabled") and in_force.get("onednn") is True:
        return True
    return any(re.search(r"dnnl|mkldnn|onednn", str(lib.get("name", "")), re.I) for lib in libs)


# --- promises --------------------------------------------------------------------------

def variant_promises(framework: str, variant: str, images_dir: Path | None = None) -> dict[bool, Mapping[str, str]]:
    """What the probe must find, by oneDNN setting (``True``: on), from framework.toml; a
    release's image (``cpu@2.4.1``) promises that release instead of the pins' version."""
    var = variant_of(framework, variant, images_dir)
    found: dict[bool, Mapping[str, str]] = {True: var.promises}
    if var.promises_onednn_off:
        found[False] = var.promises_onednn_off
    release = split_variant(variant)[1]
    if release:
        found = {k: {**v, "framework_version": release} for k, v in found.items()}
    return found


def broken_promises(found: ImageProbe, promised: Mapping[str, str]) -> list[str]:
    """What a variant promises (``{"blas": "mkl", "onednn": "any"}``) that the probe did not find.

    A promised value matches when the found one starts with it (case-insensitive: ``openblas``
    matches ``openblas 0.3.13``); ``"any"`` only asks that something was found; ``"none"``
    that nothing was.  Unknown keys are reported, never ignored.
    """
    broken = []
    for key, want in promised.items():
        if key not in ("framework_version", "python", "cuda", "cudnn", "blas", "onednn", "openmp"):
            broken.append(f"{key}: not something the probe reports")
            continue
        have = getattr(found, key)
        ok = (have is None if want == "none" else have is not None if want == "any"
              else have is not None and str(have).lower().startswith(want.lower()))
        if not ok:
            broken.append(f"{key}: promised {want}, the probe found {have if have is not None else 'none'}")
    return broken
