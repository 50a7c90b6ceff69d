"""Micro-benchmark: the linear ops (`spmd_linear`, `_panels`, `_bf16`, `_f16`, `_int8`; ops/cpu_kernels/gemm.h) at
every step size against Paddle's matmul in an inference predictor (oneDNN on and off, as the
runner loads graphs) and numpy (OpenBLAS), on the linear layers of one decoder layer:

    small  (--demo small: hidden 512, intermediate 1536, 8 heads, 4 KV heads, head_dim 64)
    1b     (Llama-3.2-1B: hidden 2048, intermediate 8192, 32 heads, 8 KV heads, head_dim 64)

One pass = x[T, K] @ W for the fused q|k|v, o, fused gate|up and down weights of a layer.  For each
model and T, every (kernel, threads) pair runs --passes passes per round, all pairs interleaved in
each of --rounds rounds, pass by pass (this machine is shared: compare within a run).  Prints a JSON
line per (model, T, kernel, threads): median and best ms per pass, GFLOP/s and weight GB/s (bytes of
W read once) of the median.
With --attention also times `spmd_paged_attention` on a prefill chunk and on decodes of each model;
with --elementwise, `spmd_add_rms_norm` and `spmd_swiglu` against Paddle's ops (layers.add_rms_norm's / swiglu).
malloc is tuned as the runner tunes it (worker/model_runner.tune_malloc: large activations are not
page-faulted in afresh every pass), unless --malloc-default.

    python benchmarks/gemm_op.py [--models small 1b] [--rows 1 4 16 64 256 512] [--threads 1 2]
                                 [--kernels spmd_linear_panels spmd_linear_bf16]   (default: all)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import paddle
from threadpoolctl import threadpool_limits

from ops import paddle_ext

MODELS = {  # hidden, intermediate, heads, kv heads, head_dim
    "small": (512, 1536, 8, 4, 64),
    "1b": (2048, 8192, 32, 8, 64),
}


def layer_shapes(model: str) -> list[tuple[int, int]]:
    h, i, nh, kvh, d = MODELS[model]
    return [(h, (nh + 2 * kvh) * d), (nh * d, h), (h, 2 * i), (i, h)]  # [K, N]: qkv, o, gate_up, down


class Layer(paddle.nn.Layer):
    """The layer's four matmuls as one graph; its inputs: x of width hidden, x of width intermediate."""

    def __init__(self, ws: list[np.ndarray]) -> None:
        super().__init__()
        self.ws = paddle.nn.ParameterList(
            [
                paddle.create_parameter(list(w.shape), "float32", default_initializer=paddle.nn.initializer.Assign(w))
                for w in ws
            ]
        )

    def forward(self, x_hidden, x_inter):
        by_k = {x.shape[-1]: x for x in (x_hidden, x_inter)}
        return [paddle.matmul(by_k[w.shape[0]], w) for w in self.ws]


def predictors(ws: list[np.ndarray], threads: list[int], work: Path) -> dict:
    """(onednn, threads) → (predictor, input handles by K) for the layer graph."""
    from paddle import inference
    from paddle.static import InputSpec

    ks = sorted({w.shape[0] for w in ws})
    assert len(ks) == 2, "one layer's linears have two input widths (hidden, intermediate)"
    layer = Layer(ws)
    paddle.jit.save(
        paddle.jit.to_static(layer, input_spec=[InputSpec([None, k], "float32") for k in ks]), str(work / "layer")
    )
    model = next(p for p in work.iterdir() if p.name.startswith("layer.") and p.suffix in (".json", ".pdmodel"))
    out = {}
    for onednn in (False, True):
        for th in threads:
            cfg = inference.Config(str(model), str(work / "layer.pdiparams"))
            cfg.disable_gpu()
            cfg.disable_glog_info()
            cfg.set_cpu_math_library_num_threads(th)
            cfg.enable_mkldnn() if onednn else cfg.disable_mkldnn()
            pred = inference.create_predictor(cfg)
            names = pred.get_input_names()
            out[(onednn, th)] = (pred, dict(zip(ks, (pred.get_input_handle(n) for n in names))))
    return out


def kernels(ws: list[np.ndarray], threads: list[int], work: Path) -> dict:
    """name → (threads → one pass over the layer for inputs {K: x})."""
    from spmd_serve.export.panels import to_panels
    from spmd_serve.export.quant import bf16_bits

    scales = [np.abs(w).max(axis=0) / 127 for w in ws]
    # each op's weight arguments per layer weight (K: the first one's rows)
    forms = {
        "spmd_linear": [(w,) for w in ws],
        "spmd_linear_panels": [(to_panels(w),) for w in ws],
        "spmd_linear_bf16": [(to_panels(bf16_bits(w)),) for w in ws],
        "spmd_linear_f16": [(to_panels(w.astype(np.float16)),) for w in ws],
        "spmd_linear_int8": [(np.rint(w / s).astype(np.int8), s) for w, s in zip(ws, scales)],
    }
    preds = predictors(ws, threads, work)

    def ours(op: str):
        args = [[paddle.to_tensor(a) for a in w] for w in forms[op]]

        def run(th, xs):
            for w in args:
                paddle_ext.run_op(op, xs["pd"][w[0].shape[0]], *w)

        return run

    def predictor(onednn):
        def run(th, xs):
            pred, handles = preds[(onednn, th)]
            for k, hnd in handles.items():
                hnd.copy_from_cpu(xs["np"][k])
            pred.run()

        return run

    def numpy_(th, xs):
        for w in ws:
            xs["np"][w.shape[0]] @ w

    return {
        **{op: ours(op) for op in forms},
        "predictor_onednn": predictor(True),
        "predictor_plain": predictor(False),
        "numpy": numpy_,
    }


def timed_rounds(fns: dict, args, passes: int, xs=None) -> dict[tuple[str, int], list[float]]:
    """Seconds of each pass of each (kernel, threads): per round, a block per thread count (our
    pool and numpy's BLAS set once for it), kernels interleaved pass by pass within it, so that
    every kernel meets the same machine load."""
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for th in args.threads:
            paddle_ext.set_num_threads(th)
            with threadpool_limits(th):
                for fn in fns.values():
                    fn(th, xs)  # warm-up (predictor: the shape's first run builds its kernels)
                for _ in range(passes):
                    for name, fn in fns.items():
                        t = time.perf_counter()
                        fn(th, xs)
                        times.setdefault((name, th), []).append(time.perf_counter() - t)
    return times


def bench_model(model: str, args) -> None:
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s, np.float32) / np.sqrt(s[0]) for s in layer_shapes(model)]
    params = sum(w.size for w in ws)
    with tempfile.TemporaryDirectory() as work:
        fns = {k: f for k, f in kernels(ws, args.threads, Path(work)).items() if not args.kernels or k in args.kernels}
        for rows in args.rows:
            xn = {k: rng.standard_normal((rows, k), np.float32) for k in {w.shape[0] for w in ws}}
            xs = {"np": xn, "pd": {k: paddle.to_tensor(v) for k, v in xn.items()}}
            passes = max(1, min(args.passes, int(args.passes * 16 / rows)))
            times = timed_rounds(fns, args, passes, xs)
            for (name, th), ts in times.items():
                med = statistics.median(ts)
                nbytes = params * (1 if name.endswith("int8") else 2 if name.endswith("16") else 4)
                print(
                    json.dumps(
                        {
                            "model": model,
                            "rows": rows,
                            "kernel": name,
                            "threads": th,
                            "ms": round(med * 1e3, 3),
                            "GFLOP_s": round(2 * rows * params / med / 1e9, 1),
                            "weight_GB_s": round(nbytes / med / 1e9, 1),
                            "ms_best": round(min(ts) * 1e3, 3),
                            "passes": len(ts),
                        }
                    ),
                    flush=True,
                )


def bench_attention(model: str, args) -> None:
    """spmd_paged_attention of one layer: a prefill chunk of 512 from scratch, and 8 decodes with 512 past."""
    _, _, nh, kvh, d = MODELS[model]
    bs, rng = 16, np.random.default_rng(1)
    for label, ctx, qlens in (("prefill 512", [0], [512]), ("8 decodes, past 512", [512] * 8, [1] * 8)):
        reach = [(c + n + bs - 1) // bs for c, n in zip(ctx, qlens)]
        tables = np.arange(sum(reach)).reshape(len(ctx), -1).astype(np.int64)
        slots = np.array(
            [tables[b, p // bs] * bs + p % bs for b, (c, n) in enumerate(zip(ctx, qlens)) for p in range(c, c + n)],
            np.int64,
        )
        pool = [paddle.to_tensor(rng.standard_normal((sum(reach), kvh, bs, d)).astype(np.float32)) for _ in range(2)]
        feeds = [
            paddle.to_tensor(a)
            for a in (
                rng.standard_normal((sum(qlens), nh + 2 * kvh, d)).astype(np.float32),
                (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32),
            )
        ]
        tail = [paddle.to_tensor(a) for a in (tables, np.array(ctx, np.int64), np.array(qlens, np.int64), slots)]
        op = lambda th, _: paddle_ext.run_op("spmd_paged_attention", *feeds, *pool, *tail, d**-0.5)  # noqa: E731
        for (_, th), ts in timed_rounds({"attention": op}, args, args.passes).items():
            print(
                json.dumps(
                    {
                        "model": model,
                        "attention": label,
                        "threads": th,
                        "ms": round(statistics.median(ts) * 1e3, 3),
                        "ms_best": round(min(ts) * 1e3, 3),
                    }
                ),
                flush=True,
            )


def bench_elementwise(model: str, args) -> None:
    """A layer's add + RMSNorm (twice) and SwiGLU: ours (threads) against Paddle's CPU kernels (the
    `--graph-ops paddle` graphs' ops; fused_rms_norm's CPU kernel needs AVX-512, layers.rms_norm)."""
    from spmd_serve.export.layers import add_rms_norm

    h, i = MODELS[model][:2]
    for rows in args.rows:
        hs, delta, gu = paddle.randn([rows, h]), paddle.randn([rows, h]), paddle.randn([rows, 2 * i])
        w = paddle.ones([h])
        fns = {
            "paddle": lambda th, _: (add_rms_norm(hs, delta, w, 1e-5), paddle.nn.functional.swiglu(gu)),
            "spmd": lambda th, _: (
                paddle_ext.run_op("spmd_add_rms_norm", hs, delta, w, 1e-5),
                paddle_ext.run_op("spmd_swiglu", gu),
            ),
        }
        for (name, th), ts in timed_rounds(fns, args, args.passes).items():
            if name == "spmd" or th == args.threads[0]:  # Paddle's kernels: one thread whatever the setting
                print(
                    json.dumps(
                        {
                            "model": model,
                            "rows": rows,
                            "elementwise": f"{name} add_rms_norm + swiglu",
                            "threads": th,
                            "ms": round(statistics.median(ts) * 1e3, 3),
                        }
                    ),
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256, 512])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=10, help="passes per round at T <= 16 (fewer above)")
    ap.add_argument("--kernels", nargs="+", help="only these (names as printed)")
    ap.add_argument("--attention", action="store_true")
    ap.add_argument("--elementwise", action="store_true")
    ap.add_argument("--malloc-default", action="store_true", help="glibc's malloc defaults (no tune_malloc)")
    args = ap.parse_args()
    paddle.set_device("cpu")
    paddle_ext.load()
    if not args.malloc_default:
        from spmd_serve.worker.malloc import tune_malloc

        tune_malloc()
    for model in args.models:
        bench_model(model, args)
        if args.attention:
            bench_attention(model, args)
        if args.elementwise:
            bench_elementwise(model, args)
    paddle_ext.set_num_threads(1)


if __name__ == "__main__":
    main()
