"""Custom kernels (CUDA C compiled at run time with NVRTC through cuda-python), each with a
numpy/Paddle twin of the same signature that is the CPU path and the test oracle.  The CUDA C lives
in ops/kernels/ (*.cu, *.cuh), read and concatenated per kernel module by `runtime.kernel_source`.

Not built yet: on the CPU path the serving runtime writes the paged KV cache with numpy
(spmd_serve/worker/kv_cache.py) and attends inside the exported Paddle graphs.  This package
never imports spmd_serve (DESIGN §5).
"""
