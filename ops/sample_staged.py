"""`sample_gpu_staged`: the sampling kernel on device logits with host (numpy) per-row parameters,
as the twin takes them (the serving loop's call): the parameters go to the device in one
allocation, the outputs come back as numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import runtime, sample_cuda

# Per-row parameters in the order and kernel dtypes of sample_gpu (rows: [B]; eos/gen ids: [B, n]).
PARAM_DTYPES = (
    ("temperature", np.float32),
    ("top_p", np.float32),
    ("top_k", np.int32),
    ("rep_penalty", np.float32),
    ("freq_penalty", np.float32),
    ("pres_penalty", np.float32),
    ("seeds", np.uint64),
    ("counters", np.int64),
    ("min_tokens", np.int32),
    ("num_generated", np.int32),
    ("eos_ids", np.int32),
    ("gen_token_ids", np.int32),
)


def split_rows(p: dict[str, np.ndarray]) -> np.ndarray:
    """[B] bool: the rows the kernels split as sampled rows (sample_scan.cuh's `split_row`): not
    greedy, no masked EOS, no acting penalty."""
    greedy = ~(p["temperature"] > 0) | (p["top_k"] == 1) | ~(p["top_p"] > 0)
    masked = (p["eos_ids"].shape[1] > 0) & (p["num_generated"] < p["min_tokens"])
    acting = (p["rep_penalty"] != 1) | (p["freq_penalty"] != 0) | (p["pres_penalty"] != 0)
    return ~greedy & ~masked & ~((p["gen_token_ids"].shape[1] > 0) & acting)


def sample_gpu_staged(
    logits: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    rep_penalty: Any,
    freq_penalty: Any,
    pres_penalty: Any,
    seeds: Any,
    counters: Any,
    min_tokens: Any,
    num_generated: Any,
    eos_ids: Any,
    gen_token_ids: Any,
    num_logprobs: int = 0,
    *,
    stream: Any = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The kernel on device logits with host (numpy) per-row parameters, as the twin takes them:
    they are copied to one device buffer on `stream`, the four outputs come back as numpy (the call
    synchronises `stream`).  What a serving loop that builds its parameters per step calls."""
    drv, chk = runtime.driver, runtime._check
    b_sz = runtime.as_device_array(logits).shape[0]
    given = dict(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        rep_penalty=rep_penalty,
        freq_penalty=freq_penalty,
        pres_penalty=pres_penalty,
        seeds=seeds,
        counters=counters,
        min_tokens=min_tokens,
        num_generated=num_generated,
        eos_ids=eos_ids,
        gen_token_ids=gen_token_ids,
    )
    host = {
        n: np.ascontiguousarray(
            np.asarray(given[n]).astype(dt).reshape(b_sz, -1)
            if n.endswith("_ids")
            else np.asarray(given[n]).astype(dt).reshape(b_sz)
        )
        for n, dt in PARAM_DTYPES
    }
    outs = {
        "out_tokens": np.zeros(b_sz, np.int32),
        "out_logprobs": np.zeros(b_sz, np.float32),
        "out_top_ids": np.zeros((b_sz, num_logprobs), np.int32),
        "out_top_logprobs": np.zeros((b_sz, num_logprobs), np.float32),
    }
    offsets, size = {}, 0
    for name, a in (*host.items(), *outs.items()):  # 16-byte aligned slices of one allocation
        offsets[name], size = size, size + -(-a.nbytes // 16) * 16
    base = runtime.device_alloc(size)
    raw = drv.CUstream(runtime.stream_handle(stream))
    try:
        dev = {n: runtime.DeviceArray(base + offsets[n], a.shape, a.dtype) for n, a in (*host.items(), *outs.items())}
        for n, a in host.items():
            if a.nbytes:
                chk(drv.cuMemcpyHtoDAsync(dev[n].ptr, a.ctypes.data, a.nbytes, raw), "cuMemcpyHtoDAsync")
        kernel: Callable[..., Any] = sample_cuda.sample_gpu  # looked up per call (tests substitute it)
        params = (dev[n] for n, _ in PARAM_DTYPES)
        split = bool(split_rows(host).any())
        kernel(logits, *params, num_logprobs, **{n: dev[n] for n in outs}, split_sampled=split, stream=stream)
        for n, a in outs.items():
            if a.nbytes:
                chk(drv.cuMemcpyDtoHAsync(a.ctypes.data, dev[n].ptr, a.nbytes, raw), "cuMemcpyDtoHAsync")
        chk(drv.cuStreamSynchronize(raw), "cuStreamSynchronize")
    finally:
        runtime.device_free(base)
    return outs["out_tokens"], outs["out_logprobs"], outs["out_top_ids"], outs["out_top_logprobs"]
