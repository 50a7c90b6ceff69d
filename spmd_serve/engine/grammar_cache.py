"""The compiled grammars a process keeps (a JSON schema's, a pattern's, a GBNF grammar's, a structural
tag's), per compile function, bounded by their tables' bytes as well as by count: a grammar near
MAX_STATES holds ~20 MB of tables, so 64 of them kept by count alone were over a gigabyte, on rank 0
and in every HTTP worker (which compiles each to check it), for any client sending distinct large
schemas.  The least recently used go first; a grammar a request holds lives on with the request
(`json_progress`), whatever the cache drops.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ParamSpec

from spmd_serve.engine.grammar_table import Grammar

MAX_ENTRIES = 64  # grammars kept per compile function
MAX_BYTES = 256 << 20  # their tables' bytes, per compile function (the newest one is always kept)
P = ParamSpec("P")


class _Cache:
    """A compile function's kept grammars, keyed by its arguments as bound (defaults applied)."""

    def __init__(self, compile_: Callable[..., Grammar]) -> None:
        self._compile, self._signature = compile_, inspect.signature(compile_)
        self._kept: OrderedDict[tuple[Any, ...], Grammar] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # (compiles run on executor threads: the IO loop never waits on one)

    def get(self, *args: Any, **kwargs: Any) -> Grammar:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = tuple(bound.arguments.values())
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        grammar = self._compile(*args, **kwargs)  # (outside the lock: two threads may both compile one)
        with self._lock:
            if key not in self._kept:
                self._kept[key] = grammar
                self._bytes += grammar.nbytes
            self._kept.move_to_end(key)
            while len(self._kept) > 1 and (len(self._kept) > MAX_ENTRIES or self._bytes > MAX_BYTES):
                self._bytes -= self._kept.popitem(last=False)[1].nbytes
            return self._kept[key]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0


def cached(compile_: Callable[P, Grammar]) -> Callable[P, Grammar]:
    """`compile_` with its grammars kept (`.cache_clear()` drops them)."""
    cache = _Cache(compile_)

    @functools.wraps(compile_)
    def get(*args: P.args, **kwargs: P.kwargs) -> Grammar:
        return cache.get(*args, **kwargs)

    get.cache_clear = cache.clear  # type: ignore[attr-defined]
    return get
