"""The CUDA side of ops.sample: the kernel source (CUDA C in ops/kernels/sample_*.cuh and sample.cu,
after the dtype prelude, Philox and the twin's float32 constants as #defines), its launch sizing
(shared memory, workspace) and the GPU wrapper `sample_gpu`.  Semantics: ops/sample.py's docstring.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import runtime
from .philox import CUDA_SOURCE as PHILOX_CUDA
from .sample_launch import Launch
from .sample_twin import _COEF, _LN2_31, _LOG2E, MAX_VOCAB, check_num_logprobs

THREADS = 1024  # one block of THREADS per row (512 measured no better on an H100: RESULTS.md)
SCAN_THREADS = 256  # the split scan's blocks (sample_scan.cuh)
MAX_SCAN_CHUNKS = 64  # chunks per row of the split scan, at most (sizes its workspace)
SCAN_PART_BYTES = 16  # one ScanPart: u64 arg-max key, float max, float sum
# one SplitRow (sample_scan.cuh): 4 u64, 2 u32, u32 chunk_n[MAX_SCAN_CHUNKS], u32 wanted[128], int, u32,
# u32 cnt[4096], u64 mass[4096]
SPLIT_ROW_BYTES = 4 * 8 + 2 * 4 + 4 * MAX_SCAN_CHUNKS + 4 * 128 + 2 * 4 + 4 * 4096 + 8 * 4096
SPLIT_CAP = 4096  # a split sampled row's region tokens per chunk list (8 bytes each), at most
# The kernel source after the generated constants, in order (one translation unit).
SOURCE_FILES = (
    "sample_row.cuh",
    "sample_block.cuh",
    "sample_search.cuh",
    "sample_scan.cuh",
    "sample_split.cuh",
    "sample_gather.cuh",
    "sample.cu",
)


def _f32_hex(x: np.float32) -> str:
    return f"__int_as_float(0x{int(np.float32(x).view(np.uint32)):08X})"


def _cuda_source() -> str:
    consts = "\n".join(
        [f"#define LOG2E {_f32_hex(_LOG2E)}", f"#define LN2_31 {_LN2_31!r}"]
        + [f"#define MAX_SCAN_CHUNKS {MAX_SCAN_CHUNKS}", f"#define SPLIT_ROW_BYTES {SPLIT_ROW_BYTES}"]
        + [f"#define COEF{n} {_f32_hex(c)}" for n, c in enumerate(_COEF)]
    )
    return runtime.CUDA_PRELUDE + PHILOX_CUDA + consts + "\n" + runtime.kernel_source(*SOURCE_FILES)


CUDA_SOURCE = _cuda_source()
SAMPLE_KERNELS = {"fp32": "sample_fp32", "fp16": "sample_fp16", "bf16": "sample_bf16"}
SCAN_KERNELS = {dt: name.replace("sample_", "sample_scan_") for dt, name in SAMPLE_KERNELS.items()}
SPLIT_PASS_KERNELS = {dt: name.replace("sample_", "sample_split_pass_") for dt, name in SAMPLE_KERNELS.items()}


PROFILE_OPTIONS: tuple[str, ...] = ()  # profiling only (ops/bench_sample.py: -DSAMPLE_STOP=k)


def compile_options(dtype: str) -> tuple[str, ...]:
    return (f"-DDTYPE_ID={runtime.DTYPE_IDS[dtype]}", *PROFILE_OPTIONS)


VARIANTS = {dt: compile_options(dt) for dt in SAMPLE_KERNELS}  # label -> NVRTC options (CI compiles all)
_FIXED_SMEM = 8 * (4096 + 1024) + 4 * (4096 + 1024)  # weight + count histograms (12- and 10-bit)


def shared_bytes(vocab: int, cap: int) -> int:
    """Dynamic shared memory of one block: histograms, `cap` candidates, the token bitmap."""
    return _FIXED_SMEM + 8 * cap + 4 * ((vocab + 31) // 32)


def hash_bits(gen_len: int) -> int:
    """log2 of the per-row hash table size: >= 2 * gen_len slots (0 = no table)."""
    return 0 if gen_len <= 0 else max(5, (2 * gen_len - 1).bit_length())


def workspace_bytes(batch: int, gen_len: int, chunks: int) -> int:
    """Workspace for sample_gpu with `chunks` = scan_chunks(...)[0]: the split scan's parts, the split
    sampled rows' SplitRows and region lists, then one (token, count) int2 hash table per row."""
    return _split_end(batch, chunks) + (batch * (8 << hash_bits(gen_len)) if gen_len > 0 else 0)


def _split_end(batch: int, chunks: int) -> int:
    """Offset past the split rows' lists in the workspace: parts | SplitRows | lists | tables."""
    return batch * (MAX_SCAN_CHUNKS * SCAN_PART_BYTES + SPLIT_ROW_BYTES + chunks * SPLIT_CAP * 8)


def scan_chunks(batch: int, vocab: int, sm_count: int) -> tuple[int, int]:
    """(chunks per row, tokens per chunk) of the split scan: ~8 blocks per SM over the batch (a
    prototype on an H200 read fastest at 8 blocks of 256 per row for 128 rows: RESULTS.md), no more
    chunks than 2048-token pieces of the row (so > 1024 tokens each), a multiple of 256 tokens (whole
    16-byte loads of every dtype)."""
    want = max(1, min(MAX_SCAN_CHUNKS, -(-8 * sm_count // max(batch, 1)), -(-vocab // 2048)))
    per_chunk = -(-vocab // want)
    chunk = -(-per_chunk // 256) * 256
    return -(-vocab // chunk), chunk


_smem_limit: dict[int, int] = {}  # id(kernel) -> dynamic shared bytes the kernel may use


def _dynamic_smem_limit(kernel: runtime.Kernel) -> int:
    """Opt the kernel into the device's largest dynamic shared memory (once) and return it."""
    key = id(kernel)
    if key not in _smem_limit:
        drv = runtime.driver
        static = runtime._check(
            drv.cuFuncGetAttribute(drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel.function),
            "cuFuncGetAttribute",
        )
        limit = runtime.device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN") - int(static)
        runtime._check(
            drv.cuFuncSetAttribute(
                kernel.function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, limit
            ),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        )
        _smem_limit[key] = limit
    return _smem_limit[key]


_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)
_ROW_DTYPES = {  # sample_gpu's [B] arguments, in its order: the dtypes each may have
    **dict.fromkeys(("temperature", "top_p"), (_F32,)),
    "top_k": (_I32,),
    **dict.fromkeys(("rep_penalty", "freq_penalty", "pres_penalty"), (_F32,)),
    "seeds": (np.dtype(np.uint64), np.dtype(np.int64)),
    "counters": (np.dtype(np.int64),),
    **dict.fromkeys(("min_tokens", "num_generated", "out_tokens"), (_I32,)),
    "out_logprobs": (_F32,),
}


def sample_gpu(
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
    out_tokens: Any,
    out_logprobs: Any,
    out_top_ids: Any = None,
    out_top_logprobs: Any = None,
    workspace: Any = None,
    cap: int | None = None,
    split_sampled: bool = True,
    stream: Any = 0,
) -> tuple[Any, Any, Any, Any]:
    """The kernel on device arrays (cupy / Paddle GPU tensors / runtime.DeviceArray) in the twin's
    order and dtypes: logits [B, V] float32/float16/uint16(bf16 bits), rows may be strided;
    temperature/top_p/penalties float32 [B]; top_k/min_tokens/num_generated int32 [B]; seeds
    uint64 (or int64 bits) [B]; counters int64 [B]; eos_ids [B, E] / gen_token_ids [B, G] int32.
    Outputs: out_tokens int32 [B], out_logprobs float32 [B], and with num_logprobs > 0
    out_top_ids int32 / out_top_logprobs float32 [B, num_logprobs].  `workspace` (>=
    workspace_bytes(B, G, chunks) bytes; default: runtime.scratch, safe on one stream).  `cap` limits
    the shared-memory candidate buffer (default: all the shared memory left; tests use 0 to force the
    multi-pass path).  `split_sampled=False`: the caller knows no row is a split sampled one (all
    greedy, say): the three launches of the sampled split are skipped.  Asynchronous."""
    lg = runtime.as_device_array(logits)
    b_sz, vocab = lg.shape
    dtype = runtime.dtype_name(lg.dtype)
    item = lg.dtype.itemsize
    if lg.strides is not None and lg.strides[1] != item:
        raise ValueError("logits rows must be contiguous")
    ld = lg.strides[0] // item if lg.strides is not None else vocab
    check_num_logprobs(num_logprobs)
    if not 0 < vocab < MAX_VOCAB:
        raise ValueError(f"vocab {vocab} out of range (1..{MAX_VOCAB - 1})")
    given = (temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty, seeds, counters, min_tokens,
             num_generated, out_tokens, out_logprobs)  # fmt: skip
    ptr: dict[str, int] = {}
    for (name, dts), arr in zip(_ROW_DTYPES.items(), given):
        a = runtime.as_device_array(arr)
        if a.shape != (b_sz,) or a.dtype not in dts:  # (np.dtype comparisons: .name costs ~5 us)
            raise TypeError(f"{name} must be {' or '.join(map(str, dts))} [{b_sz}], got {a.dtype}{a.shape}")
        ptr[name] = a.ptr
    mats = {"eos_ids": eos_ids, "gen_token_ids": gen_token_ids}
    widths: dict[str, int] = {}
    if num_logprobs:
        if out_top_ids is None or out_top_logprobs is None:
            raise ValueError("num_logprobs > 0 needs out_top_ids and out_top_logprobs")
        mats.update(out_top_ids=out_top_ids, out_top_logprobs=out_top_logprobs)
    for name, arr in mats.items():
        a = runtime.as_device_array(arr)
        want = _F32 if name == "out_top_logprobs" else _I32
        if len(a.shape) != 2 or a.shape[0] != b_sz or a.dtype != want:
            raise TypeError(f"{name} must be {want} [{b_sz}, n], got {a.dtype}{a.shape}")
        if a.strides is not None and a.shape[1] > 0 and a.strides != (a.shape[1] * 4, 4):
            raise ValueError(f"{name} must be C-contiguous")
        ptr[name], widths[name] = a.ptr, a.shape[1]
    if num_logprobs and (widths["out_top_ids"] != num_logprobs or widths["out_top_logprobs"] != num_logprobs):
        raise ValueError(f"out_top_ids / out_top_logprobs must be [{b_sz}, {num_logprobs}]")
    if b_sz == 0:
        return out_tokens, out_logprobs, out_top_ids, out_top_logprobs
    n_eos, n_gen = widths["eos_ids"], widths["gen_token_ids"]
    chunks, chunk = scan_chunks(b_sz, vocab, runtime.sm_count())
    ws = runtime.workspace_ptr(workspace, workspace_bytes(b_sz, n_gen, chunks))
    kernel = runtime.load_kernel(CUDA_SOURCE, SAMPLE_KERNELS[dtype], compile_options(dtype))
    fit = (_dynamic_smem_limit(kernel) - shared_bytes(vocab, 0)) // 8
    if fit < 0:
        raise ValueError(f"vocab {vocab} needs more shared memory than the device has (bitmap)")
    plan = Launch(lg.ptr, ld, vocab, dtype, b_sz, chunks, chunk, ws, n_eos, n_gen, num_logprobs)
    plan.run(ptr, kernel, fit if cap is None else min(cap, fit), split_sampled, stream)
    return out_tokens, out_logprobs, out_top_ids, out_top_logprobs
