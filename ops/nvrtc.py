"""CUDA C sources to cubins: the kernel sources under ops/kernels/, NVRTC compilation with its error
reporting, and the on-disk cubin cache.

NVRTC does not need a driver, so `compile_cubin(..., arch="sm_80")` works on CPU-only machines (CI
compiles every kernel that way); only `arch=None` (the current device's) needs a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path

from .device import _check, device_arch, nvrtc

KERNEL_DIR = Path(__file__).parent / "kernels"


class NvrtcError(RuntimeError):
    """A failed NVRTC compile; the message carries kernel name, arch, options and the full log."""


def kernel_source(*names: str) -> str:
    """The files ops/kernels/<name>, concatenated in order, each starting on a fresh line (so a file
    may follow generated text that lacks a final newline).  The result is one translation unit:
    the files share no #include, so the cubin cache key (the text) covers all of them."""
    return "".join("\n" + (KERNEL_DIR / name).read_text(encoding="utf-8") for name in names)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Directories holding cuda_fp16.h / cuda_bf16.h (cuda.pathfinder, $CUDA_HOME, /usr/local/cuda,
    nvidia-* wheels).  The ops kernels here do not need them (they convert 16-bit types with PTX),
    but other kernels may `#include <cuda_fp16.h>`, so every compile gets whatever is found."""
    found = [
        os.environ.get("CUDA_HOME", "") + "/include",
        os.environ.get("CUDA_PATH", "") + "/include",
        "/usr/local/cuda/include",
    ]
    try:
        from cuda import pathfinder

        found.insert(0, str(pathfinder.find_nvidia_header_directory("cudart")))
    except Exception:
        pass
    try:  # pip wheels (nvidia-cuda-runtime*) put the headers under site-packages/nvidia/*/include
        import nvidia

        found += [str(p.parent) for root in nvidia.__path__ for p in Path(root).glob("*/include/cuda_fp16.h")]
    except Exception:
        pass
    unique: dict[str, str] = {}  # by real path: /usr/local/cuda is usually a symlink
    for d in found:
        if (Path(d) / "cuda_fp16.h").is_file():
            unique.setdefault(os.path.realpath(d), d)
    return tuple(unique.values())


def cache_dir() -> Path:
    """On-disk cubin cache: $SPMD_OPS_CACHE or ~/.cache/spmd_serve/ops (read on every call so tests
    and users can redirect it)."""
    return Path(os.environ.get("SPMD_OPS_CACHE") or Path.home() / ".cache" / "spmd_serve" / "ops")


def _cache_key(source: str, arch: str, options: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, arch, "\0".join(options), nvrtc_version()):
        h.update(part.encode())
        h.update(b"\x1f")  # separator so ("ab", "c") and ("a", "bc") differ
    return h.hexdigest()


def _nvrtc_output(prog, get_size, get, what: str) -> bytes:
    """One of NVRTC's outputs of `prog` (log, PTX, cubin), written into a buffer of ours.
    A bytearray, never a bytes object: CPython shares every one-byte bytes object, so the usual
    `b" " * size` with an empty log (size 1, its NUL) is the process's one `b" "`, and NVRTC's NUL
    turned every later `b" "` into `b"\\x00"` (a logprob's space bytes, tests/kernels/test_ops_runtime.py)."""
    buf = bytearray(_check(get_size(prog), f"{what}Size"))
    _check(get(prog, buf), what)
    return bytes(buf)


def _nvrtc_compile(source: str, name: str, arch: str, options: tuple[str, ...], ptx: bool = False) -> bytes:
    """The cubin of `source` for `arch` (sm_XX), or (`ptx`) its PTX for compute_XX: the front end
    only, without the PTX assembler that takes most of a cubin's time."""
    if ptx:
        arch = arch.replace("sm_", "compute_")
    full = [f"--gpu-architecture={arch}", "-std=c++17", *[f"-I{d}" for d in include_dirs()], *options]
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(full), [o.encode() for o in full])
        log = _nvrtc_output(prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, "nvrtcGetProgramLog")
        log_text = log.rstrip(b"\0").decode(errors="replace")
        if int(err) != 0:
            hint = ""
            if "could not open source file" in log_text:
                hint = f"\n(include dirs searched: {list(include_dirs()) or 'none found'})"
            raise NvrtcError(
                f"NVRTC failed to compile kernel {name!r} for {arch} (NVRTC {nvrtc_version()}, "
                f"{err!r})\noptions: {full}\n--- NVRTC log ---\n{log_text}{hint}"
            )
        if ptx:
            return _nvrtc_output(prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "nvrtcGetPTX")
        return _nvrtc_output(prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_ptx(source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> bytes:
    """The PTX of `source` for `arch`'s compute capability (not cached): what CI checks compiles."""
    return _nvrtc_compile(source, name, arch, tuple(options), ptx=True)


def compile_cubin(source: str, name: str, arch: str | None = None, options: tuple[str, ...] = ()) -> bytes:
    """Compile `source` to a cubin for `arch` ("sm_80", "sm_90"; None = the current device's).

    `name` only labels the program and error messages: a source may hold several kernels and they
    share one cubin.  Cached on disk by sha256(source, arch, options, NVRTC version); the file is
    written to a temp name and renamed so concurrent processes (MPI ranks) never read half a file."""
    arch = arch or device_arch()
    options = tuple(options)
    path = cache_dir() / f"{arch}-{_cache_key(source, arch, options)[:40]}.cubin"  # not by name: shared
    try:
        data = path.read_bytes()
        if data:
            return data
    except OSError:
        pass
    cubin = _nvrtc_compile(source, name, arch, options)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    except OSError:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)  # an unwritable cache only costs recompiles
    return cubin
