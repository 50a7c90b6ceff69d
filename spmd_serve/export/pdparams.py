"""Paddle's pickled state dicts (`model_state.pdparams`, what PaddleNLP's `save_pretrained` writes
without safetensors): names and shapes from the pickle, each array read from the file when used.

`paddle.load` unpickles the whole file, so a PaddleNLP checkpoint was held in memory at once (twice
for bfloat16, widened to float32): a 70B one in bfloat16 needed 280 GB before the export began.
Here a pickle is walked by the pure-Python unpickler with two changes:

* an array's bytes (BINBYTES / BINBYTES8 outside a pickle frame: pickle writes every large payload
  outside its frames) are skipped with a seek, their file offset kept in their place; numpy's
  `_reconstruct` builds a stub that records dtype, shape and that offset (`_ArraySpan`), and the
  tensor is read by `weight_files.read_tensor` when used.  Small arrays inside a frame are read.
* only the globals such a file needs can be named (numpy's array and dtype, Paddle's tensor
  reductions: `tuple`, and `eval` of the one expression `data`; `OrderedDict`; `_codecs.encode`
  for protocol 2's bytes).  `paddle.load` would import and call whatever the pickle names; a file
  naming anything else is refused with that name.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import pickle
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.lazy import LazyMap, constant, transposed
from spmd_serve.export.weight_files import bf16_to_f32, read_tensor

_UNPACKED = "UnpackBigParamInfor@@"  # (sic) Paddle's key for arrays saved in slices (protocol 2/3)
_NAMES = "StructuredToParameterName@@"  # Paddle's structured-name table: not a tensor


class _Truncated(Exception):
    """The file ends before an array's bytes do."""


class _Span:
    """Bytes left in the file: `size` bytes at `offset`."""

    def __init__(self, offset: int, size: int) -> None:
        self.offset, self.size = offset, size


class _ArraySpan:
    """What numpy's pickled ndarray says of itself (its `__setstate__` arguments), its data a _Span or
    the bytes themselves."""

    def __setstate__(self, state: tuple) -> None:
        _version, shape, dtype, fortran, raw = state
        if not isinstance(dtype, np.dtype) or dtype.kind not in "fiu":
            raise CheckpointError(f"an array of dtype {dtype} (expected numbers)")
        self.shape, self.dtype, self.fortran, self.raw = tuple(int(d) for d in shape), dtype, bool(fortran), raw


def _reconstruct(_cls: Any, _shape: Any, _typecode: Any) -> _ArraySpan:
    return _ArraySpan()


def _eval_data(expr: str, env: dict) -> Any:
    """Paddle reduces a DenseTensor to eval('data', {'data': array}): that and nothing else."""
    if expr != "data" or not isinstance(env, dict) or "data" not in env:
        raise CheckpointError(f"the pickle evaluates {expr!r} (only Paddle's 'data' is read)")
    return env["data"]


def _encode(text: str, encoding: str = "latin1") -> bytes:  # protocol 2's bytes: _codecs.encode(str, 'latin1')
    return text.encode(encoding)


_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("builtins", "tuple"): tuple,
    ("builtins", "eval"): _eval_data,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _encode,
}


class _SpanUnpickler(pickle._Unpickler):  # the pure-Python one: its opcodes can be replaced
    # what the pure-Python unpickler has and typeshed does not declare (it types _Unpickler as Unpickler)
    proto: int
    read: Callable[[int], bytes]
    append: Callable[[Any], None]
    _unframer: Any
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f: io.BufferedReader) -> None:
        super().__init__(f)
        self._f = f

    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3:  # Python 2's names, as pickle's own find_class maps them
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _GLOBALS.get((module, name))
        if found is None:
            raise CheckpointError(f"the pickle names {module}.{name}, which a Paddle state dict does not")
        return found

    def _payload(self, n: int) -> bytes | _Span:
        frame = self._unframer.current_frame
        if frame is not None:
            here = frame.tell()
            end = frame.seek(0, io.SEEK_END)
            frame.seek(here)
            if here < end:
                return self.read(n)  # inside a frame: a small array, read
            self._unframer.current_frame = None
        span = _Span(self._f.tell(), n)
        if self._f.seek(n, io.SEEK_CUR) > self._file_size:
            raise _Truncated
        return span

    def load_binbytes(self) -> None:
        (n,) = struct.unpack("<I", self.read(4))
        self.append(self._payload(n))

    def load_binbytes8(self) -> None:
        (n,) = struct.unpack("<Q", self.read(8))
        self.append(self._payload(n))

    dispatch[pickle.BINBYTES[0]] = load_binbytes  # type: ignore[assignment]
    dispatch[pickle.BINBYTES8[0]] = load_binbytes8  # type: ignore[assignment]

    def load(self) -> Any:
        self._file_size = self._f.seek(0, io.SEEK_END)
        self._f.seek(0)
        return super().load()


def _array_of(path: Path, a: _ArraySpan) -> tuple[tuple, tuple, bool]:
    """(LazyMap.put's fn and args, shape, stored as bfloat16) of one pickled array."""
    bf16 = a.dtype == np.uint16  # Paddle stores bfloat16 as uint16
    order = a.shape[::-1] if a.fortran else a.shape  # F order: the transpose's C layout
    if isinstance(a.raw, _Span):
        kind = "bf16" if bf16 else a.dtype.str
        thunk = partial(read_tensor, path, a.raw.offset, a.raw.size // a.dtype.itemsize, kind, list(order))
    else:
        raw = np.frombuffer(bytes(a.raw), a.dtype).reshape(order)
        thunk = partial(constant, bf16_to_f32(raw) if bf16 else raw.astype(np.float32))
    return ((transposed, thunk) if a.fortran else (thunk,)), a.shape, bf16


def read_pdparams(path: Path) -> LazyMap:
    """The arrays of one pdparams file, each read as float32 when used (see the module docstring)."""
    try:
        with open(path, "rb") as f:
            state = _SpanUnpickler(f).load()
    except _Truncated:
        raise CheckpointError(f"{path.name} ends inside a tensor (truncated download?)") from None
    except CheckpointError as e:
        raise CheckpointError(f"{path.name}: {e}") from None
    except Exception as e:  # whatever a damaged pickle makes the unpickler raise (KeyError: no such opcode)
        raise CheckpointError(f"{path.name} is not a readable Paddle state dict ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path.name} holds a {type(state).__name__}, not a state dict")
    unpacked = state.get(_UNPACKED) or {}
    sliced = {p for info in unpacked.values() for p in info["slices"]}
    out, slices = LazyMap(), LazyMap()
    for key, value in state.items():
        if key in (_UNPACKED, _NAMES):
            continue
        if isinstance(value, tuple) and len(value) == 2:  # Paddle's Tensor reduction: (name, array)
            value = value[1]
        if not isinstance(value, _ArraySpan):
            raise CheckpointError(f"{path.name}: {key} is a {type(value).__name__}, not an array")
        args, shape, bf16 = _array_of(path, value)
        (slices if key in sliced else out).put(str(key), *args, shape=shape, bf16=bf16)
    for key, info in unpacked.items():  # an array saved flattened, in slices
        shape = tuple(int(d) for d in info["OriginShape"])
        out.put(key, _joined, [slices.thunk(p) for p in info["slices"]], shape, shape=shape)
    return out


def _joined(parts: list, shape: tuple) -> np.ndarray:
    return np.concatenate([p().ravel() for p in parts]).reshape(shape)
