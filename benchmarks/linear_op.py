"""Micro-benchmark: the `spmd_linear` / `spmd_linear_int8` C++ ops against paddle.matmul (the
decode graph's matmuls before them) on the weights of one `--demo small` decode step.

Each pass multiplies x [T, K] by every linear weight of the model once (8 layers of q|k|v, o,
gate|up, down, then lm_head: ~117 MB fp32, more than the L3 cache), eagerly, one thread, as the
decode graph does; GB/s is weight bytes read per second.  int8: the baseline is the graph's
`matmul(x, q.astype(float32)) * scale`.  Prints one JSON line per (dtype, T, kernel), medians of
--rounds rounds interleaved between the kernels:

    python benchmarks/linear_op.py [--rows 1 4] [--rounds 5] [--passes 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import paddle

from ops import paddle_ext

H, I, V, LAYERS = 512, 1536, 8000, 8  # demo small (spmd_serve/export/demo/checkpoint.py)
SHAPES = [(H, 1024), (H, H), (H, 2 * I), (I, H)] * LAYERS + [(H, V)]  # [K, N]: qkv, o, gate_up, down; lm_head


def weights(dtype: str) -> list[tuple]:
    rng = np.random.default_rng(0)
    if dtype == "float32":
        return [(paddle.to_tensor(rng.standard_normal(s, np.float32)),) for s in SHAPES]
    return [
        (
            paddle.to_tensor(rng.integers(-127, 128, s, dtype=np.int8)),
            paddle.to_tensor(rng.random(s[1], np.float32) / 127),
        )
        for s in SHAPES
    ]


def kernels(dtype: str) -> dict:
    if dtype == "float32":
        return {
            "paddle.matmul": lambda x, w: paddle.matmul(x, w[0]),
            "spmd_linear": lambda x, w: paddle_ext.run_op("spmd_linear", x, w[0]),
        }
    return {
        "paddle.matmul": lambda x, w: paddle.matmul(x, w[0].astype("float32")) * w[1],
        "spmd_linear_int8": lambda x, w: paddle_ext.run_op("spmd_linear_int8", x, *w),
    }


def one_pass(fn, xs: dict, ws: list) -> None:
    for w in ws:
        fn(xs[w[0].shape[0]], w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
    paddle.set_device("cpu")
    paddle_ext.load()
    for dtype in ("float32", "int8"):
        ws = weights(dtype)
        nbytes = sum(int(np.prod(s)) for s in SHAPES) * (4 if dtype == "float32" else 1)
        for rows in args.rows:
            xs = {k: paddle.to_tensor(np.random.default_rng(1).standard_normal((rows, k), np.float32)) for k in (H, I)}
            fns = kernels(dtype)
            times: dict[str, list[float]] = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():  # interleaved: the same machine noise for both
                    one_pass(fn, xs, ws)  # warm-up pass
                    t = time.perf_counter()
                    for _ in range(args.passes):
                        one_pass(fn, xs, ws)
                    times[name].append((time.perf_counter() - t) / args.passes)
            for name, ts in times.items():
                med = statistics.median(ts)
                print(
                    json.dumps(
                        {
                            "dtype": dtype,
                            "rows": rows,
                            "kernel": name,
                            "weight_MB": round(nbytes / 1e6, 1),
                            "ms_per_pass": round(med * 1e3, 3),
                            "GB_per_s": round(nbytes / med / 1e9, 2),
                            "GB_per_s_range": [round(nbytes / max(ts) / 1e9, 2), round(nbytes / min(ts) / 1e9, 2)],
                        }
                    )
                )


if __name__ == "__main__":
    main()
