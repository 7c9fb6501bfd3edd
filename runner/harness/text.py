"""Token data for the language models (``models.LANGUAGE_MODELS``): framework-neutral, like
``datasets`` is for images.

A split is one stream of token ids cut into sequences of ``seq_len + 1`` tokens that overlap by
one: a sequence's inputs are its first ``seq_len`` tokens, its targets the last ``seq_len``
(the next token at every position).  A "sample" of a language-model cell is one sequence, so
its throughput in tokens/s is samples/s × ``seq_len``.

Two sources (docs/DATA.md "Text"):

- ``synthetic-text``: generated from the seed alone.  Every token of a ``synthetic_vocab``
  vocabulary has four successors drawn at random, followed with probabilities 0.55, 0.25,
  0.15 and 0.05: one chain (order-1 Markov) from a random first token.  A model can learn it
  (about 1.1 nats a token at best, against ln(vocab) for a guess) but not at once.
- ``fortunes``: the text of Debian's ``fortunes`` package and ``fortunes-min``, which it depends
  on (fortune-mod 1.99.1, BSD licence; 15,217 English epigrams, quotations and definitions in
  43 files, 2.56 MB), staged by ``matrun data import fortunes /usr/share/games/fortunes``.  Read in its own format: plain text
  files whose entries ("cookies") are separated by lines holding only ``%``.  Files are read
  in name order, cookies in file order; every tenth cookie (the 10th, 20th, …) is the test
  split, the rest train.  Tokenised byte by byte (the UTF-8 bytes; vocabulary 256, the
  byte-level base GPT-2's tokenizer also starts from), each cookie followed by a blank line.

Standard library only: this module runs inside framework environments.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DataError

SYNTHETIC_TEXT = "synthetic-text"
FORTUNES = "fortunes"
TEXT_DATASETS = (SYNTHETIC_TEXT, FORTUNES)
BYTE_VOCAB = 256
#: The successors' probabilities of synthetic text, as thresholds of one random byte.
_SUCCESSOR_BYTES = bytes(0 if b < 141 else 1 if b < 205 else 2 if b < 243 else 3 for b in range(256))
SUCCESSORS = 4
TEST_EVERY = 10  # every tenth cookie of the fortunes is a test cookie
FORTUNE_SKIP_SUFFIXES = (".dat", ".u8", ".gz")
#: Bytes (= tokens) of the train and test splits of /usr/share/games/fortunes as Debian bookworm's
#: fortunes 1:1.99.1-7.3 installs it (with fortunes-min, its dependency: 43 files, 15,217
#: cookies): what ``matrun plan`` estimates a fortunes cell's sequences from.
FORTUNES_BYTES = (2_300_292, 261_152)
FORTUNES_HINT = ("install Debian's fortunes (apt-get install fortunes) and run `matrun data import fortunes` "
                 "(it copies /usr/share/games/fortunes into the data directory)")


@dataclass(frozen=True)
class TokenSplit:
    """A stream of token ids cut into ``count`` sequences of ``seq_len + 1`` tokens that
    overlap by one token (sequence i is ``tokens[i*seq_len : (i+1)*seq_len + 1]``)."""

    tokens: array  # 'B' (bytes), 'H' (vocabulary <= 65,536) or 'I'
    seq_len: int

    @property
    def count(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    @property
    def labels(self) -> array:
        """For code that counts samples by their labels (``len(split.labels)``)."""
        return array("B", bytes(self.count))

    def sequence(self, i: int) -> array:
        return self.tokens[i * self.seq_len:(i + 1) * self.seq_len + 1]

    def head(self, n: int) -> TokenSplit:
        if n <= 0 or n >= self.count:
            return self
        return TokenSplit(self.tokens[:n * self.seq_len + 1], self.seq_len)

    def hold_out(self, n: int) -> tuple[TokenSplit, TokenSplit]:
        keep = self.count - n
        cut = keep * self.seq_len
        return (TokenSplit(self.tokens[:cut + 1], self.seq_len),
                TokenSplit(self.tokens[cut:self.count * self.seq_len + 1], self.seq_len))

    def arrays(self, np: Any, limit: int = 0) -> tuple[Any, Any]:
        """(inputs, targets) as two (count, seq_len) int32 numpy arrays."""
        n = self.count if not limit else min(limit, self.count)
        flat = np.frombuffer(self.tokens, dtype={"B": np.uint8, "H": np.uint16}.get(self.tokens.typecode, np.uint32))
        flat = flat[:n * self.seq_len + 1].astype(np.int32)
        x = flat[:n * self.seq_len].reshape(n, self.seq_len)
        y = flat[1:n * self.seq_len + 1].reshape(n, self.seq_len)
        return x, y


def _typecode(vocab: int) -> str:
    return "H" if vocab <= 1 << 16 else "I"


# --- synthetic text ---------------------------------------------------------------------


def successor_table(vocab: int, seed: int) -> list[tuple[int, ...]]:
    """Each token's four successors (the most likely first)."""
    rng = random.Random(f"matrun-synthetic-text/{seed}/chain")
    draw = rng.randrange
    return [tuple(draw(vocab) for _ in range(SUCCESSORS)) for _ in range(vocab)]


def _synthetic_stream(table: list[tuple[int, ...]], seed: int, split: str, sequences: int,
                      seq_len: int) -> TokenSplit:
    vocab = len(table)
    rng = random.Random(f"matrun-synthetic-text/{seed}/{split}")
    out = array(_typecode(vocab))
    n = sequences * seq_len + 1
    token = rng.randrange(vocab)
    choices = rng.randbytes(n - 1).translate(_SUCCESSOR_BYTES)
    append = out.append
    append(token)
    for choice in choices:
        token = table[token][choice]
        append(token)
    return TokenSplit(out, seq_len)


def synthetic_text(*, vocab: int, seq_len: int, train: int, test: int, seed: int) -> tuple[TokenSplit, TokenSplit]:
    """(train, test) of ``train`` and ``test`` sequences of synthetic text from ``seed`` alone."""
    table = successor_table(vocab, seed)
    return (_synthetic_stream(table, seed, "train", train, seq_len),
            _synthetic_stream(table, seed, "test", test, seq_len))


# --- the fortunes -----------------------------------------------------------------------


def fortune_files(root: Path) -> list[Path]:
    """The fortune text files of a directory, in name order (the strfile indexes ``.dat``, the
    ``.u8`` links and anything hidden left out)."""
    if not root.is_dir():
        raise DataError(f"dataset directory not found: {root}; {FORTUNES_HINT}")
    files = sorted(p for p in root.iterdir()
                   if p.is_file() and not p.is_symlink() and not p.name.startswith(".")
                   and not p.name.endswith(FORTUNE_SKIP_SUFFIXES) and p.name != "matrun-import.json")
    if not files:
        raise DataError(f"{root}: no fortune files (plain text, cookies separated by lines of '%'); "
                        f"{FORTUNES_HINT}")
    return files


def cookies(data: bytes) -> list[bytes]:
    """The cookies of one fortune file: the text between lines holding only ``%``, stripped of
    blank lines around them, empty ones dropped."""
    out, current = [], []
    for line in data.split(b"\n"):
        if line.rstrip(b"\r") == b"%":
            out.append(b"\n".join(current).strip(b"\n"))
            current = []
        else:
            current.append(line)
    out.append(b"\n".join(current).strip(b"\n"))
    return [c for c in out if c.strip()]


def read_fortunes(root: Path) -> tuple[bytes, bytes, int]:
    """(train bytes, test bytes, cookies) of the fortunes in ``root``."""
    train, test, n = [], [], 0
    for path in fortune_files(root):
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc}") from exc
        if b"\x00" in data:
            raise DataError(f"{path}: not a fortune file (it holds NUL bytes: a strfile index or binary data)")
        for cookie in cookies(data):
            n += 1
            (test if n % TEST_EVERY == 0 else train).append(cookie + b"\n\n")
    if n < TEST_EVERY:
        raise DataError(f"{root}: {n} cookie(s); at least {TEST_EVERY} are needed for a test split")
    return b"".join(train), b"".join(test), n


def load_fortunes(root: Path, seq_len: int) -> tuple[TokenSplit, TokenSplit]:
    train, test, _ = read_fortunes(root)
    return TokenSplit(array("B", train), seq_len), TokenSplit(array("B", test), seq_len)


def vocab_of(params: dict[str, Any]) -> int:
    """The vocabulary of a language-model cell's data."""
    return params["synthetic_vocab"] if params["dataset"] == SYNTHETIC_TEXT else BYTE_VOCAB
