"""The export → runtime contract, typed: each `rank_<i>/manifest.json` (config.json's `spmd_serve` key,
versioned with it, is served_config.py).

`spmd_serve export` (spmd_serve/export/) writes these records and the runtime (server.py, worker/,
benchmarks) reads them, both only through this module: frozen dataclasses, `write_manifest` /
`read_manifest`, and one `MANIFEST_VERSION` for both files.  A directory written by another version
is refused with one line telling the user to re-export.  Pure Python + numpy: the server checks a
model directory before it imports Paddle.

The KV cache is described, not assumed: `KVLayout` lists the cache tensors of every layer and one
token's shape in each (Llama: K and V of [kv_heads, head_dim]).  A new attention kind (e.g. MLA's
one latent vector per token and layer) is a new layout value, which the pool, the capacity check
and the graphs' input names all follow.

Directories the tool makes itself (the demo model, a static model's conversion) end in `-v<format>`;
`other_format_dirs` finds an earlier version's, which this one never reads, for the user to remove.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from spmd_serve.kv_layout import KVLayout

# 4: the kv_heads pool head-major, [NB, kv_heads, block_size, head_dim] (the graphs' cache inputs);
# 3: one graph per segment for every step (the C++ paged attention; a decode-graph variant only for
# families that trace one: DeepSeek's MLA), per-step statistics (`stats`);
# 2: typed manifest with the KV layout (`kv_cache`); 1 had none
MANIFEST_VERSION = 4
MANIFEST_FILE = "manifest.json"
QUANT_METHODS = ("weight_only_int8", "weight_only_int4")
COLLECTIVES = ("none", "graph", "segments")  # tp = 1 / all-reduce ops in the graph / runtime between segments
REEXPORT = "re-export with this version's `spmd_serve export`"
# An MTP draft (export/deepseek/mtp.py): the target's head graph outputs HIDDEN_ROWS [T, H] next to
# its logits, and the draft's graph takes the rows it reads as its input PREV_HIDDEN [T, H].
HIDDEN_ROWS, PREV_HIDDEN = "hidden_rows", "prev_hidden"


class ManifestError(ValueError):
    """A manifest or served config that this build cannot use; one line naming the file and the fix."""


@dataclass(frozen=True)
class ShardDims:
    """Per-rank sizes of one tensor-parallel shard (identical on every rank)."""

    tp: int
    hidden: int
    head_dim: int
    num_layers: int
    heads: int  # query heads on this rank
    kv_heads: int  # KV heads on this rank (1 when replicated)
    intermediate: int  # MLP units on this rank
    vocab: int  # real vocabulary size (all ranks)
    vocab_local: int  # padded vocab / tp
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool = False  # q/k/v biases, split with their columns

    @property
    def group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.heads // self.kv_heads


# ---------------------------------------------------------------- segments, quantisation


@dataclass(frozen=True)
class SegmentSpec:
    """What the runtime needs to feed one saved graph (`<name>.json`) and route its outputs.  `params`:
    the .pdiparams prefix when not `name` (a variant shares its base graph's); `decode`: the variant
    traced for steps whose every query is one token, when the export has one.  `stats`: outputs
    that are per-step statistics for /metrics, named `<metric>:<layer>` (e.g. `moe_expert_tokens:3`,
    tokens routed to each expert of layer 3 this step)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kv_layers: tuple[int, ...] = ()
    params: str | None = None
    decode: SegmentSpec | None = None
    stats: tuple[str, ...] = ()

    @property
    def params_name(self) -> str:
        return self.params or self.name

    @property
    def gathers_logits(self) -> bool:
        """The last segment's `logits` are gathered over the vocab; any other's `partial` all-reduced."""
        return self.outputs[0] == "logits"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "kv_layers": list(self.kv_layers),
            "params": self.params,
        }
        if self.decode is not None:
            out["decode"] = self.decode.to_json()
        if self.stats:
            out["stats"] = list(self.stats)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SegmentSpec:
        decode = obj.get("decode")
        return cls(
            obj["name"],
            tuple(obj["inputs"]),
            tuple(obj["outputs"]),
            tuple(obj.get("kv_layers", ())),
            obj.get("params"),
            None if decode is None else cls.from_json(decode),
            tuple(obj.get("stats", ())),
        )


@dataclass(frozen=True)
class QuantRecord:
    """Weight-only quantisation of an export (config.json's `spmd_serve.quant` and every manifest's `quant`)."""

    method: str
    bits: int
    group_size: int | None
    scales: str  # in words: per output channel (and input group)
    tensors: tuple[str, ...]  # which weights are quantised
    embed: str  # how the quantised embedding table is held
    unquantised: tuple[str, ...]

    @classmethod
    def from_json(cls, obj: Any) -> QuantRecord | None:
        if obj is None:
            return None
        method = obj.get("method") if isinstance(obj, dict) else obj
        if method not in QUANT_METHODS or not isinstance(obj, dict):
            raise ManifestError(
                f"quant={obj!r} is not supported by this build "
                f"(methods: {', '.join(QUANT_METHODS)}); re-export the model"
            )
        if method == "weight_only_int4" and not obj.get("group_size"):
            raise ManifestError("weight_only_int4 without a group_size; re-export the model")
        return cls(
            method,
            int(obj["bits"]),
            obj.get("group_size"),
            obj["scales"],
            tuple(obj["tensors"]),
            obj["embed"],
            tuple(obj["unquantised"]),
        )


def plain(value: Any) -> Any:
    """JSON form of a record field (dataclasses → dicts; None stays None)."""
    return asdict(value) if hasattr(value, "__dataclass_fields__") else value


# ---------------------------------------------------------------- one rank's manifest


@dataclass(frozen=True)
class Manifest:
    """Everything a rank needs to run its shard, besides the graphs and their params."""

    rank: int
    dims: ShardDims
    kv_cache: KVLayout
    segments: tuple[SegmentSpec, ...]
    collectives: str  # one of COLLECTIVES
    custom_ops: tuple[str, ...]  # our C++ ops the graphs call: register the library before loading
    quant: QuantRecord | None
    inv_freq: tuple[float, ...]  # RoPE inverse frequencies, scaling applied: the runner builds the tables
    segments_kv_int8: tuple[SegmentSpec, ...] | None = None  # graphs reading an int8 pool (USE_CACHE_KV_INT8)
    kv_scales: Mapping[str, Sequence[Sequence[float]]] | None = None  # tensor → layer → KVLayout.scale_shape
    format: int = MANIFEST_VERSION

    @property
    def inv_freq_array(self) -> npt.NDArray[np.float32]:
        return np.asarray(self.inv_freq, np.float32)

    @property
    def has_kv_int8(self) -> bool:
        return self.segments_kv_int8 is not None and self.kv_scales is not None

    def specs(self, kv_int8: bool) -> tuple[SegmentSpec, ...]:
        """The segments for an fp32 or an int8 KV pool."""
        if not kv_int8:
            return self.segments
        if self.segments_kv_int8 is None:
            raise ManifestError("no int8-KV graphs and scales in this export")
        return self.segments_kv_int8

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": self.format,
            "rank": self.rank,
            "dims": asdict(self.dims),
            "kv_cache": self.kv_cache.to_json(),
            "segments": [s.to_json() for s in self.segments],
            "collectives": self.collectives,
            "custom_ops": list(self.custom_ops),
            "quant": plain(self.quant),
            "inv_freq": list(self.inv_freq),
        }
        if self.segments_kv_int8 is not None:
            out["segments_kv_int8"] = [s.to_json() for s in self.segments_kv_int8]
        if self.kv_scales is not None:
            out["kv_scales"] = {k: [list(layer) for layer in v] for k, v in self.kv_scales.items()}
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Manifest:
        if obj["collectives"] not in COLLECTIVES:
            raise ManifestError(f"collectives={obj['collectives']!r} is not one of {', '.join(COLLECTIVES)}")
        int8 = obj.get("segments_kv_int8")
        scales = obj.get("kv_scales")
        return cls(
            rank=int(obj["rank"]),
            dims=ShardDims(**obj["dims"]),
            kv_cache=KVLayout.from_json(obj["kv_cache"]),
            segments=tuple(SegmentSpec.from_json(s) for s in obj["segments"]),
            collectives=obj["collectives"],
            custom_ops=tuple(obj["custom_ops"]),
            quant=QuantRecord.from_json(obj["quant"]),
            inv_freq=tuple(float(x) for x in obj["inv_freq"]),
            segments_kv_int8=None if int8 is None else tuple(SegmentSpec.from_json(s) for s in int8),
            kv_scales=None
            if scales is None
            else {k: tuple(tuple(map(float, layer)) for layer in v) for k, v in scales.items()},
            format=int(obj["format"]),
        )


def write_manifest(rank_dir: Path, m: Manifest) -> Path:
    """Write `rank_dir/manifest.json`; returns its path."""
    path = Path(rank_dir) / MANIFEST_FILE
    path.write_text(json.dumps(m.to_json(), indent=1))
    return path


def read_manifest(rank_dir: str | Path) -> Manifest:
    """`rank_dir/manifest.json` as a Manifest; ManifestError (one line) when it is missing, unreadable,
    of another version or malformed."""
    path = Path(rank_dir) / MANIFEST_FILE
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{path} is missing: {REEXPORT}") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"{path} is unreadable ({e.__class__.__name__}): {REEXPORT}") from None
    if not isinstance(obj, dict) or obj.get("format") != MANIFEST_VERSION:
        found = obj.get("format") if isinstance(obj, dict) else None
        raise ManifestError(f"{path}: export format {found!r}, this build reads {MANIFEST_VERSION}; {REEXPORT}")
    try:
        return Manifest.from_json(obj)
    except ManifestError as e:
        raise ManifestError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ManifestError(f"{path} is malformed ({e.__class__.__name__}: {e}): {REEXPORT}") from None


def other_format_dirs(parent: Path, pattern: str) -> list[Path]:
    """The directories in `parent` named `pattern` (a glob) + `-v<N>` with N another export format than
    this build's, sorted (their temporary `.name.*` twins and other files are not)."""
    found = (p for p in parent.glob(f"{pattern}-v*") if p.is_dir())
    return sorted(p for p in found if (m := re.search(r"-v(\d+)$", p.name)) and int(m[1]) != MANIFEST_VERSION)


def stale_dir_note(path: Path, what: str) -> str:
    """One line naming an earlier version's `what` (an export, a conversion) at `path` and its size."""
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    shown = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
    return f"{path} ({shown}) is an earlier version's {what}, not read by this one: remove it to free the disk"
