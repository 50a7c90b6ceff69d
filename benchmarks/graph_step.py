"""One exported graph (rank 0's segment 0, i.e. the whole model at --tp 1) timed alone on a
synthetic decode step: batch B, C tokens of past each (blocks of 64), 25 runs, median.

    python benchmarks/graph_step.py MODEL_DIR B C ONEDNN(0|1) THREADS [prof]

`prof` turns on Paddle's per-op profiler (printed at exit).  Used for the before/after of graph
changes in RESULTS.md: export the model before and after, run both, interleaved.
"""
import sys, time, json, numpy as np
from pathlib import Path
from paddle import inference
from spmd_serve.worker.kv_cache import KVCachePool
from spmd_serve.protocol import grid_indices
mdir, B, C, mkl, thr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
prof = len(sys.argv) > 6 and sys.argv[6] == "prof"
rank_dir = Path(mdir) / "rank_0"
man = json.loads((rank_dir / "manifest.json").read_text()); d = man["dims"]; spec = man["segments"][0]
cfg = inference.Config(str(rank_dir / "seg_0.json"), str(rank_dir / "seg_0.pdiparams"))
cfg.disable_gpu(); cfg.set_cpu_math_library_num_threads(thr)
if mkl: cfg.enable_mkldnn()
else: cfg.disable_mkldnn()
if prof: cfg.enable_profile()
p = inference.create_predictor(cfg)
bs = 64; nb = 256
pool = KVCachePool(d["num_layers"], nb, bs, d["kv_heads"], d["head_dim"])
for n in p.get_input_names():
    if n.startswith(("k_cache", "v_cache")): p.get_input_handle(n).share_external_data(pool.tensor(n))
ql = np.ones(B, np.int64); pad, unpad, li = grid_indices(ql)
mb = (C + 1 + bs - 1) // bs
feeds = dict(input_ids=np.full(B, 5, np.int64), positions=np.full(B, C, np.int64), pad_index=pad, unpad_index=unpad,
    block_tables=np.arange(B * mb, dtype=np.int64).reshape(B, mb) % nb, ctx_lens=np.full(B, C, np.int64), query_lens=ql, logits_index=li)
def run():
    for n, v in feeds.items():
        h = p.get_input_handle(n); h.reshape(list(v.shape)); h.copy_from_cpu(v)
    p.run()
    return p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()
ts = []
for i in range(25):
    t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
print(f"B={B} C={C} mkldnn={mkl} threads={thr} median {1e3*np.median(ts[5:]):.2f} ms min {1e3*min(ts):.2f}")
