"""CUDA C sources of the ops kernels (read at run time by ops.nvrtc.kernel_source, compiled with NVRTC)."""
