"""The new C++ ops inside a saved graph run by paddle.inference, as the export and the runner will
use them: a decoder layer of the flat-token design (add + RMSNorm, q|k|v, paged attention writing
the pool bound zero-copy, o, add + RMSNorm, gate|up, SwiGLU, down) traced with jit.save, loaded in
a predictor, and run on a mixed step; its outputs and the pool it wrote equal the eager ops'."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from tests.support.paged_attention_reference import inv_freq, make_step

NH, KVH, D, H, INTER, BS = 4, 2, 16, 64, 96, 8


class Layer(paddle.nn.Layer):
    def __init__(self, rng: np.random.Generator, quant: bool) -> None:
        super().__init__()

        def new(*s):
            return self.create_parameter(
                list(s),
                default_initializer=paddle.nn.initializer.Assign(
                    (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
                ),
            )

        self.ln1, self.ln2 = new(H), new(H)
        self.qkv, self.o, self.gate_up = new(H, (NH + 2 * KVH) * D), new(NH * D, H), new(H, 2 * INTER)
        q = rng.integers(-127, 128, (INTER, H), dtype=np.int8)
        self.register_buffer("down_q", paddle.to_tensor(q), persistable=True)  # int8 weights stay int8
        self.down_s = new(H)
        self.register_buffer("freq", paddle.to_tensor(inv_freq(D)), persistable=True)
        self.quant = quant

    def forward(self, h, delta, k_cache, v_cache, tables, ctx, qlens, slots):
        from ops import paddle_ext

        run = paddle_ext.run_op
        x, h = run("spmd_add_rms_norm", h, delta, self.ln1, 1e-5)  # [T, H] each
        qkv = run("spmd_linear", x, self.qkv).reshape([-1, NH + 2 * KVH, D])
        att = run("spmd_paged_attention", qkv, self.freq, k_cache, v_cache, tables, ctx, qlens, slots, D**-0.5)
        x, h = run("spmd_add_rms_norm", h, run("spmd_linear", att, self.o), self.ln2, 1e-5)
        act = run("spmd_swiglu", run("spmd_linear", x, self.gate_up))  # [T, INTER]
        return h, run("spmd_linear_int8", act, self.down_q, self.down_s)


@pytest.mark.parametrize("threads", (1, 2))
def test_a_saved_layer_runs_in_a_predictor_like_eager(tmp_path, threads):
    from paddle import inference
    from paddle.static import InputSpec

    from ops import paddle_ext

    paddle_ext.load()
    paddle_ext.set_num_threads(threads)
    rng = np.random.default_rng(0)
    layer = Layer(rng, quant=True)
    step = make_step([3, 0, 9], [1, 12, 5], NH, KVH, D, BS, seed=1)
    _, kc, vc, tables, ctx, qlens, slots = step
    t = int(qlens.sum())
    h, delta = (rng.standard_normal((t, H)).astype(np.float32) for _ in range(2))

    def args(k, v):
        return (
            [paddle.to_tensor(a) for a in (h, delta)]
            + [k, v]
            + [paddle.to_tensor(a) for a in (tables, ctx, qlens, slots)]
        )

    k_eager, v_eager = paddle.to_tensor(kc.copy()), paddle.to_tensor(vc.copy())
    want = [o.numpy() for o in layer(*args(k_eager, v_eager))]

    specs = [
        InputSpec([None, H], "float32", "h"),
        InputSpec([None, H], "float32", "delta"),
        InputSpec([None, BS, KVH, D], "float32", "k_cache"),
        InputSpec([None, BS, KVH, D], "float32", "v_cache"),
        InputSpec([None, None], "int64", "tables"),
        InputSpec([None], "int64", "ctx"),
        InputSpec([None], "int64", "qlens"),
        InputSpec([None], "int64", "slots"),
    ]
    paddle.jit.save(paddle.jit.to_static(layer, input_spec=specs, full_graph=True), str(tmp_path / "layer"))
    model = next(p for p in tmp_path.iterdir() if p.stem == "layer" and p.suffix in (".json", ".pdmodel"))
    cfg = inference.Config(str(model), str(tmp_path / "layer.pdiparams"))
    cfg.disable_gpu()
    cfg.disable_glog_info()
    cfg.disable_mkldnn()
    cfg.set_cpu_math_library_num_threads(1)
    pred = inference.create_predictor(cfg)
    pools = {"k_cache": paddle.to_tensor(kc.copy()), "v_cache": paddle.to_tensor(vc.copy())}  # kept alive
    feeds = {"h": h, "delta": delta, "tables": tables, "ctx": ctx, "qlens": qlens, "slots": slots}
    for name in pred.get_input_names():
        handle = pred.get_input_handle(name)
        if name in pools:
            handle.share_external_data(pools[name])  # bound zero-copy, as the runner does
        else:
            handle.copy_from_cpu(feeds[name])
    pred.run()
    got = [pred.get_output_handle(n).copy_to_cpu() for n in pred.get_output_names()]
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)  # the same kernels: the same bits
    np.testing.assert_array_equal(pools["k_cache"].numpy(), k_eager.numpy())  # the op wrote the bound pool
    np.testing.assert_array_equal(pools["v_cache"].numpy(), v_eager.numpy())
    assert not np.array_equal(pools["k_cache"].numpy(), kc)
    paddle_ext.set_num_threads(1)
