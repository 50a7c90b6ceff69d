"""config.json's `spmd_serve` key: what `spmd_serve export` recorded about a served directory as a whole
(CONTRACT §7), and the dtypes this build can run.  Versioned with the rank manifests (manifest.py):
a directory written by another version is refused with one line telling the user to re-export.
Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from spmd_serve.manifest import MANIFEST_VERSION, REEXPORT, ManifestError, QuantRecord, plain


@dataclass(frozen=True)
class ServedConfig:
    """What `spmd_serve export` records in the served directory's config.json (CONTRACT §7).
    `options`: the architecture family's options (e.g. rope_scaling), written next to the fields."""

    tp: int
    dtype: str
    quant: QuantRecord | None
    kv_int8: bool
    graph_ops: str  # "cpp" or "paddle"
    source: Mapping[str, Any]  # what was read: format, files, architecture, dtype
    options: Mapping[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_VERSION

    def to_json(self) -> dict[str, Any]:
        core = {
            "format": self.format,
            "tp": self.tp,
            "dtype": self.dtype,
            "quant": plain(self.quant),
            "kv_int8": self.kv_int8,
            "graph_ops": self.graph_ops,
            "source": dict(self.source),
        }
        return {**core, **self.options}

    @classmethod
    def from_json(cls, obj: Any) -> ServedConfig:
        """Parse and check what this build can run; ManifestError (one line) otherwise."""
        if not isinstance(obj, dict):
            raise ManifestError("the `spmd_serve` key must hold a JSON object (re-export the model)")
        if obj.get("format") != MANIFEST_VERSION:
            raise ManifestError(f"export format {obj.get('format')!r}, this build reads {MANIFEST_VERSION}; {REEXPORT}")
        quant = QuantRecord.from_json(obj.get("quant"))
        known = {f.name for f in fields(cls)}
        try:
            return cls(
                tp=int(obj["tp"]),
                dtype=obj.get("dtype", "float32"),
                quant=quant,
                kv_int8=bool(obj.get("kv_int8")),
                graph_ops=obj.get("graph_ops", "paddle"),
                source=obj.get("source") or {},
                options={k: v for k, v in obj.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(
                f"the `spmd_serve` key is malformed ({e.__class__.__name__}: {e}); {REEXPORT}"
            ) from None


DTYPES = ("float32", "float16", "bfloat16")
AUTO_DTYPE = "auto"  # the export's default: the checkpoint's own where that loses nothing (pipeline.export_dtype)
# What an export's dtype holds in 16 bits: the weights (export/layers.py); the graphs compute in
# float32, so every build runs them.  (Measured on the CPU build of Paddle 3.3.1: float16 and
# bfloat16 have no CPU kernels for matmul, rsqrt, pow/mean, softmax, silu or cos, only cast, concat,
# embedding and for bfloat16 gather: graphs computing in them would need a GPU build.)


def check_dtype_runnable(dtype: str) -> None:
    """Raise ManifestError (one line) unless `dtype` is one an export can hold its weights in."""
    if dtype not in DTYPES:
        raise ManifestError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
