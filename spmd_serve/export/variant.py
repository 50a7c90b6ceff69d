"""`GraphVariant`: which graph of a segment is traced, as a value the stages read (nothing mutates).

Every attention segment is traced up to four times from the same stages and parameters: the general
graph, the decode graph (every query one token: no grid), and both again reading an int8 KV pool.
The variants share the base graph's .pdiparams and are named `<name>.kv8`, `<name>.dec`,
`<name>.kv8.dec`.  `cpp_ops` (the export may call ops/paddle_ext.py's C++ ops) decides which C++
kernels the decode graphs use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphVariant:
    kv_int8: bool = False  # the pool is int8 with per-head fp32 scales (graph inputs `<t>_scale_<l>`)
    decode: bool = False  # every sequence of the step has one new token
    cpp_ops: bool = False  # graphs may call our C++ ops

    @property
    def fused_decode_attention(self) -> bool:
        """RoPE, the pool write and attention in the one `spmd_decode_attention` op (fp32 pool only):
        the graph writes this step's K/V itself, so it has no `<t>_new_<l>` outputs."""
        return self.decode and not self.kv_int8 and self.cpp_ops

    @property
    def small_batch_linear(self) -> bool:
        """The decode graphs' matmuls (steps of 1-4 rows) go through `spmd_linear[_int8]` (C++ GEMV)."""
        return self.decode and self.cpp_ops

    def graph_name(self, base: str) -> str:
        return base + (".kv8" if self.kv_int8 else "") + (".dec" if self.decode else "")


GENERAL = GraphVariant()
