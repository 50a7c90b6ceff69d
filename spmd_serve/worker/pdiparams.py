"""The `.pdiparams` file a saved graph's parameters are in: its index, and which graph name each
tensor belongs to.

Paddle's combined format is the tensors one after another, without names: each a header (format
version, LoD levels, tensor version, a `TensorDesc` protobuf with the data type and dims) and then
its raw bytes.  The loader of `paddle.inference` hands them out in the sorted order of the graph's
parameter names (its `builtin.parameter` ops, "p" in the saved PIR json), and so do we
(`graph_params`): an int8-KV or decode variant that shares its base graph's file gets the same
tensors by position, as Paddle gives them.  `write_skeleton` writes a file of the same tensors with
one element each: what a predictor loads when the rank binds the real ones itself
(worker/params.py).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spmd_serve.config import ConfigError

# framework.proto VarType.Type → the numpy dtype of the bytes (bfloat16 as its uint16 bits: the
# runner binds them as Paddle's BFLOAT16, worker/params.py) and the saved PIR json's name of the type
DTYPES: dict[int, tuple[np.dtype, str]] = {
    code: (np.dtype(np_name), pir)
    for code, np_name, pir in (
        (0, "bool", "t_bool"),
        (1, "int16", "t_i16"),
        (2, "int32", "t_i32"),
        (3, "int64", "t_i64"),
        (4, "float16", "t_f16"),
        (5, "float32", "t_f32"),
        (6, "float64", "t_f64"),
        (20, "uint8", "t_ui8"),
        (21, "int8", "t_i8"),
        (22, "uint16", "t_bf16"),
    )
}
HALF_CODES = (4, 22)  # float16, bfloat16: --dtype weights (holds_half)
_HEAD = struct.Struct("<IQ")  # format version, LoD levels (each: a u64 byte count, then its bytes)
_DESC = struct.Struct("<Ii")  # tensor version, TensorDesc size


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a .pdiparams file: its type code, dims and where its bytes are."""

    code: int
    dims: tuple[int, ...]
    offset: int  # of its first data byte in the file

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.code][0]

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.dims, dtype=np.int64))


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _tensor_desc(desc: bytes) -> tuple[int, tuple[int, ...]]:
    """TensorDesc {required Type data_type = 1; repeated int64 dims = 2} → (type code, dims)."""
    code, dims, i = -1, [], 0
    while i < len(desc):
        key, i = _varint(desc, i)
        if key == 0x08:  # data_type
            code, i = _varint(desc, i)
        elif key == 0x10:  # one dim, unpacked
            d, i = _varint(desc, i)
            dims.append(d)
        elif key == 0x12:  # dims, packed
            n, i = _varint(desc, i)
            end = i + n
            while i < end:
                d, i = _varint(desc, i)
                dims.append(d)
        else:
            raise ValueError(f"unexpected TensorDesc field {key:#x}")
    return code, tuple(dims)


def read_index(path: Path) -> list[TensorEntry]:
    """Every tensor of `path`, in file order, read from the headers alone (the data is skipped).
    ConfigError naming the file if it is cut short or not this format."""
    entries: list[TensorEntry] = []
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            while f.tell() < size:
                _, lod_levels = _HEAD.unpack(f.read(_HEAD.size))
                for _ in range(lod_levels):
                    f.seek(struct.unpack("<Q", f.read(8))[0], 1)
                _, desc_size = _DESC.unpack(f.read(_DESC.size))
                code, dims = _tensor_desc(f.read(desc_size))
                if code not in DTYPES:
                    raise ValueError(f"data type {code} is not a parameter type this runner reads")
                entries.append(TensorEntry(code, dims, f.tell()))
                f.seek(entries[-1].nbytes, 1)
        except (struct.error, ValueError, IndexError) as e:
            raise ConfigError(f"{path}: not a Paddle parameter file ({e}); re-export the model") from None
    if entries and entries[-1].offset + entries[-1].nbytes > size:
        raise ConfigError(f"{path}: cut short ({size} bytes); re-export the model")
    return entries


def holds_half(entries: list[TensorEntry]) -> bool:
    """Whether a parameter file of these entries holds 16-bit float tensors (--dtype bfloat16 or
    float16 weights)."""
    return any(e.code in HALF_CODES for e in entries)


def graph_params(program: Path, entries: list[TensorEntry]) -> list[str]:
    """The parameter names of saved graph `program` (PIR json), in the order of its file's
    `entries`; ConfigError when the two do not match in count, type and dims."""
    ops = json.loads(program.read_text())["program"]["regions"][0]["blocks"][0]["ops"]
    # a "p" op: {"A": [.., name], "O": {"TT": {"D": [{"#": "0.t_f32"}, dims, layout, lod, offset]}}}
    params = sorted((op["A"][-1], op["O"]["TT"]["D"]) for op in ops if op["#"] == "p")
    if len(params) != len(entries):
        raise ConfigError(
            f"{program} has {len(params)} parameters, its parameter file {len(entries)}; re-export the model"
        )
    for (name, (kind, dims, *_)), e in zip(params, entries):
        if kind["#"].split(".")[-1] != DTYPES[e.code][1] or tuple(dims) != e.dims:
            raise ConfigError(
                f"{program}: parameter {name} is {kind['#']} {dims} in the graph but {e.dtype} "
                f"{list(e.dims)} in its parameter file; re-export the model"
            )
    return [name for name, _ in params]


def write_skeleton(entries: list[TensorEntry], path: Path) -> None:
    """A parameter file of `entries`' types with one element each (dims [1])."""
    with open(path, "wb") as f:
        for e in entries:
            desc = bytes([0x08, e.code, 0x12, 1, 1])  # data_type = code, dims = [1] (packed)
            f.write(_HEAD.pack(0, 0) + _DESC.pack(0, len(desc)) + desc + bytes(e.dtype.itemsize))
