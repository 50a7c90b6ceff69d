"""The paged KV pool in device memory for the GPU runner (docs/gpu.md), and the launches that read and
write it: the ops/ kernels by raw pointer, on the stream the rank's predictors run on.

Same layout as the CPU runner's pool (worker/kv_cache.py): per layer a K and a V array
[num_blocks, kv_heads, block_size, head_dim] (head-major), fp32 or (USE_CACHE_KV_INT8) int8 with per-KV-head fp32
scales; slot = block * block_size + offset.  Where the memory comes from is a `DeviceMemory` (the GPU
runner's: Paddle tensors on its device; the tests': host arrays under the kernels' CPU emulation,
tests/support/ops_emulation.py), so the pointer and stream plumbing is tested without a GPU.  Only the
Llama family's `kv_heads` layout: DeepSeek's MLA latent pool has no CUDA kernel yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ops import kv_cache_write as kvw
from ops import paged_attention as pa
from spmd_serve.config import ConfigError
from spmd_serve.kv_layout import KV_HEADS, KVLayout


class DeviceMemory(Protocol):
    """Device arrays for the pool: anything `ops.runtime.as_device_array` takes (a Paddle GPU tensor,
    a cupy array, a `runtime.DeviceArray`)."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def upload(self, host: np.ndarray) -> Any: ...


class DeviceKVPool:
    """`pool.k[layer]` / `pool.v[layer]`: one layer's device arrays; `kv_scales` as KVCachePool's."""

    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        block_size: int,
        memory: DeviceMemory,
        kv_scales: Mapping[str, Sequence] | None = None,
    ) -> None:
        if layout.kind != KV_HEADS:
            raise ConfigError(f"the GPU runner's KV pool holds the kv_heads layout only, not {layout.kind}")
        self.layout, self.num_blocks, self.block_size = layout, num_blocks, block_size
        dtype = np.dtype(np.float32 if kv_scales is None else np.int8)
        shapes = {t.name: (num_blocks, *layout.block_shape(t, block_size)) for t in layout.tensors}
        self.k = [memory.zeros(shapes["k"], dtype) for _ in range(layout.num_layers)]
        self.v = [memory.zeros(shapes["v"], dtype) for _ in range(layout.num_layers)]
        self.scales: list[tuple[Any, Any]] | None = None
        if kv_scales is not None:  # uploaded once: every kernel reads them by pointer
            self.scales = [
                tuple(memory.upload(np.ascontiguousarray(kv_scales[t][layer], np.float32)) for t in ("k", "v"))
                for layer in range(layout.num_layers)
            ]
        self.nbytes = 2 * layout.num_layers * int(np.prod(shapes["k"])) * dtype.itemsize

    @property
    def int8(self) -> bool:
        return self.scales is not None

    def _scales(self, layer: int) -> tuple[Any, Any]:
        return self.scales[layer] if self.scales is not None else (None, None)

    def write(self, layer: int, key: Any, value: Any, slot_mapping: Any, stream: Any) -> None:
        """This step's K/V [T, kv_heads, head_dim] (device) stored at `slot_mapping` [T] int32 (device;
        negative: padding, not stored), queued on `stream` after the graph that produced them."""
        kvw.kv_cache_write_gpu(
            key, value, self.k[layer], self.v[layer], slot_mapping, *self._scales(layer), stream=stream
        )

    def attend(
        self,
        layer: int,
        query: Any,
        block_tables: Any,
        context_lens: Any,
        out: Any,
        stream: Any,
        max_context_len: int | None = None,
        workspace: Any = None,
        partition_blocks: int | None = None,
    ) -> Any:
        """Decode attention of `query` [B, q_heads, head_dim] over the pool's blocks into `out`, on
        `stream`.  `workspace` (>= pa.workspace_bytes): the rank's own split-K buffer, since the
        runner's stream is not the only one in the process (Paddle's allocator may use others);
        `partition_blocks`: None = the kernels' heuristic, 0 = single pass, n = split-K."""
        return pa.paged_attention_gpu(
            query,
            self.k[layer],
            self.v[layer],
            block_tables,
            context_lens,
            *self._scales(layer),
            out=out,
            partition_blocks=partition_blocks,
            max_context_len=max_context_len,
            workspace=workspace,
            stream=stream,
        )
