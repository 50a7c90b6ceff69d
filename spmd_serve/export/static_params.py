"""`StaticParams`: the parameters of a static inference model's ranks, taken by name as float32.

A family's `static_to_hf` (e.g. export/llama/static.py) reads the original tool's fused per-rank
parameters through it: unquantised ones in any float precision (BF16 too), weight-only ones unpacked
from `weight_quantize`'s layout (export/weight_layout.py, the layout found on the first one and
checked on every other) and dequantised with their `<name>_scale`.  It records what was taken, so
export/static_model.py can tell which parameters no family mapping accounts for, and what it saw
(bits, groups, layout) for the conversion's record.  Every error names the rank's file and the
parameter.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.static_files import read_params, to_float32
from spmd_serve.export.weight_layout import detect_layout, weight_only_to_float


class StaticParams:
    """Every rank's parameters of one static model, taken by name: float32, weight-only ones unpacked
    and dequantised, each error naming the file and the parameter."""

    def __init__(self, ranks: list[Path]):
        self.where = [f"{p.name}/model.pdiparams" for p in ranks]
        self.params = [read_params(p) for p in ranks]
        self.used: set[tuple[int, str]] = set()
        self.layout: str | None = None  # the weight-only layout, found on the first quantised linear
        self.bits: set[int] = set()
        self.groups: set[int | None] = set()  # weight-only groups seen (None: per output channel)

    @property
    def tp(self) -> int:
        return len(self.params)

    def _get(self, rank: int, name: str) -> np.ndarray:
        if name not in self.params[rank]:
            raise CheckpointError(f"{self.where[rank]}: parameter {name} is missing (its program does not list it)")
        self.used.add((rank, name))
        return self.params[rank][name]

    def find(self, rank: int, pattern: str, what: str) -> str:
        """The one parameter of `rank` whose name matches `pattern` (unnamed ones: embedding_0.w_0 ...)."""
        hits = [n for n in self.params[rank] if re.fullmatch(pattern, n)]
        if len(hits) != 1:
            found = f"found {', '.join(hits)}" if hits else "found none"
            raise CheckpointError(f"{self.where[rank]}: expected one {what} parameter ({pattern}), {found}")
        return hits[0]

    def check_tensor(self, rank: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """`name` of `rank` (taken), checked to be a float tensor of `shape`; as stored."""
        a = self._get(rank, name)
        if a.dtype == np.int8 or tuple(a.shape) != shape:
            raise CheckpointError(
                f"{self.where[rank]}: {name} is {a.dtype} {list(a.shape)}, expected a float tensor {list(shape)}"
            )
        return a

    def tensor(self, rank: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return to_float32(self.check_tensor(rank, name, shape))

    def replicated(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A tensor every rank holds whole (norms): rank 0's, checked equal on the others."""
        first = self.tensor(0, name, shape)
        for r in range(1, self.tp):
            if not np.array_equal(self.tensor(r, name, shape), first):
                raise CheckpointError(f"{self.where[r]}: {name} differs from rank_0's (every rank holds it whole)")
        return first

    def check_linear(self, rank: int, name: str, k: int, n: int, stored_out_in: bool = False) -> int | None:
        """`linear`'s checks and records (taken; weight-only bits, group and layout), without converting
        it: its bits (8 or 4), or None unquantised.  What a lazy conversion calls first."""
        a = self._get(rank, name)
        if a.dtype != np.int8:
            self.check_tensor(rank, name, (n, k) if stored_out_in else (k, n))
            return None
        bits = 8 if a.shape == (n, k) else 4 if n % 2 == 0 and a.shape == (n // 2, k) else None
        if bits is None:
            raise CheckpointError(
                f"{self.where[rank]}: {name} is int8 {list(a.shape)}, which is neither the int8 ([{n}, {k}]) nor "
                f"the int4 ([{n // 2}, {k}]) weight-only form of its [{k}, {n}] linear"
            )
        if name + "_scale" not in self.params[rank]:
            raise CheckpointError(
                f"{self.where[rank]}: {name} is int8 without a {name}_scale: activations are quantised too "
                "(a8w8), which has no weight-only equivalent"
            )
        scale = to_float32(self._get(rank, name + "_scale"))
        self.bits.add(bits)
        self.groups.add(None if scale.ndim == 1 else k // max(scale.shape[0], 1))
        if self.layout is None:
            self.layout = detect_layout(f"{self.where[rank]}: {name}", a, scale, k, n, bits)
        return bits

    def linear(self, rank: int, name: str, k: int, n: int, stored_out_in: bool = False) -> np.ndarray:
        """A [k, n] (input × output) linear of `rank` as float32 [k, n]: unquantised (stored [k, n], or
        [n, k] with `stored_out_in`) or weight-only (`weight_quantize` of [k, n] + `<name>_scale`)."""
        bits = self.check_linear(rank, name, k, n, stored_out_in)
        a = self.params[rank][name]
        if bits is None:
            w = to_float32(a)
            return w.T if stored_out_in else w
        scale = to_float32(self.params[rank][name + "_scale"])
        assert self.layout is not None  # (check_linear found it)
        return weight_only_to_float(f"{self.where[rank]}: {name}", a, scale, k, n, bits, self.layout)

    def unused(self) -> list[tuple[int, str]]:
        return [(r, n) for r, p in enumerate(self.params) for n in p if (r, n) not in self.used]
