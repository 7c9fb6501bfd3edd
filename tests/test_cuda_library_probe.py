"""The library probe of a GPU image on a host without a GPU (runner/environments/probes.py
``_CUDA_LIBRARIES_SCRIPT``, ``summarise_cuda_libraries``): the script is run here by this
Python, against stand-in CUDA libraries compiled from C with the real libraries' file names
and version functions (``cudaRuntimeGetVersion``, ``cudnnGetVersion``, ``ncclGetVersion``),
laid out as PyPI's nvidia-* wheels lay them out (``site-packages/nvidia/<pkg>/lib``).  The
real libraries were read by a real build (docs/IMAGES.md "CUDA images without a registry")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from matrun.runner.environments.probes import (CUDA_LIBRARIES, CUDA_SYSTEM_DIRS, PROBE_MARK, _CUDA_LIBRARIES_SCRIPT,
                                              broken_promises, cuda_version_text, summarise_cuda_libraries)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to make the stand-in libraries")

OUT = "int {fn}(int *v) {{ *v = {value}; return {code}; }}\n"
RETURN = "unsigned long {fn}(void) {{ return {value}UL; }}\n"


def stand_in(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    c = path.with_name(path.name + ".c")
    c.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(c)], check=True)
    c.unlink()
    return path


def wheels_like(site: Path, *, runtime: int = 13000, cudnn: int = 92000, nccl: int = 22907,
                runtime_code: int = 0) -> None:
    stand_in(site / "nvidia" / "cu13" / "lib" / "libcudart.so.13",
             OUT.format(fn="cudaRuntimeGetVersion", value=runtime, code=runtime_code))
    stand_in(site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9", RETURN.format(fn="cudnnGetVersion", value=cudnn))
    stand_in(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2", OUT.format(fn="ncclGetVersion", value=nccl, code=0))


def probe(site: Path, import_check: str, system: tuple[Path, ...] = ()) -> dict:
    """The script as the image's container runs it, with ``system`` for its system folders (this
    host's own CUDA, if it has one, stays out of it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([sys.executable, "-c", _CUDA_LIBRARIES_SCRIPT, import_check,
                           json.dumps([list(item) for item in CUDA_LIBRARIES]),
                           json.dumps([str(folder) for folder in system])],
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(site)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(PROBE_MARK)]
    return json.loads(line[len(PROBE_MARK):])


@pytest.mark.parametrize(("key", "raw", "text"), [
    ("cuda_runtime", 13000, "13.0"), ("cuda_runtime", 12090, "12.9"), ("cuda_runtime", 11070, "11.7"),
    ("cudnn", 92000, "9.20.0"), ("cudnn", 90100, "9.1.0"), ("cudnn", 8907, "8.9.7"),
    ("nccl", 22907, "2.29.7"), ("nccl", 2804, "2.8.4"), ("nccl", None, None),
])
def test_each_librarys_version_number_is_written_as_its_makers_write_it(key, raw, text):
    assert cuda_version_text(key, raw) == text


def test_the_libraries_in_the_wheels_are_found_and_asked_their_versions(tmp_path):
    site = tmp_path / "venv" / "site-packages"
    wheels_like(site)
    fields = probe(site, "print('stand-in 2.13.0+cu130')")
    assert fields["cuda_runtime"] == {"path": str((site / "nvidia/cu13/lib/libcudart.so.13").resolve()),
                                      "raw": 13000, "loaded_by_framework": False, "error": None}
    assert fields["cudnn"]["raw"] == 92000 and fields["nccl"]["raw"] == 22907
    assert fields["gpu"] is False and fields["framework_error"] is None
    found = summarise_cuda_libraries("torch", fields)
    assert (found.framework_version, found.cuda, found.cudnn) == ("stand-in 2.13.0+cu130", "13.0", "9.20.0")
    assert found.raw["versions"]["nccl"] == "2.29.7" and found.blas is None
    assert broken_promises(found, {"cuda": "13.0", "cudnn": "9.20"}) == []
    assert broken_promises(found, {"cuda": "12", "cudnn": "8"}) == [
        "cuda: promised 12, the probe found 13.0", "cudnn: promised 8, the probe found 9.20.0"]


def test_the_library_the_framework_mapped_wins_over_another_copy(tmp_path):
    """What the framework loaded is what it uses: a second cuDNN elsewhere is not asked."""
    site = tmp_path / "site-packages"
    wheels_like(site, cudnn=91000)
    mine = stand_in(tmp_path / "framework" / "libcudnn.so.9", RETURN.format(fn="cudnnGetVersion", value=92000))
    fields = probe(site, f"import ctypes; ctypes.CDLL({str(mine)!r}); print('fw 1')")
    assert fields["cudnn"]["path"] == str(mine.resolve()) and fields["cudnn"]["loaded_by_framework"] is True
    assert summarise_cuda_libraries("torch", fields).cudnn == "9.20.0"


def test_a_framework_that_will_not_import_and_a_library_that_fails_are_recorded_not_fatal(tmp_path):
    """MXNet's CUDA build does not import without the driver; a runtime whose version call
    fails gives no version, so a promise of one is broken, by name."""
    site = tmp_path / "site-packages"
    wheels_like(site, runtime_code=35)
    fields = probe(site, "raise ImportError('libcuda.so.1: cannot open shared object file')")
    assert fields["framework_error"] == "ImportError: libcuda.so.1: cannot open shared object file"
    assert fields["cuda_runtime"]["raw"] is None and "cudaRuntimeGetVersion returned 35" in fields["cuda_runtime"]["error"]
    found = summarise_cuda_libraries("mxnet", fields)
    assert found.framework_version is None and found.cuda is None and found.cudnn == "9.20.0"
    assert broken_promises(found, {"cuda": "13"}) == ["cuda: promised 13, the probe found none"]


def test_the_system_folders_are_looked_in_after_the_wheels(tmp_path):
    """An image on NVIDIA's base: the runtime and cuDNN of /usr/local/cuda (here a stand-in
    folder); NCCL from a wheel is still found first."""
    site, system = tmp_path / "site-packages", tmp_path / "usr-local-cuda-lib64"
    stand_in(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2", OUT.format(fn="ncclGetVersion", value=21805, code=0))
    stand_in(system / "libcudart.so.11.0", OUT.format(fn="cudaRuntimeGetVersion", value=11070, code=0))
    stand_in(system / "libcudnn.so.8", RETURN.format(fn="cudnnGetVersion", value=8500))
    stand_in(system / "libnccl.so.2", OUT.format(fn="ncclGetVersion", value=21403, code=0))
    found = summarise_cuda_libraries("mxnet", probe(site, "print('mx 1.9.1')", (tmp_path / "none", system)))
    assert (found.cuda, found.cudnn, found.raw["versions"]["nccl"]) == ("11.7", "8.5.0", "2.18.5")
    assert found.raw["cuda_runtime"]["path"] == str((system / "libcudart.so.11.0").resolve())


def test_no_cuda_library_at_all_is_none_everywhere(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    fields = probe(site, "print('cpu only')", (tmp_path,))
    for key, *_ in CUDA_LIBRARIES:
        assert fields[key]["path"] is None and fields[key]["raw"] is None
    found = summarise_cuda_libraries("torch", fields)
    assert (found.cuda, found.cudnn, found.raw["versions"]["nccl"]) == (None, None, None)


def test_the_image_is_searched_where_nvidia_and_debian_put_the_libraries():
    assert CUDA_SYSTEM_DIRS[:3] == ("/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/lib/x86_64-linux-gnu")
