"""One C++ graph op called eagerly, the median time a call: what session 39's op changes were timed
with (benchmarks/RESULTS.md "Session 39").  Compare trees by running this in each, alternating:

    (cd OLD && PYTHONPATH=$PWD python benchmarks/op_calls.py attention-int8)
    (cd NEW && PYTHONPATH=$PWD python benchmarks/op_calls.py attention-int8)

Cases: `attention-int8` / `attention-f32` (spmd_paged_attention over an int8 / fp32 pool: 8 heads,
4 KV heads, d = 64, past 192, B = 1, 8, 32 decodes), `moe` (spmd_moe_experts, 32 experts, H = 1,024,
I = 512, k = 6, T = 8 and 128), `mla` (spmd_mla_decode, K = 576: see its cases), `moe-int8`
(spmd_moe_experts_int8 against the batched path Paddle's ops run), `moe-grouped` (fp32: the batched
path against spmd_moe_experts at E / k = 2, 4, 8: why MoeStage takes the op everywhere), `moe-half`
(spmd_moe_experts over fp32 stacks against _bf16 / _f16 over 16-bit ones, T = 1, 8, 128, alternating).
SPMD_OPS_MARCH=x86-64-v3 times the AVX2 build.  Prints one line: case, threads, ms or µs a call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np


def median_ms(call: Callable[[], object], reps: int = 5, inner: int = 20) -> float:
    for _ in range(3):
        call()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            call()
        ts.append((time.perf_counter() - t0) / inner * 1e3)
    return sorted(ts)[reps // 2]


def attention(ext, paddle, int8: bool, threads: int) -> list[str]:
    from tests.support.paged_attention_reference import inv_freq, make_step

    out = []
    for b in (1, 8, 32):
        qkv, kc, vc, tables, cl, ql, slots = make_step([192] * b, [1] * b, 8, 4, 64, 40, seed=1)
        rng = np.random.default_rng(0)
        pools = [rng.integers(-127, 128, kc.shape, dtype=np.int8) for _ in range(2)] if int8 else [kc, vc]
        extra = [np.full(4, 0.03, np.float32)] * 2 if int8 else []
        args = [paddle.to_tensor(a) for a in (qkv.reshape(len(qkv), -1), inv_freq(64), *pools, tables, cl, ql, slots)]
        args += [paddle.to_tensor(a) for a in extra]
        op = "spmd_paged_attention_int8" if int8 else "spmd_paged_attention"
        out.append(f"B{b} {median_ms(lambda: ext.run_op(op, *args, 0.125), 7, 200) * 1e3:.1f} us")
    return out


def moe_case(t: int, h: int = 1024, inter: int = 512, e: int = 32, k: int = 6):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, h)).astype(np.float32)
    idx = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int64)
    w = rng.random((t, k)).astype(np.float32)
    gu = (rng.standard_normal((e, h, 2 * inter)) / 32).astype(np.float32)
    dn = (rng.standard_normal((e, inter, h)) / 32).astype(np.float32)
    return x, idx, w, gu, dn


def moe(ext, paddle, threads: int) -> list[str]:
    out = []
    for t in (8, 128):
        args = [paddle.to_tensor(a) for a in moe_case(t)]
        out.append(f"T{t} {median_ms(lambda: ext.run_op('spmd_moe_experts', *args), inner=5):.2f} ms")
    return out


def batched_vs_grouped(ext, paddle, t: int, e: int, k: int, quant: str | None) -> str:
    """One MoE layer's routed experts at T tokens: the batched path Paddle's ops run (every local
    expert over every token, weighted by the combine matrix: e / k times the routed arithmetic)
    against the grouped op, fp32 or int8 stacks."""
    from spmd_serve.export.deepseek.batched import BatchedLinear
    from spmd_serve.export.quant import quantize_stack

    x, idx, w, gu, dn = moe_case(t, e=e, k=k)
    if quant:
        qg, qd = quantize_stack(gu, quant, None), quantize_stack(dn, quant, None)
        bg, bd = BatchedLinear(qg), BatchedLinear(qd)
        stacks, op = (qg.q, qg.scale, qd.q, qd.scale), "spmd_moe_experts_int8"
    else:
        bg, bd = BatchedLinear(gu), BatchedLinear(dn)
        stacks, op = (gu, dn), "spmd_moe_experts"
    combine = np.zeros((t, e), np.float32)
    np.put_along_axis(combine, idx, w, axis=1)
    local, xt = paddle.to_tensor(combine.T[:, :, None]), paddle.to_tensor(x)
    args = [xt, *(paddle.to_tensor(a) for a in (idx, w, *stacks))]

    def batched():
        with paddle.no_grad():
            return (bd(paddle.nn.functional.swiglu(bg(xt.unsqueeze(0)))) * local).sum(axis=0)

    b_ms, g_ms = median_ms(batched, inner=2), median_ms(lambda: ext.run_op(op, *args), inner=2)
    return f"T{t} E{e}/k{k} batched {b_ms:.2f} ms, grouped {g_ms:.2f} ms ({b_ms / g_ms:.2f}x)"


def moe_int8(ext, paddle, threads: int) -> list[str]:
    return [batched_vs_grouped(ext, paddle, t, 32, 6, "weight_only_int8") for t in (8, 128)]


def moe_grouped(ext, paddle, threads: int) -> list[str]:
    """fp32 stacks at E / k of 2, 4 and 8, where the batched path wastes least (Paddle's math
    library on the same threads as the op)."""
    paddle.base.core.set_num_threads(threads)
    return [batched_vs_grouped(ext, paddle, t, e, k, None) for e, k in ((8, 4), (8, 2), (16, 2)) for t in (8, 64, 512)]


def moe_half(ext, paddle, threads: int) -> list[str]:
    """`moe`'s layer (192 MB of fp32 stacks: read from memory) with its stacks in fp32, bf16 and f16
    (each expert in panels, as a 16-bit export holds them): two alternating rounds, the faster kept."""
    from spmd_serve.export.panels import to_panels
    from spmd_serve.export.quant import bf16_bits

    out = []
    for t in (1, 8, 128):
        x, idx, w, gu, dn = moe_case(t)
        forms = {"fp32": ("spmd_moe_experts", gu, dn)}
        held = (
            ("panels", lambda v: v, "_panels"),
            ("bf16", bf16_bits, "_bf16"),
            ("f16", lambda v: v.astype(np.float16), "_f16"),
        )
        for name, half, op in held:
            forms[name] = ("spmd_moe_experts" + op, *(np.stack([to_panels(half(e)) for e in s]) for s in (gu, dn)))
        calls = {}
        for name, (op, g, d) in forms.items():
            args = [paddle.to_tensor(a) for a in (x, idx, w, g, d)]
            calls[name] = lambda op=op, args=args: ext.run_op(op, *args)
        best = {name: min(median_ms(call, inner=3) for _ in range(2)) for name, call in calls.items()}
        ratios = ", ".join(f"{n} {best[n]:.2f} ms ({best['fp32'] / best[n]:.2f}x)" for n in ("panels", "bf16", "f16"))
        out.append(f"T{t} fp32 {best['fp32']:.2f} ms, {ratios}")
    return out


def mla(ext, paddle, threads: int) -> list[str]:
    """(heads, B, past) cases at K = 576, blocks of 64; the query times 0.072 (the softmax scale the
    graph folds in) or 1 (scores so spread that most weights underflow: the subnormal case)."""
    out = []
    for heads, b, past, scale in (
        (16, 8, 256, 0.072),
        (16, 1, 256, 0.072),
        (16, 8, 16, 0.072),
        (4, 8, 256, 0.072),
        (16, 8, 256, 1.0),
    ):
        k, bs = 576, 64
        rng = np.random.default_rng(0)
        nb = b * (past // bs + 1)
        tables = np.arange(nb).reshape(b, -1).astype(np.int64)
        slots = np.array([tables[i, past // bs] * bs + past % bs for i in range(b)], np.int64)
        arrays = (
            (rng.standard_normal((heads, b, k)) * scale).astype(np.float32),
            rng.standard_normal((b, k)).astype(np.float32),
            rng.standard_normal((nb, bs, k)).astype(np.float32),
            tables,
            np.full(b, past, np.int64),
            slots,
        )
        args = [paddle.to_tensor(a) for a in arrays]
        ms = median_ms(lambda: ext.run_op("spmd_mla_decode", *args), inner=20)
        out.append(f"h {heads} B {b} past {past} q x{scale}: {ms:.3f} ms")
    return out


CASES = {
    "attention-int8": lambda ext, pd, n: attention(ext, pd, True, n),
    "attention-f32": lambda ext, pd, n: attention(ext, pd, False, n),
    "moe": moe,
    "moe-int8": moe_int8,
    "moe-grouped": moe_grouped,
    "moe-half": moe_half,
    "mla": mla,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    import paddle

    from ops import paddle_ext

    paddle_ext.load()
    for n in args.threads:
        paddle_ext.set_num_threads(n)
        print(f"{args.case} threads {n}: " + " | ".join(CASES[args.case](paddle_ext, paddle, n)))


if __name__ == "__main__":
    main()
