"""The tensors in one safetensors file, without torch: names, dtypes and shapes from its header, each
tensor read from the file as float32 when used (`read_tensor`; export/pdparams.py reads Paddle's
pickled state dicts with it too).  BF16 and fp8 (E4M3), which numpy lacks, are widened here."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.lazy import LazyMap

_ST_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "BF16": "bf16",
    "F8_E4M3": "e4m3",
    "I64": np.int64,
    "I32": np.int32,
}


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    """float8_e4m3fn by byte (numpy has no fp8): 1 sign, 4 exponent (bias 7), 3 mantissa bits;
    exponent 0 is subnormal; S.1111.111 is NaN (no infinities)."""
    b = np.arange(256)
    exp, man = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    mag = np.where(exp == 0, man * 2.0**-9, (8 + man) * 2.0 ** (exp - 10.0))
    mag = np.where((b & 0x7F) == 0x7F, np.nan, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


E4M3 = _e4m3_table()


def read_tensor(path: Path, offset: int, count: int, kind: Any, shape: list[int]) -> np.ndarray:
    """One tensor of a weight file, as float32 (`kind`: _ST_DTYPES's)."""
    with open(path, "rb") as f:
        f.seek(offset)
        if kind == "bf16":
            arr = bf16_to_f32(np.fromfile(f, np.uint16, count))
        elif kind == "e4m3":
            arr = E4M3[np.fromfile(f, np.uint8, count)]
        else:
            arr = np.fromfile(f, np.dtype(kind), count).astype(np.float32, copy=False)
    if arr.size != count:
        raise CheckpointError(f"{path.name} ends inside a tensor (truncated download?)")
    return arr.reshape(shape)


def read_safetensors(path: Path, u16_is_bf16: bool = False) -> LazyMap:
    """The tensors of one safetensors file, each read as float32 when used (BF16 included, which numpy
    lacks).  PaddleNLP writes bfloat16 tensors as U16 (numpy's view of them): `u16_is_bf16` when its
    config.json says dtype bfloat16."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    out = LazyMap()
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        kind = "bf16" if meta["dtype"] == "U16" and u16_is_bf16 else _ST_DTYPES.get(meta["dtype"])
        if kind is None:
            raise CheckpointError(f"{path.name}: tensor {name} has dtype {meta['dtype']}, not a float type")
        shape, start = [int(d) for d in meta["shape"]], int(meta["data_offsets"][0])
        out.put(
            name,
            read_tensor,
            path,
            base + start,
            math.prod(shape),
            kind,
            shape,
            shape=tuple(shape),
            bf16=kind == "bf16",
        )
    return out
