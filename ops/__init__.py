r"""Custom kernels (CUDA C compiled at run time with NVRTC through cuda-python), each with a
numpy twin of the same signature that is the CPU path and the test oracle.  The CUDA C lives in
ops/kernels/ (*.cu, *.cuh), read and concatenated per kernel module by `runtime.kernel_source`.

| module | owns |
|---|---|
| `device`, `nvrtc`, `runtime` | driver bindings and GPU detection; NVRTC compile + disk cache; dtypes, device arrays, module loading and launch |
| `kv_cache_write` | K/V of new tokens into the paged pool at slots (optional int8 with per-head scales) |
| `paged_attention` | decode attention over block tables, GQA, optional int8 KV, split-K for long contexts |
| `sample`, `sample_twin`, `sample_cuda`, `sample_launch`, `sample_staged`, `philox` | fused penalties / EOS mask / temperature / top-k / top-p / seeded Philox draw / top-n logprobs; `sample` dispatches |
| `bench`, `bench_timing`, `bench_attention` | GPU timings against the measured copy bandwidth (`python -m ops.bench`; the attention variant sweep) |
| `paddle_ext` | Paddle CPU custom operators in C++ (`cpu_kernels/*.cc`) used inside exported graphs: `spmd_allreduce` (MPI in the graph), `spmd_linear[_panels\|_bf16\|_f16\|_int8\|_int4]` (GEMM for every T, per weight form), `spmd_paged_attention` (RoPE + pool write + causal GQA over the paged pool), the norms and SwiGLU, on a persistent thread pool; built with g++ on first use, cached, registered |

What runs where.  Each op's entry point dispatches on its arrays: numpy -> the twin, device arrays
(cupy, Paddle GPU tensors, runtime.DeviceArray) -> the kernel, which the GPU tests hold to the twin.
* KV writes: worker/kv_cache.py writes the pool through `kv_cache_write`'s twin (the pool is host
  memory on this CPU build).
* Sampling: engine/sampler.py calls `sample.sample` once per step over the rows that complete; the
  runner hands numpy logits today, so the twin runs; device logits would take the kernel through
  `sample_gpu_staged` (numpy parameters in, numpy results out) with the same tokens bit for bit.
* Attention runs inside the exported Paddle graphs; `paged_attention` is not called by the server.
GPU checks, on a machine with an NVIDIA driver: `pytest -m gpu tests/kernels/test_ops_*.py` (each kernel
against its twin) and `python -m ops.bench` (time and bandwidth against the copy bandwidth).
This package never imports spmd_serve or (at import) Paddle (DESIGN §5).
"""
