"""Paddle CPU custom operators in C++ (ops/cpu_kernels/*.cc): built once per machine with the
system C++ compiler against the installed Paddle and MPI, cached on disk, registered per process.

The CUDA kernels of this package run on raw device pointers; these run *inside* exported Paddle
graphs on the CPU build, where Paddle lacks what the engine needs:
* `spmd_allreduce` — an MPI_Allreduce in the graph (Paddle's CPU collective goes through gloo at
  ~2 ms a call), so a tensor-parallel rank runs one graph per step instead of one per stage.
* `spmd_linear`, `_panels`, `_bf16`, `_f16`, `_int8`, `_int4` — x[T, K] @ W for every T: one pass
  over W for decode steps, a packed register-blocked micro-kernel for prefill chunks (gemm.h), fp32,
  16-bit or quantised weights in the export's layout, widened or dequantised in registers.
* `spmd_paged_attention` — any step's (prefill chunks, decodes, mixed) RoPE, K/V write into the
  paged pool and causal GQA attention over the flat token layout (the core: attention.h).
* `spmd_rms_norm`, `spmd_add_rms_norm`, `spmd_swiglu` — the layer's elementwise steps, threaded
  (Paddle's CPU kernels for them are single-threaded; swiglu's is scalar).
* `spmd_norm_linear`, `_panels`, `_bf16`, `_f16`, `_int8`, `_int4` — a residual add + RMSNorm, the linear it feeds and
  (attr) the SwiGLU after it as one op: Paddle's ~9 us a call is most of a small op's time at
  batch 1; equal bit for bit to the separate ops.
* `spmd_linear_norm_linear`, `_panels`, `_bf16`, `_f16`, `_int8`, `_int4` — the row-shard linear before that (a layer's
  o_proj or down), its all-reduce at TP > 1 (attr) and `spmd_norm_linear*` as one op: a Llama layer
  runs 3 ops, not 5 (7 at TP > 1); equal bit for bit to the separate ops (export/deferred.py).
* `spmd_mla_decode`, `spmd_moe_experts` (`_int8`, `_int4`) — DeepSeek's decode attention in latent
  space over the paged latent pool (with its pool write; a task per sequence and head), and the
  routed experts each over its own tokens (a task per expert, its products gemm.h's).
The kernels run on a persistent thread pool in the library, sized by `set_num_threads` (default 1).

A graph that uses them needs the library registered before `paddle.jit.save` traces it and before
`paddle.inference` loads it: call `load()` first.  Building needs a C++17 compiler (`g++`) and the
MPI headers (Debian: `libopenmpi-dev`); `unavailable()` says why not, so callers can fall back.
Paddle is imported only inside these functions (the package rule, ops/__init__.py).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from ops.nvrtc import cache_dir

KERNELS = Path(__file__).with_name("cpu_kernels")
LIB_NAME = "spmd_cpu_ops.so"
# -march=native: the library is built on the machine that runs it (the cache key has its CPU flags).
# SPMD_OPS_MARCH overrides it, to build and test the other code paths of the kernels here (simd.h):
# x86-64-v3 (AVX2 + FMA, no AVX-512), x86-64 (the plain C++ fallback).  SPMD_OPS_EMULATE_WIDTH=16 (or 8)
# builds the plain fallback with that many lanes: AVX-512's tiles and tails, tested on a CPU without it.
CXXFLAGS = (
    "-O3",
    "-fPIC",
    "-shared",
    "-std=c++17",
    "-pthread",
    "-w",
    "-DPADDLE_NO_PYTHON",  # paddle/extension.h without Python.h (no python3-dev needed)
    "-DPADDLE_WITH_CUSTOM_KERNEL",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-DOMPI_SKIP_MPICXX",
    "-DMPICH_SKIP_MPICXX",
)  # the C API of mpi.h only


SOURCE_FLAGS = {"sample_draw.cc": ("-ffp-contract=off",)}  # the numpy twin's float32 steps bit for bit: no FMA


class ExtensionUnavailable(RuntimeError):
    """The C++ op library cannot be built or loaded here; the message says why and what to install."""


def sources() -> list[Path]:
    """The translation units compiled into the library."""
    return sorted(KERNELS.glob("*.cc"))


def headers() -> list[Path]:
    """What the sources include from here: part of the cache key, not of the command line."""
    return sorted(KERNELS.glob("*.h"))


def _mpi_flags() -> tuple[list[str], list[str]]:
    """(compile, link) flags of the MPI that mpi4py loads, from its compiler wrapper."""
    mpicc = shutil.which(os.environ.get("MPICC") or "mpicc")
    if not mpicc:
        raise ExtensionUnavailable("no `mpicc` on PATH for the MPI headers (Debian: apt-get install libopenmpi-dev)")

    def ask(*args: str) -> list[str]:
        out = subprocess.run([mpicc, *args], capture_output=True, text=True, timeout=30)
        return shlex.split(out.stdout) if out.returncode == 0 else []

    compile_, link = ask("--showme:compile"), ask("--showme:link")  # Open MPI
    if not compile_:  # MPICH: the full command lines
        compile_, link = ask("-compile_info")[1:], ask("-link_info")[1:]
    if not compile_ and not link:
        raise ExtensionUnavailable(f"`{mpicc}` does not report its flags (neither Open MPI nor MPICH)")
    return compile_, link


def _paddle_dirs() -> tuple[Path, str]:
    import paddle

    root = Path(paddle.__file__).parent
    return root, paddle.__version__


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _emulate_flags() -> list[str]:
    """-DSPMD_EMULATE_WIDTH=N when SPMD_OPS_EMULATE_WIDTH asks for it (simd.h), at -O1 (after
    CXXFLAGS' -O3, so it wins): a build for tests of the tiles, never served.  -O1 compiled it in 17 s
    on 2 cores against ~65 s at -O3, and the op tests ran as fast on it (6.3 against 7.5 s: their
    time is the float64 references).  One difference in the arithmetic: below -O2 GCC contracts no
    a * b + c into an FMA (C++'s default -ffp-contract=fast acts from -O2), so scalar code outside
    simd.h's explicit fmadd / vfma may round differently from the served build; the kernels' sums
    are explicit FMA chains, and what the tests check (float64 references within a tolerance,
    bit-equality between threadings and layouts of one build) holds in both."""
    width = os.environ.get("SPMD_OPS_EMULATE_WIDTH", "")
    if not width:
        return []
    if width not in ("8", "16"):
        raise ExtensionUnavailable(f"SPMD_OPS_EMULATE_WIDTH={width!r}: 8 or 16 lanes")
    return [f"-DSPMD_EMULATE_WIDTH={width}", "-O1"]


def _commands(objs: Path, out: Path) -> tuple[list[list[str]], list[str]]:
    """(one compile command per source into `objs/`, the link command into `out`)."""
    root, _ = _paddle_dirs()
    cxx = shutil.which(os.environ["CXX"]) if os.environ.get("CXX") else shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise ExtensionUnavailable(
            f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) on PATH (Debian: apt-get install g++)"
        )
    mpi_compile, mpi_link = _mpi_flags()
    libs = [root / "libs", root / "base"]
    march = f"-march={os.environ.get('SPMD_OPS_MARCH') or 'native'}"
    includes = [f"-I{root / 'include'}", f"-I{root / 'include' / 'third_party'}"]
    flags = [march, *CXXFLAGS, *_emulate_flags(), *includes, *mpi_compile]
    own = SOURCE_FLAGS
    compiles = [[cxx, *flags, *own.get(s.name, ()), "-c", str(s), "-o", str(objs / f"{s.stem}.o")] for s in sources()]
    link = [
        cxx,
        march,
        *CXXFLAGS,
        *(str(objs / f"{src.stem}.o") for src in sources()),
        "-o",
        str(out),
        *[f"-L{d}" for d in libs],
        *[f"-Wl,-rpath,{d}" for d in libs],
        *mpi_link,
        "-Wl,--no-as-needed",
        "-l:libpaddle.so",
    ]
    return compiles, link


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _build(out: Path) -> None:
    """Compile the sources in parallel (one compiler per core: the build is ~30 s of -O3 on one
    core, and a user's first start or a fresh CI waits for it), then link them into `out`."""
    with tempfile.TemporaryDirectory(dir=out.parent) as objs:
        compiles, link = _commands(Path(objs), out)
        workers = max(1, min(len(compiles), len(os.sched_getaffinity(0))))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            runs = list(pool.map(_run, compiles))
        failed = next((r for r in runs if r.returncode != 0), None) or _run(link)
        if failed.returncode != 0:
            raise ExtensionUnavailable(f"building {LIB_NAME} failed:\n{failed.stderr[-3000:]}")


def library_path() -> Path:
    """The built library, compiling it first if this machine has no copy for these sources."""
    _, version = _paddle_dirs()
    compiles, link = _commands(Path("OBJS"), Path("OUT"))
    key = hashlib.sha256()
    parts = [p.read_bytes() for p in (*sources(), *headers())]
    commands = " ".join(" ".join(cmd) for cmd in (*compiles, link))
    for part in (*parts, version.encode(), commands.encode(), _cpu_flags().encode()):
        key.update(part)
        key.update(b"\x1f")
    target = cache_dir() / "cpu" / key.hexdigest()[:24] / LIB_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:  # ranks of one job build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            try:
                _build(tmp)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, target)
    return target


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL:
    """Build if needed and register the ops with Paddle in this process (once); the library handle.
    Registering does not initialise MPI (an exporter only traces the ops); whoever *runs* a graph
    with `spmd_allreduce` has initialised it already (mpi4py, under mpirun)."""
    with warnings.catch_warnings():  # cpp_extension warns at import that ccache is missing
        warnings.simplefilter("ignore")
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op
    path = library_path()
    load_op_meta_info_and_register_op(str(path))
    lib = ctypes.CDLL(str(path))  # the same mapping Paddle opened: reads its counters
    lib.spmd_allreduce_seconds.restype = ctypes.c_double
    lib.spmd_allreduce_calls.restype = ctypes.c_long
    lib.spmd_set_num_threads.argtypes = [ctypes.c_int]
    lib.spmd_get_num_threads.restype = ctypes.c_int
    lib.spmd_prefetch_hint.restype = ctypes.c_uint64
    lib.spmd_kv_int8_clipped.argtypes = [ctypes.c_int]
    lib.spmd_kv_int8_clipped.restype = ctypes.c_long
    return lib


def set_num_threads(n: int) -> None:
    """Threads the ops use in this process, the calling thread included (default 1).  The workers
    are created here, once, and persist (they spin ~0.2 ms after an op, then sleep); they inherit
    the caller's CPU affinity, so call it after the rank is bound.  Call it once, at start-up
    (safe at any time: an op already running finishes on the old workers)."""
    load().spmd_set_num_threads(int(n))


def num_threads() -> int:
    return load().spmd_get_num_threads()


def int8_exact() -> bool:
    """True when int8 weights take the exact-integer GEMM here (ops/cpu_kernels/int8_exact.h: a CPU
    with AMX and the kernel's grant of its tile state to this process), False for the bf16 or fp32 ones (int8_bf16)."""
    return bool(load().spmd_int8_exact())


def int8_bf16() -> bool:
    """True when int8 weights take the bf16 GEMM here (ops/cpu_kernels/gemm_bf16.h: a CPU with AVX-512
    BF16 and no AMX): x is rounded to bfloat16 before it meets the weights."""
    return bool(load().spmd_int8_bf16())


def simd() -> tuple[int, bool]:
    """(lanes of the kernels' vector, whether it is simd.h's plain array rather than intrinsics)."""
    code = load().spmd_simd_lanes()
    return code // 1000, bool(code % 1000)


def unavailable() -> str | None:
    """None when the ops can be used here, else why not."""
    try:
        load()
    except (ExtensionUnavailable, OSError, subprocess.SubprocessError, RuntimeError) as e:
        return str(e)
    return None


def run_op(name: str, *args):
    """Call custom op `name` (registered by `load`) in the graph being traced, or eagerly; its
    output, or the list of its outputs when it has several."""
    from paddle import _C_ops

    load()
    out = _C_ops._run_custom_op(name, *args)  # type: ignore[attr-defined]
    return out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out


def allreduce(x):
    """Sum of `x` over all MPI ranks (MPI must be initialised before it runs)."""
    return run_op("spmd_allreduce", x)


def kv_int8_clipped() -> tuple[int, int]:
    """(K, V) entries the int8 paged-attention op clipped to +-127 in this process, every pool
    together ((0, 0) before `load`)."""
    if not load.cache_info().currsize:
        return 0, 0
    return load().spmd_kv_int8_clipped(0), load().spmd_kv_int8_clipped(1)


def allreduce_seconds() -> float:
    """Seconds this process has spent in the in-graph allreduce (0 before `load`)."""
    return load().spmd_allreduce_seconds() if load.cache_info().currsize else 0.0
