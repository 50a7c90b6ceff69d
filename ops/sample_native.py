"""The CPU sampler's per-element steps in C (ops/cpu_kernels/sample_draw.cc), bit for bit the numpy
twin's (`sample_twin.exp2_weight` and `_draw`, which stay the oracle), for `sample_twin.sample_cpu`.

`kernels()` gives them only where this process has already loaded the C++ op library (a CPU
server's ranks do at start-up, ops/paddle_ext.load): it never builds it, so a process without the
library (the device machine's oracle, a unit test) samples with the numpy steps, as before.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

_P = ctypes.c_void_p


class NativeSteps:
    """`exp2_weight(d)` and `draw(s, q, top_k, top_p, x0, n)` with the twin's signatures and results."""

    def __init__(self, lib: Any) -> None:
        self._weight = lib.spmd_exp2_weight
        self._weight.argtypes = [_P, _P, ctypes.c_long]
        self._weight.restype = None
        self._draw = lib.spmd_sample_draw
        self._draw.argtypes = [_P, _P, ctypes.c_long, ctypes.c_long, ctypes.c_float, ctypes.c_uint64, ctypes.c_long]
        self._draw.argtypes += [_P, _P, _P, _P]
        self._draw.restype = ctypes.c_long

    def exp2_weight(self, d: np.ndarray) -> np.ndarray:
        d = np.ascontiguousarray(d, np.float32)
        q = np.empty(d.shape, np.uint32)
        self._weight(d.ctypes.data, q.ctypes.data, d.size)
        return q

    def draw(
        self, s: np.ndarray, q: np.ndarray, top_k: int, top_p: np.float32, x0: int, n: int
    ) -> tuple[np.ndarray, int, int, int]:
        """(the first min(n, kept) ranks' ids, the drawn token, the kept weight, the kept count)."""
        s, q = np.ascontiguousarray(s, np.float32), np.ascontiguousarray(q, np.uint32)
        ids = np.empty(max(n, 1), np.int64)
        token, total, kept = ctypes.c_long(), ctypes.c_uint64(), ctypes.c_long()
        refs = [ctypes.addressof(v) for v in (token, total, kept)]
        count = self._draw(s.ctypes.data, q.ctypes.data, s.size, top_k, float(top_p), x0, n, ids.ctypes.data, *refs)
        return ids[:count], token.value, total.value, kept.value


def kernels() -> NativeSteps | None:
    """The C steps when this process has loaded the op library, else None (never a build here)."""
    from ops import paddle_ext

    if not paddle_ext.load.cache_info().currsize:
        return None
    return _steps()


@functools.lru_cache(maxsize=1)
def _steps() -> NativeSteps:
    from ops import paddle_ext

    return NativeSteps(paddle_ext.load())
