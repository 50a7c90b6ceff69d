"""`HostParams`: a rank's graph parameters, read once per parameter file into host memory the rank
owns, and bound zero-copy into every predictor whose graph uses that file.

A `paddle.inference` predictor loads its own copy of its parameter file.  A DeepSeek segment has
two graphs over one file (the base graph and its decode variant, worker/segment.py), so it held its
weights twice: twice the memory and twice the load (`--demo deepseek-tiny`: +2.59 MB, then +1.88 MB
more for a 1.33 MB file).  Here each predictor is made from a skeleton of its file (every tensor
one element, pdiparams.py) and its parameters are then pointed at the rank's one copy
(`share_external_data`, as the KV pool's inputs are): Paddle's passes ran on the skeleton, and
the same logits come out as from Paddle's own load (tests/graphs/test_host_params.py).

Each file's tensors go into one anonymous mapping, 64-byte aligned each and advised
`MADV_HUGEPAGE` before they are read (worker/huge_pages.py: a decode step reads every weight once,
and 2 MB pages read faster); what the kernel could not give as 2 MB pages is collapsed after.
The reads run on the rank's threads: on this VM each fresh 2 MB page costs a fault in the host, and
two threads read `--demo 1b`'s 3.8 GB in 5.1-5.4 s against 8.7-9.0 on one (served, ready in 6.5-6.9
against 10.1-10.4 s; more threads than cores did not help).  RESULTS.md "Session 56".
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.worker.huge_pages import Collapsed, collapse, mapped_zeros, total
from spmd_serve.worker.pdiparams import TensorEntry, graph_params, read_index, write_skeleton

ALIGN = 64  # each tensor's first byte: a cache line (an AVX-512 vector)
PIECE = 64 << 20  # bytes one read of a tensor asks for, so the threads share even a large one


def _tensor(a: np.ndarray) -> Any:
    """A Paddle tensor on `a`'s memory (zero-copy); bfloat16 (uint16 bits) as Paddle's BFLOAT16: from
    dlpack such an array is a UINT16 tensor that share_external_data refuses and view() cannot cast."""
    import paddle

    if a.dtype == np.uint16:
        return paddle.from_dlpack(a.view(np.int16)).view(paddle.bfloat16)
    return paddle.from_dlpack(a)


def _read_exact(fd: int, view: memoryview, offset: int) -> None:
    """`view` filled from file `fd` at `offset` (a read returns at most ~2 GB on Linux)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"unexpected end of file at byte {offset + done}")
        done += n


@dataclass
class _File:
    """One parameter file as the rank holds it: its index, its tensors, their paddle views."""

    entries: list[TensorEntry]
    arrays: list[np.ndarray]
    tensors: list[Any] = field(default_factory=list)  # paddle.Tensor each, zero-copy; made at first bind


class HostParams:
    """The parameter files a rank has read, each once; `huge_pages`: onto 2 MB pages; `threads`:
    the reads' (the rank's threads, idle while it loads)."""

    def __init__(self, huge_pages: bool = True, threads: int = 1) -> None:
        self.huge_pages, self.threads = huge_pages, max(threads, 1)
        self._files: dict[Path, _File] = {}
        self.collapsed: list[Collapsed] = []
        self.read_seconds = 0.0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for f in self._files.values() for a in f.arrays)

    def entries(self, file: Path) -> list[TensorEntry]:
        """`file`'s index (its tensors read on first use, as by `arrays`)."""
        return self._file(file).entries

    def arrays(self, file: Path) -> list[np.ndarray]:
        """`file`'s tensors in file order, read on first use."""
        return self._file(file).arrays

    def _file(self, file: Path) -> _File:
        file = file.resolve()
        if file not in self._files:
            t = time.perf_counter()
            entries = read_index(file)
            self._files[file] = _File(entries, self._read(file, entries))
            self.read_seconds += time.perf_counter() - t
        return self._files[file]

    def _read(self, file: Path, entries: list[TensorEntry]) -> list[np.ndarray]:
        starts = np.cumsum([0] + [-(-e.nbytes // ALIGN) * ALIGN for e in entries])  # [n + 1] aligned offsets
        raw = mapped_zeros(int(starts[-1]), self.huge_pages)
        lo, hi = raw.ctypes.data, raw.ctypes.data + raw.size
        arrays = [raw[s : s + e.nbytes].view(e.dtype).reshape(e.dims) for e, s in zip(entries, starts)]
        # (destination, file offset) pieces of at most PIECE bytes, read on the rank's threads
        pieces = [
            (raw[s + a : s + min(a + PIECE, e.nbytes)], e.offset + a)
            for e, s in zip(entries, starts)
            for a in range(0, e.nbytes, PIECE)
        ]
        fd = os.open(file, os.O_RDONLY)
        try:
            with ThreadPoolExecutor(self.threads) as pool:
                for _ in pool.map(lambda p: _read_exact(fd, memoryview(p[0]), p[1]), pieces):
                    pass
        finally:
            os.close(fd)
        if self.huge_pages:
            self.collapsed.append(collapse(lo, hi))
        return arrays

    def load(self, program: Path, file: Path, create: Callable[[Path], Any]) -> Any:
        """The predictor `create(params_path)` makes of saved graph `program`, given a one-element-
        per-tensor skeleton of its parameter file `file` (removed after), with every parameter then
        pointed at this rank's copy of `file`."""
        held = self._file(file)
        with tempfile.TemporaryDirectory(prefix="spmd_params_") as tmp:
            skeleton = Path(tmp) / file.name
            write_skeleton(held.entries, skeleton)
            predictor = create(skeleton)
        if not held.tensors:
            held.tensors = [_tensor(a) for a in held.arrays]  # zero-copy
        for name, tensor in zip(graph_params(program, held.entries), held.tensors):
            predictor.get_input_handle(name).share_external_data(tensor)
        return predictor

    def report(self) -> str:
        """The rank's log line: what was read, how long it took, how much is on 2 MB pages."""
        mb = 1 << 20
        head = f"parameters: {self.nbytes / mb:.0f} MB read once in {self.read_seconds:.1f} s"
        return f"{head}; {total(self.collapsed).line()}" if self.huge_pages else head
