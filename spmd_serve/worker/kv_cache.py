"""The paged KV cache pool of one rank: per layer a K and a V array [num_blocks, block_size, kv_heads, head_dim].

The arrays are numpy memory shared zero-copy with Paddle tensors (dlpack), and each attention
segment's cache inputs are bound to those tensors once (`share_external_data`).  New K/V are
written in place after the graph ran, addressed by slot (block * block_size + offset), so a step
touches only the slots it writes and the blocks it attends to — never the whole pool.
"""
from __future__ import annotations

import numpy as np

from ops.kv_cache_write import kv_cache_write_cpu


class KVCachePool:
    """`kv_scales` = {"k": [[per KV head] per layer], "v": ...} makes an int8 pool (USE_CACHE_KV_INT8):
    static per-layer, per-KV-head fp32 scales from the export's calibration, the layout of the
    ops/ kernels (q = clip(rint(x / scale[head]), ±127), read back as q * scale[head])."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 kv_scales: dict | None = None) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks, block_size, kv_heads, head_dim)
        dtype = np.float32 if kv_scales is None else np.int8
        # np.zeros maps lazily: untouched blocks cost no resident memory.
        self.k = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.v = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.k_scale = self.v_scale = None
        if kv_scales is not None:
            self.k_scale, self.v_scale = ([np.ascontiguousarray(kv_scales[kind][layer], np.float32)
                                           for layer in range(num_layers)] for kind in ("k", "v"))
        self._tensors: dict[str, object] = {}

    @property
    def int8(self) -> bool:
        return self.k_scale is not None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)

    def tensor(self, name: str):
        """Paddle view of `k_cache_<l>` / `v_cache_<l>` (and of an int8 pool's `k_scale_<l>` /
        `v_scale_<l>`), created once, zero-copy."""
        if name not in self._tensors:
            import paddle

            kind, what, layer = name.split("_")
            if what == "scale":
                arr = (self.k_scale if kind == "k" else self.v_scale)[int(layer)]
            else:
                arr = (self.k if kind == "k" else self.v)[int(layer)]
            self._tensors[name] = paddle.from_dlpack(arr)
        return self._tensors[name]

    def write(self, layer: int, slots: np.ndarray, k_new: np.ndarray, v_new: np.ndarray) -> None:
        """Store this step's K/V [T, kv_heads, head_dim] at `slots` [T] (in place), through the
        ops interface: its numpy twin here, the `kv_cache_write` kernel on GPU pools."""
        scales = (self.k_scale[layer], self.v_scale[layer]) if self.int8 else (None, None)
        kv_cache_write_cpu(k_new, v_new, self.k[layer], self.v[layer], slots, *scales)

