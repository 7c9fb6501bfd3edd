"""Framework-neutral datasets: plain bytes plus a shape, for any adapter to turn into tensors.

Images are unsigned bytes (0-255), ``count × C × H × W`` in C order; labels are an
``array('q')`` of class ids (int64, so any number of classes fits).  Real datasets are read
from the official IDX files, gzipped or not:

    <data_dir>/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
    <data_dir>/mnist/...      (same layout)

``synthetic`` data is generated from the seed: each class has a coarse random pattern
(4×4-pixel blocks), and each sample is the average of its class's pattern and uniform
noise, so a network can learn it but not at once.
"""

from __future__ import annotations

import gzip
import random
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import DataError

DATASETS = ("fashion-mnist", "mnist", "synthetic")
IDX_DATASETS = {"fashion-mnist": 10, "mnist": 10}  # name -> classes
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MISSING_HINT = ("install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) "
                "or put the IDX files there")
IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
SYNTHETIC_BLOCK = 4  # side of the constant blocks of a synthetic class pattern


@dataclass(frozen=True)
class Split:
    """One split: ``count`` images of unsigned bytes and their labels."""

    images: bytes
    labels: array

    @property
    def count(self) -> int:
        return len(self.labels)

    def head(self, n: int) -> Split:
        """The first ``n`` samples (all of them when ``n`` is 0 or at least ``count``)."""
        if n <= 0 or n >= self.count:
            return self
        per_image = len(self.images) // self.count
        return Split(self.images[:n * per_image], self.labels[:n])


@dataclass(frozen=True)
class Dataset:
    name: str
    shape: tuple[int, int, int]  # C, H, W
    classes: int
    train: Split
    test: Split


def load(params: dict[str, Any], data_dir: Path) -> Dataset:
    """The dataset a cell's ``params`` ask for, with ``train_limit`` / ``test_limit`` applied."""
    name = params["dataset"]
    if name == "synthetic":
        c, h, w = params["synthetic_shape"]
        ds = synthetic((c, h, w), classes=params["synthetic_classes"], train=params["synthetic_train"],
                       test=params["synthetic_test"], seed=params["seed"])
    elif name in IDX_DATASETS:
        ds = load_idx_dataset(Path(data_dir) / name, name=name, classes=IDX_DATASETS[name])
    else:
        raise DataError(f"unknown dataset {name!r} (expected one of {', '.join(DATASETS)})")
    return Dataset(ds.name, ds.shape, ds.classes,
                   ds.train.head(params["train_limit"]), ds.test.head(params["test_limit"]))


# --- IDX files -------------------------------------------------------------------------


def find_idx(root: Path, stem: str) -> Path:
    """``root/stem`` or ``root/stem.gz``, whichever exists (the uncompressed one first)."""
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"dataset file not found: {root / stem}[.gz]; {MISSING_HINT}")


def read_idx(path: Path, *, magic: int) -> tuple[tuple[int, ...], bytes]:
    """The dimensions and the payload of an IDX file of unsigned bytes, checked against ``magic``."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read: {exc} (truncated or not gzip?)") from exc
    if len(raw) < 4:
        raise DataError(f"{path}: truncated: {len(raw)} bytes, too short for an IDX header")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise DataError(f"{path}: bad magic number 0x{found:08x}, expected 0x{magic:08x} "
                        f"(an IDX file of unsigned bytes with {magic & 0xFF} dimension(s))")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated: {len(raw)} bytes, the header alone needs {header}")
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = 1
    for d in dims:
        expected *= d
    actual = len(raw) - header
    if actual != expected:
        what = "truncated" if actual < expected else "too long"
        raise DataError(f"{path}: {what}: dimensions {'×'.join(map(str, dims))} need {expected} "
                        f"bytes of data, the file has {actual}")
    return dims, raw[header:]


def load_idx_split(root: Path, split: str, *, classes: int) -> tuple[tuple[int, int, int], Split]:
    """One split of an IDX dataset as (shape, Split), with images and labels cross-checked."""
    image_stem, label_stem = IDX_FILES[split]
    image_path, label_path = find_idx(root, image_stem), find_idx(root, label_stem)
    dims, images = read_idx(image_path, magic=IDX_IMAGES_MAGIC)
    (n_labels,), labels = read_idx(label_path, magic=IDX_LABELS_MAGIC)
    if dims[0] != n_labels:
        raise DataError(f"{image_path} holds {dims[0]} images but {label_path} holds {n_labels} labels")
    if labels and max(labels) >= classes:
        raise DataError(f"{label_path}: label {max(labels)} is out of range for {classes} classes")
    return (1, dims[1], dims[2]), Split(images, array("q", list(labels)))


def load_idx_dataset(root: Path, *, name: str, classes: int) -> Dataset:
    """An MNIST-layout dataset (``train-*`` and ``t10k-*`` IDX files) from ``root``."""
    if not root.is_dir():
        raise DataError(f"dataset directory not found: {root} (expected "
                        f"{root / IDX_FILES['train'][0]}[.gz] and the other IDX files); {MISSING_HINT}")
    shape, train = load_idx_split(root, "train", classes=classes)
    test_shape, test = load_idx_split(root, "test", classes=classes)
    if test_shape != shape:
        raise DataError(f"{root}: training images are {shape}, test images {test_shape}")
    return Dataset(name, shape, classes, train, test)


# --- synthetic data --------------------------------------------------------------------

_HALF = bytes(i // 2 for i in range(256))


def _average(a: bytes, b: bytes) -> bytes:
    """Byte-wise floor(a/2) + floor(b/2), done as one big-integer addition (no byte carries)."""
    total = int.from_bytes(a.translate(_HALF), "little") + int.from_bytes(b.translate(_HALF), "little")
    return total.to_bytes(len(a), "little")


def _pattern(rng: random.Random, shape: tuple[int, int, int]) -> bytes:
    """A random image made of constant SYNTHETIC_BLOCK × SYNTHETIC_BLOCK blocks."""
    c, h, w = shape
    bh, bw = -(-h // SYNTHETIC_BLOCK), -(-w // SYNTHETIC_BLOCK)
    out = bytearray()
    for _ in range(c):
        blocks = [rng.randrange(256) for _ in range(bh * bw)]
        for y in range(h):
            row = blocks[(y // SYNTHETIC_BLOCK) * bw:(y // SYNTHETIC_BLOCK + 1) * bw]
            out += bytes(row[x // SYNTHETIC_BLOCK] for x in range(w))
    return bytes(out)


def _synthetic_split(seed: int, split: str, patterns: list[bytes], count: int) -> Split:
    rng = random.Random(f"matrun-synthetic/{seed}/{split}")
    labels = array("q", rng.choices(range(len(patterns)), k=count))
    signal = b"".join([patterns[label] for label in labels])
    return Split(_average(signal, rng.randbytes(len(signal))), labels)


def synthetic(shape: tuple[int, int, int], *, classes: int, train: int, test: int, seed: int) -> Dataset:
    """A learnable dataset generated from ``seed`` alone (same seed, same bytes)."""
    rng = random.Random(f"matrun-synthetic/{seed}/patterns")
    patterns = [_pattern(rng, shape) for _ in range(classes)]
    return Dataset("synthetic", shape, classes,
                   _synthetic_split(seed, "train", patterns, train),
                   _synthetic_split(seed, "test", patterns, test))
