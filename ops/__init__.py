"""Custom kernels (CUDA C compiled at run time with NVRTC through cuda-python), each with a
numpy twin of the same signature that is the CPU path and the test oracle.  The CUDA C lives in
ops/kernels/ (*.cu, *.cuh), read and concatenated per kernel module by `runtime.kernel_source`.

| module | owns |
|---|---|
| `device`, `nvrtc`, `runtime` | driver bindings and GPU detection; NVRTC compile + disk cache; dtypes, device arrays, module loading and launch |
| `kv_cache_write` | K/V of new tokens into the paged pool at slots (optional int8 with per-head scales) |
| `paged_attention` | decode attention over block tables, GQA, optional int8 KV, split-K for long contexts |
| `sample`, `sample_twin`, `sample_cuda`, `philox` | fused penalties / EOS mask / temperature / top-k / top-p / seeded Philox draw / top-n logprobs |
| `bench` | GPU timings against the measured copy bandwidth (`python -m ops.bench`) |

The serving runtime writes its KV pool through `kv_cache_write` (twin on CPU).  Attention runs
inside the exported Paddle graphs and sampling in spmd_serve/engine/sampler.py until the kernels
have been checked on a GPU.  This package never imports spmd_serve or (at import) Paddle (DESIGN §5).
"""
