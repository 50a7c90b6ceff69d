"""The paged KV cache pool of one rank, laid out as the manifest's `KVLayout` says: per layer and
cache tensor an array [num_blocks, *layout.block_shape] (Llama: K and V of [num_blocks, kv_heads,
block_size, head_dim], head-major; MLA: [num_blocks, block_size, K]).

The arrays are numpy memory shared zero-copy with Paddle tensors (dlpack), and each attention
segment's cache inputs are bound to those tensors once (`share_external_data`).  New entries are
written in place after the graph ran, addressed by slot (block * block_size + offset), so a step
touches only the slots it writes and the blocks it attends to — never the whole pool.  How a
layout's entries are written is its kind's writer (`WRITERS`): a new layout kind adds one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ops.kv_cache_write import kv_cache_write_cpu
from spmd_serve.kv_layout import KV_HEADS, MLA_LATENT, KVLayout
from spmd_serve.worker.huge_pages import mapped_zeros


def _zeros(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    n = int(np.prod(shape))
    return mapped_zeros(n * np.dtype(dtype).itemsize).view(dtype)[:n].reshape(shape)


class KVCachePool:
    """`kv_scales` = {tensor: [scales of `layout.scale_shape`] per layer} makes an int8 pool
    (USE_CACHE_KV_INT8): static fp32 scales from the export's calibration, the layout of the ops/
    kernels (q = clip(rint(x / scale[head]), ±127), read back as q * scale[head]); `clipped` counts
    per cache tensor the entries this pool's own writes clipped (a graph's paged-attention op that
    writes the pool itself counts in the op library: ops.paddle_ext.kv_int8_clipped).
    `pool.<tensor>[layer]` is one layer's array of a cache tensor, e.g. `pool.k[0]`."""

    def __init__(
        self, layout: KVLayout, num_blocks: int, block_size: int, kv_scales: Mapping[str, Sequence] | None = None
    ) -> None:
        self.layout, self.num_blocks, self.block_size = layout, num_blocks, block_size
        dtype = np.float32 if kv_scales is None else np.int8
        # each in a mapping of its own: untouched blocks cost no resident memory, whatever the heap
        # holds (a calloc'd array can be a freed block, zeroed by writing it: a whole pool's worth)
        self.caches: dict[str, list[np.ndarray]] = {
            t.name: [_zeros((num_blocks, *layout.block_shape(t, block_size)), dtype) for _ in range(layout.num_layers)]
            for t in layout.tensors
        }
        self.scales: dict[str, list[np.ndarray]] | None = None
        self.clipped = dict.fromkeys(layout.names(), 0)
        if kv_scales is not None:
            self.scales = {
                t: [np.ascontiguousarray(kv_scales[t][layer], np.float32) for layer in range(layout.num_layers)]
                for t in layout.names()
            }
        self._arrays: dict[str, np.ndarray] = {}  # graph input name → array
        for layer in range(layout.num_layers):
            self._arrays.update(zip(layout.cache_inputs(layer), (self.caches[t][layer] for t in layout.names())))
            if self.scales is not None:
                self._arrays.update(zip(layout.scale_inputs(layer), (self.scales[t][layer] for t in layout.names())))
        self._tensors: dict[str, object] = {}

    def __getattr__(self, name: str) -> list[np.ndarray]:
        caches = self.__dict__.get("caches", {})
        if name in caches:
            return caches[name]
        raise AttributeError(name)

    @property
    def int8(self) -> bool:
        return self.scales is not None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for arrays in self.caches.values() for a in arrays)

    def __contains__(self, name: str) -> bool:
        """Whether graph input `name` (e.g. `k_cache_0`, an int8 pool's `k_scale_0`) is the pool's."""
        return name in self._arrays

    def tensor(self, name: str):
        """Paddle view of graph input `name`'s array, created once, zero-copy."""
        if name not in self._tensors:
            import paddle

            self._tensors[name] = paddle.from_dlpack(self._arrays[name])
        return self._tensors[name]

    def write(self, layer: int, slots: np.ndarray, *new: np.ndarray) -> None:
        """Store this step's entries (one [T, *token_shape] array per cache tensor, in layout order)
        at `slots` [T], in place."""
        WRITERS[self.layout.kind](self, layer, slots, new)


def _write_kv_heads(pool: KVCachePool, layer: int, slots: np.ndarray, new: Sequence[np.ndarray]) -> None:
    """K/V [T, kv_heads, head_dim] through the ops interface: its numpy twin here, the
    `kv_cache_write` kernel on GPU pools."""
    k_new, v_new = new
    scales = (pool.scales["k"][layer], pool.scales["v"][layer]) if pool.scales is not None else (None, None)
    k_clipped, v_clipped = kv_cache_write_cpu(
        k_new, v_new, pool.caches["k"][layer], pool.caches["v"][layer], slots, *scales
    )
    pool.clipped["k"] += k_clipped
    pool.clipped["v"] += v_clipped


def _write_latent(pool: KVCachePool, layer: int, slots: np.ndarray, new: Sequence[np.ndarray]) -> None:
    """MLA's latent|rope-key vectors [T, K] at their slots (fp32 pools only: no int8 scales)."""
    (latent,) = new
    cache = pool.caches["latent"][layer]
    cache.reshape(-1, cache.shape[-1])[slots] = latent  # [NB * bs, K] view of the pool


WRITERS: dict[str, Callable[[KVCachePool, int, np.ndarray, Sequence[np.ndarray]], None]] = {
    KV_HEADS: _write_kv_heads,
    MLA_LATENT: _write_latent,
}
