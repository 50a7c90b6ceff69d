"""The paged KV pool's layout: which cache tensors each layer holds per token, and their names.

Written by export into the manifest (`Manifest.kv_cache`) and read by the runtime: the pool
(worker/kv_cache.py), the capacity check and the graphs' cache inputs all follow it, so a model
family with another cache (MLA's one latent vector per token and layer) is a new layout value, not
an edit of the runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KV_HEADS = "kv_heads"  # layout kind: K and V per KV head (Llama, Qwen2); written by ops.kv_cache_write
MLA_LATENT = "mla_latent"  # layout kind: MLA's compressed latent + shared rope key per token (DeepSeek-V2/V3)


@dataclass(frozen=True)
class CacheTensor:
    """One cache tensor of every layer: graph input `<name>_cache_<l>` ([blocks, *KVLayout.block_shape]),
    output `<name>_new_<l>` ([T, *token_shape]: this step's entries, when the graph does not write
    them itself), and with an int8 pool input `<name>_scale_<l>` (fp32 dequantisation scales)."""

    name: str
    token_shape: tuple[int, ...]


@dataclass(frozen=True)
class KVLayout:
    """What the paged pool holds per token and layer.  `kind` names how a step's entries are written
    (the pool's writer) and which host tables address them; `scale_shape` is one layer's and tensor's
    int8 scales (per KV head for `kv_heads`)."""

    kind: str
    num_layers: int
    tensors: tuple[CacheTensor, ...]
    scale_shape: tuple[int, ...] = ()

    @classmethod
    def kv_heads(cls, num_layers: int, kv_heads: int, head_dim: int) -> KVLayout:
        """Llama's cache: K and V of [kv_heads, head_dim] per token, int8 scales per KV head."""
        shape = (kv_heads, head_dim)
        return cls(KV_HEADS, num_layers, (CacheTensor("k", shape), CacheTensor("v", shape)), (kv_heads,))

    @classmethod
    def mla_latent(cls, num_layers: int, kv_lora_rank: int, rope_dim: int) -> KVLayout:
        """DeepSeek's MLA cache: per token and layer one vector, the normalised `kv_lora_rank` latent
        followed by the shared (roped) `rope_dim` key; no per-head K and V, no int8 scales."""
        return cls(MLA_LATENT, num_layers, (CacheTensor("latent", (kv_lora_rank + rope_dim,)),))

    def bytes_per_token(self, int8: bool = False) -> int:
        """Pool bytes per token over every layer (an int8 pool's scales are per layer: negligible)."""
        return self.num_layers * sum(math.prod(t.token_shape) for t in self.tensors) * (1 if int8 else 4)

    def block_shape(self, tensor: CacheTensor, block_size: int) -> tuple[int, ...]:
        """One block of `tensor` in the pool: `kv_heads` head-major, [kv_heads, block_size, head_dim]
        (a KV head's rows of a block lie together: attention reads them 1.2-1.3x faster from memory at
        long contexts, benchmarks/RESULTS.md "Session 42"); other kinds [block_size, *token_shape].
        The pool of a layer is [num_blocks, *block_shape]; -1 as block_size gives a graph input's spec."""
        if self.kind == KV_HEADS:
            heads, *rest = tensor.token_shape
            return (heads, block_size, *rest)
        return (block_size, *tensor.token_shape)

    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    def cache_inputs(self, layer: int) -> list[str]:
        return [f"{t.name}_cache_{layer}" for t in self.tensors]

    def scale_inputs(self, layer: int) -> list[str]:
        return [f"{t.name}_scale_{layer}" for t in self.tensors]

    def new_outputs(self, layer: int) -> list[str]:
        return [f"{t.name}_new_{layer}" for t in self.tensors]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "num_layers": self.num_layers,
            "scale_shape": list(self.scale_shape),
            "tensors": [{"name": t.name, "token_shape": list(t.token_shape)} for t in self.tensors],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> KVLayout:
        return cls(
            obj["kind"],
            int(obj["num_layers"]),
            tuple(CacheTensor(t["name"], tuple(t["token_shape"])) for t in obj["tensors"]),
            tuple(obj.get("scale_shape", ())),
        )
