"""`GraphVariant`: which graph of a segment is traced, as a value the stages read (nothing mutates).

An attention segment is traced once for the fp32 KV pool and, with int8-KV scales, once more for an
int8 pool (`<name>.kv8`, sharing the base graph's .pdiparams).  `cpp_ops` (the export may call
ops/paddle_ext.py's C++ ops) makes every step's graph the fast one: the C++ GEMMs, norms, SwiGLU
and paged attention, whatever the step (prefill chunks, decodes, both) and whatever the model's
size.  Without it (`--graph-ops paddle`) the graphs are Paddle's own ops.  A family whose attention
has no C++ op for chunks of queries (`ModelFamily.decode_graphs`: DeepSeek's MLA) also traces a
decode graph (`decode`: every query one token, `<name>.dec`) whose attention is its C++ decode op.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphVariant:
    kv_int8: bool = False  # the pool is int8 with per-head fp32 scales (graph inputs `<t>_scale_<l>`)
    cpp_ops: bool = False  # graphs may call our C++ ops
    decode: bool = False  # every sequence of the step has one new token (ModelFamily.decode_graphs)
    # Paddle's attention over the padded grid even with the C++ ops (which then run the linears and
    # norms): the export's eager calibration passes (export/calibrate.py), which attend a window at
    # its own positions with no pool; never traced
    grid_attention: bool = False

    @property
    def paged_attention(self) -> bool:
        """RoPE, the pool write and attention in the one `spmd_paged_attention` op over the flat
        token layout (`spmd_paged_attention_int8` for an int8 pool): the graph writes this step's K/V
        itself, so it has no `<t>_new_<l>` outputs."""
        return self.cpp_ops and not self.grid_attention

    @property
    def fused_decode_attention(self) -> bool:
        """A decode graph's attention in one C++ op that also writes the pool (fp32 pool only), so
        the graph has no new-cache outputs (DeepSeek: `spmd_mla_decode`)."""
        return self.decode and not self.kv_int8 and self.cpp_ops

    def graph_name(self, base: str) -> str:
        return base + (".kv8" if self.kv_int8 else "") + (".dec" if self.decode else "")


GENERAL = GraphVariant()
