"""Reading the files of a Paddle inference model: parameter names from its program, tensors from its `.pdiparams`.

What `paddle.jit.save` / `save_inference_model` writes, and the original tool publishes one of per
rank (`rank_<i>/model.json` + `model.pdiparams` with Paddle 3, `model.pdmodel` + `model.pdiparams`
with Paddle 2):

* the program: Paddle 3's PIR JSON, whose `builtin.parameter` ops (`"#": "p"`) carry each
  parameter's name as the last string of their attributes, or Paddle 2's `ProgramDesc` protobuf,
  whose persistable dense-tensor variables are the parameters;
* `.pdiparams`: every parameter, in the byte order of the sorted names (how Paddle's predictor loads
  them: `load_combine` over the sorted persistable names), each one a serialised dense tensor:
  u32 version, u64 LoD levels (+ each level), u32 version, i32 size + `TensorDesc` protobuf
  (data type, dims; Paddle's framework_pb2 reads it), then the raw data.

The program's ops are never loaded (they are the original tool's fused GPU ops), so nothing here
needs them registered; the tensors are memory-mapped and only read when used.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from spmd_serve.export.errors import CheckpointError

PROGRAM_FILES = ("model.json", "model.pdmodel")
PARAMS_FILE = "model.pdiparams"
# numpy has no bfloat16: such tensors are read as this tagged 16-bit type (see to_float32)
BF16_DTYPE = np.dtype([("bf16", "<u2")])
# Paddle's VarType data types → numpy
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype(np.bool_),
    1: np.dtype(np.int16),
    2: np.dtype(np.int32),
    3: np.dtype(np.int64),
    4: np.dtype(np.float16),
    5: np.dtype(np.float32),
    6: np.dtype(np.float64),
    20: np.dtype(np.uint8),
    21: np.dtype(np.int8),
    22: BF16_DTYPE,
}
_LOD_TENSOR = 7  # VarType.LOD_TENSOR: what a parameter is in a Paddle 2 ProgramDesc


def has_inference_model(d: Path) -> bool:
    return (d / PARAMS_FILE).is_file() and any((d / f).is_file() for f in PROGRAM_FILES)


def static_rank_dirs(ckpt: Path) -> list[Path]:
    """The directories holding a static model's ranks, in rank order ([] when `ckpt` is not one)."""
    ranks = {int(m.group(1)): p for p in ckpt.glob("rank_*") if (m := re.fullmatch(r"rank_(\d+)", p.name))}
    found = [ranks[i] for i in sorted(ranks) if has_inference_model(ranks[i])]
    return found or ([ckpt] if has_inference_model(ckpt) else [])


def is_static_export(ckpt: Path) -> bool:
    """Whether `ckpt` is a Paddle inference model directory (the original tool's static model)."""
    return bool(static_rank_dirs(Path(ckpt)))


def _pir_parameter_names(node: object, out: list[str]) -> None:
    if isinstance(node, dict):
        if node.get("#") in ("p", "builtin.parameter"):
            out += [a for a in node.get("A", []) if isinstance(a, str)][-1:]
        for v in node.values():
            _pir_parameter_names(v, out)
    elif isinstance(node, list):
        for v in node:
            _pir_parameter_names(v, out)


def parameter_names(d: Path) -> list[str]:
    """The parameter names of the program in `d` (model.json or model.pdmodel), sorted as saved."""
    if (d / "model.json").is_file():
        try:
            program = json.loads((d / "model.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{d / 'model.json'} is unreadable: {e}") from None
        names: list[str] = []
        _pir_parameter_names(program.get("program", program), names)
        return sorted(set(names))
    from paddle.base.proto import framework_pb2

    try:
        desc = framework_pb2.ProgramDesc.FromString((d / "model.pdmodel").read_bytes())
    except (OSError, DecodeError) as e:
        raise CheckpointError(f"{d / 'model.pdmodel'} is not a Paddle program: {e}") from None
    return sorted({v.name for v in desc.blocks[0].vars if v.persistable and v.type.type == _LOD_TENSOR})


def read_params(d: Path) -> dict[str, np.ndarray]:
    """name → tensor (a read-only view of the memory-mapped file; BF16 as BF16_DTYPE) of the model in `d`."""
    from paddle.base.proto import framework_pb2

    names, path = parameter_names(d), d / PARAMS_FILE
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if path.stat().st_size else b""
    data = np.frombuffer(buf, np.uint8)
    out: dict[str, np.ndarray] = {}
    pos = 0
    try:
        for name in names:
            (lod_levels,) = struct.unpack_from("<Q", buf, pos + 4)
            pos += 12
            for _ in range(lod_levels):
                (n,) = struct.unpack_from("<Q", buf, pos)
                pos += 8 + n
            (desc_len,) = struct.unpack_from("<i", buf, pos + 4)
            pos += 8
            desc = framework_pb2.VarType.TensorDesc.FromString(bytes(data[pos : pos + desc_len]))
            dtype, dims = desc.data_type, list(desc.dims)
            pos += desc_len
            if dtype not in _DTYPES:
                raise CheckpointError(f"{path}: parameter {name} has Paddle data type {dtype}, which is not a tensor")
            count = int(np.prod(dims, dtype=np.int64))
            size = count * _DTYPES[dtype].itemsize
            if pos + size > data.size:
                raise struct.error("truncated")
            out[name] = data[pos : pos + size].view(_DTYPES[dtype]).reshape(dims)
            pos += size
    except (struct.error, IndexError, ValueError, DecodeError):
        raise CheckpointError(
            f"{path} ends before its {len(names)} parameters do (at {name}): truncated, or not the file its "
            "program describes"
        ) from None
    if pos != data.size:
        raise CheckpointError(f"{path} holds more than the {len(names)} parameters its program lists")
    return out


def to_float32(a: np.ndarray) -> np.ndarray:
    """A float tensor of any stored precision (BF16 included) as float32."""
    if a.dtype == BF16_DTYPE:
        return (a["bf16"].astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, np.float32)
