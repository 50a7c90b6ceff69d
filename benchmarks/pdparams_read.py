"""Reading a 2 GB pdparams (32 fp32 tensors of 4096 x 4096, each used once): `paddle.load` (the reader
before session 61, then float32) against export/pdparams.py's `read_pdparams`; wall time and peak RSS.

    python benchmarks/pdparams_read.py new [--file F]   # or: old  (one reader a process: its own peak)

The file is written first if missing (default /tmp/big.pdparams); run each reader twice and keep the
second, so both read it from the page cache.
"""

from __future__ import annotations

import argparse
import pickle
import resource
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reader", choices=["old", "new"])
    ap.add_argument("--file", type=Path, default=Path("/tmp/big.pdparams"))
    args = ap.parse_args()
    if not args.file.exists():
        rng = np.random.default_rng(0)
        with open(args.file, "wb") as f:
            pickle.dump({f"w{i}": rng.standard_normal((4096, 4096), dtype=np.float32) for i in range(32)}, f, 4)
    start = time.perf_counter()
    if args.reader == "old":
        import paddle

        state = paddle.load(str(args.file), return_numpy=True)
        total = sum(float(np.asarray(v).astype(np.float32)[0, 0]) for v in state.values())
    else:
        from spmd_serve.export.pdparams import read_pdparams

        lazy = read_pdparams(args.file)
        print(f"names and shapes in {time.perf_counter() - start:.3f} s")
        total = sum(float(lazy[k][0, 0]) for k in lazy)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"{args.reader}: {time.perf_counter() - start:.1f} s, peak RSS {peak:.2f} GB (checksum {total:.6f})")


if __name__ == "__main__":
    main()
