"""sample: one fused pass per row of [batch, vocab] logits -> one token per sequence.

Owns the sampling semantics (below) and the `sample` dispatch; re-exports the numpy twin
`sample_cpu` with its exact helpers (ops/sample_twin.py: the CPU path and the test oracle) and the
GPU wrappers `sample_gpu` (device parameters and outputs) and `sample_gpu_staged` (numpy parameters
and results, as the twin) with the kernel source and sizing (ops/sample_cuda.py; CUDA C in
ops/kernels/sample*).  The serving loop calls `sample` with numpy parameters on either path.
Semantics per row:

1. p = logits in float32.  Tokens generated so far (gen_token_ids, -1 padded; ids outside [0, V)
   ignored) with count c > 0: repetition (p > 0 ? p / rep : p * rep), then p = (p - freq * c) - pres.
   While num_generated < min_tokens the row's eos_ids (-1 padded) are set to -inf.
2. Greedy when temperature <= 0, top_k == 1 or top_p <= 0: the arg-max of p, ties -> lowest id.
3. Otherwise s = p / temperature (float32 division).  Tokens rank by s descending, ties by id
   ascending (-0.0 ranks as +0.0).  Each token gets an integer weight q = exp2_weight(s - max s)
   ~= 2**31 * exp(s - max s), from float32 operations that the kernel repeats bit for bit (so the CPU
   and GPU paths pick the same token): tokens below ~2**-32 of the top one weigh 0 and are never
   drawn.  Over the N tokens of positive weight (a prefix of the ranking):
     kept = the first K = min(top_k or N, N) ranks; Q_k = their total weight;
     top_p < 1: kept shrinks to the shortest prefix whose weight reaches ceil(top_p * Q_k) (float64);
     x0 = Philox4x32-10 first word for (seed, counter) (ops/philox.py), t = floor(x0 * Q / 2**32)
     with Q the kept weight (exact integers), and the token is the first rank whose cumulative
     weight exceeds t (inverse CDF, most likely first).
4. logprobs: sampled rows: log of the token's probability in the distribution it was drawn from,
   (s - max s) - ln(Q * 2**-31) (the kept set, renormalised, after penalties/temperature/top-k/top-p;
   relative error of the normaliser <= kept_tokens * 2**-32).  Greedy rows: log_softmax of the
   penalised p over the whole vocabulary at temperature 1 (a temperature-0 distribution would be
   degenerate).  top_ids/top_logprobs: the first num_logprobs ranks of that same distribution
   (sampled: only kept tokens), best first; missing entries are -1 / -inf.
A row whose maximum is +-inf or NaN after scaling returns its arg-max with logprob NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .sample_cuda import (
    CUDA_SOURCE,
    SAMPLE_KERNELS,
    SCAN_KERNELS,
    SOURCE_FILES,
    THREADS,
    VARIANTS,
    compile_options,
    hash_bits,
    sample_gpu,
    scan_chunks,
    shared_bytes,
    workspace_bytes,
)
from .sample_staged import PARAM_DTYPES, sample_gpu_staged
from .sample_twin import (
    MAX_TOP_N,
    MAX_VOCAB,
    apply_penalties,
    exp2_weight,
    float_key,
    greedy_tokens,
    key_float,
    sample_cpu,
)

__all__ = [
    "CUDA_SOURCE",
    "MAX_TOP_N",
    "MAX_VOCAB",
    "PARAM_DTYPES",
    "SAMPLE_KERNELS",
    "SCAN_KERNELS",
    "SOURCE_FILES",
    "THREADS",
    "VARIANTS",
    "apply_penalties",
    "compile_options",
    "exp2_weight",
    "float_key",
    "greedy_tokens",
    "hash_bits",
    "key_float",
    "sample",
    "sample_cpu",
    "sample_gpu",
    "sample_gpu_staged",
    "scan_chunks",
    "shared_bytes",
    "workspace_bytes",
]


def sample(logits: Any, *args: Any, **kwargs: Any) -> Any:
    """Dispatch: numpy logits take the CPU twin; device logits the CUDA kernel, on device parameters
    and outputs (`sample_gpu`) or, without out_tokens, on numpy parameters with numpy results
    (`sample_gpu_staged`): the twin's call works unchanged on either path."""
    if isinstance(logits, np.ndarray):
        for gpu_only in ("stream", "workspace", "cap", "out_tokens", "out_logprobs", "out_top_ids", "out_top_logprobs"):
            kwargs.pop(gpu_only, None)
        return sample_cpu(logits, *args, **kwargs)
    kwargs.pop("with_logprobs", None)  # the kernel always computes them (in the same pass)
    kwargs.pop("native", None)  # (the CPU path's C steps)
    if "out_tokens" not in kwargs:  # host parameters: staged to the device and back
        return sample_gpu_staged(logits, *args, **kwargs)
    return sample_gpu(logits, *args, **kwargs)
