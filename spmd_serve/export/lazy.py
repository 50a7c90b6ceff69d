"""`LazyMap`: weights computed when they are used and never kept, so an export holds one tensor of the
checkpoint in float32 at a time besides what its graphs hold.

A checkpoint's tensors (export/checkpoint.py reads each from its file on access), their HF names
and layout (a family's `to_hf_layout`) and a rank's shard (a family's `rank_weights`: slices,
transposes, quantisation) are each a LazyMap over the one before.  Before, each was a dict of
float32 arrays and an export held the checkpoint ~3.6 times over at its peak (a 1B Llama's 4 GB:
14.5 GB; RESULTS.md "Session 60").  A value read twice is computed twice: the export's consumers read
each once per graph they build.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np

Thunk = Callable[[], Any]


class LazyMap(Mapping[str, Any]):
    """name → value, computed by its thunk on each access.  What is known of a value without computing
    it: its shape (`shape_of`), and whether every element is a bfloat16 value (`all_bfloat16`: a tensor
    stored as BF16, or one renamed or transposed from such)."""

    def __init__(self) -> None:
        self._thunks: dict[str, Thunk] = {}
        self._shapes: dict[str, tuple] = {}
        self._bf16: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        return self._thunks[name]()

    def __contains__(self, name: object) -> bool:  # (Mapping's would compute the value)
        return name in self._thunks

    def __iter__(self) -> Iterator[str]:
        return iter(self._thunks)

    def __len__(self) -> int:
        return len(self._thunks)

    def put(
        self, name: str, fn: Callable[..., Any], *args: Any, shape: tuple | None = None, bf16: bool = False
    ) -> None:
        """`name` = fn(*args), computed on access; `shape` and `bf16` as known (the class docstring)."""
        self._forget(name)
        self._thunks[name] = partial(fn, *args) if args else fn
        if fn is constant and shape is None:
            shape = np.shape(args[0])
        if shape is not None:
            self._shapes[name] = tuple(shape)
        if bf16:
            self._bf16.add(name)

    def take(self, name: str, m: Mapping[str, Any], src: str | None = None) -> None:
        """`name` = m[src or name], computed when this one is read (its known shape carried)."""
        src = src or name
        self._forget(name)
        self._thunks[name] = thunk_of(m, src)
        if isinstance(m, LazyMap) and (s := m.known_shape(src)) is not None:
            self._shapes[name] = s
        if isinstance(m, LazyMap) and src in m._bf16:
            self._bf16.add(name)

    def _forget(self, name: str) -> None:
        """(what was known of a value `name` is replacing)"""
        self._shapes.pop(name, None)
        self._bf16.discard(name)

    def thunk(self, name: str) -> Thunk:
        return self._thunks[name]

    def known_shape(self, name: str) -> tuple | None:
        return self._shapes.get(name)

    def known_bfloat16(self, name: str) -> bool:
        return name in self._bf16

    def all_bfloat16(self) -> bool:
        """Whether every value is known to be bfloat16 values (then no value need be read to tell)."""
        return bool(self._thunks) and self._bf16.issuperset(self._thunks)


def constant(value: Any) -> Any:
    """(a thunk's body: `LazyMap.put(name, constant, value)` holds `value` itself)"""
    return value


def thunk_of(m: Mapping[str, Any], name: str) -> Thunk:
    """What computes m[name] later: its thunk for a LazyMap, else a reference to the value."""
    return m.thunk(name) if isinstance(m, LazyMap) else partial(constant, m[name])


def lazy_view(m: Mapping[str, Any], names: Iterable[str] | None = None, **extra: Any) -> LazyMap:
    """A LazyMap of `m`'s `names` (all by default; m's values not computed), plus `extra` constants."""
    out = LazyMap()
    for n in m if names is None else names:
        out.take(n, m)
    for k, v in extra.items():
        out.put(k, constant, v)
    return out


def merged(*maps: Mapping[str, Any]) -> LazyMap:
    """The union of `maps` (later ones win), none of their values computed."""
    out = LazyMap()
    for m in maps:
        for n in m:
            out.take(n, m)
    return out


def is_bf16(m: Mapping[str, Any], name: str) -> bool:
    """Whether m[name] is known to be bfloat16 values without computing it."""
    return isinstance(m, LazyMap) and m.known_bfloat16(name)


def shape_of(m: Mapping[str, Any], name: str) -> tuple:
    """m[name]'s shape, without computing it when `m` knows it."""
    known = m.known_shape(name) if isinstance(m, LazyMap) else None
    return known if known is not None else tuple(np.shape(m[name]))


def transposed(fn: Thunk) -> np.ndarray:
    """fn()'s 2-D array transposed, contiguous (a thunk's body: Paddle's [in, out] → HF's [out, in])."""
    return np.ascontiguousarray(fn().T)


def _float32(fn: Thunk) -> np.ndarray:
    return np.ascontiguousarray(fn(), dtype=np.float32)


def as_float32(m: LazyMap) -> LazyMap:
    """`m` with every value made a contiguous float32 array on access."""
    out = LazyMap()
    for n in m:
        out.take(n, m)
        out._thunks[n] = partial(_float32, m.thunk(n))
    return out
