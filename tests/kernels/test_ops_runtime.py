"""ops/runtime.py with ops/nvrtc.py and ops/device.py: NVRTC compile + disk cache + errors, GPU detection,
import hygiene (CI, no GPU needed); plus a launch round trip on a real GPU (marked `gpu`, skipped without
one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ops import nvrtc, runtime

REPO = Path(__file__).resolve().parents[2]
ADD_ONE = r"""
extern "C" __global__ void add_one(float* x, int n, float delta) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += delta;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPMD_OPS_CACHE", str(tmp_path / "ops-cache"))
    return tmp_path / "ops-cache"


def test_gpu_available_is_false_without_a_driver() -> None:
    assert isinstance(runtime.gpu_available(), bool)  # never raises
    if not Path("/dev/nvidiactl").exists():
        assert runtime.gpu_available() is False


@pytest.mark.skipif(runtime.gpu_available(), reason="checks the no-GPU errors")
def test_gpu_only_calls_fail_clearly_without_a_gpu(cache) -> None:
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        runtime.compile_cubin(ADD_ONE, "add_one")  # arch=None means the current device's
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        runtime.load_kernel(ADD_ONE, "add_one")


def test_ops_imports_neither_spmd_serve_nor_paddle() -> None:
    code = (
        "import importlib, pkgutil, sys, ops\n"
        "for m in pkgutil.iter_modules(ops.__path__): importlib.import_module('ops.' + m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('spmd_serve', 'paddle', 'paddlenlp'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compile_writes_cache_and_hits_it(cache, monkeypatch, arch) -> None:
    cubin = runtime.compile_cubin(ADD_ONE, "add_one", arch)
    assert cubin and b"add_one" in cubin
    files = list(cache.glob("*.cubin"))
    assert len(files) == 1 and arch in files[0].name
    assert not list(cache.glob(".tmp-*"))  # atomic write leaves no temp file behind

    def no_compile(*args):
        raise AssertionError("cache miss: NVRTC ran again")

    monkeypatch.setattr(nvrtc, "_nvrtc_compile", no_compile)
    assert runtime.compile_cubin(ADD_ONE, "add_one", arch) == cubin


def test_a_compile_leaves_pythons_shared_bytes_objects_alone() -> None:
    """NVRTC writes its log, PTX and cubin into buffers we hand it.  Once those were `b" " * size`,
    and an empty log (size 1) made that the interpreter's one shared `b" "`: NVRTC's NUL turned every
    later `b" "` of the process into `b"\\x00"` (a tokenizer test far away saw a space come back as a
    NUL).  In a process of its own, so that a regression cannot corrupt this tier's."""
    code = (
        "from ops import nvrtc\n"
        "from tests.kernels.test_ops_runtime import ADD_ONE\n"
        "for ptx in (False, True):\n"
        "    assert b'add_one' in nvrtc._nvrtc_compile(ADD_ONE, 'add_one', 'sm_80', (), ptx=ptx)\n"
        "bad = [(i, bytes([i])[0]) for i in range(256) if bytes([i])[0] != i]\n"
        "assert not bad, f'one-byte bytes objects changed (value, now): {bad}'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_cache_key_covers_source_arch_and_options(cache) -> None:
    runtime.compile_cubin(ADD_ONE, "add_one", "sm_80")
    runtime.compile_cubin(ADD_ONE, "add_one", "sm_80", ("-DUNUSED=1",))
    runtime.compile_cubin(ADD_ONE, "add_one", "sm_90")
    runtime.compile_cubin(ADD_ONE + "\n// edited\n", "add_one", "sm_80")
    assert len(list(cache.glob("*.cubin"))) == 4


def test_corrupt_or_unwritable_cache_does_not_break_compiles(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the cache "directory" is a file: writes fail, compiles must not
    monkeypatch.setenv("SPMD_OPS_CACHE", str(blocker))
    assert runtime.compile_cubin(ADD_ONE, "add_one", "sm_80")


def test_broken_source_raises_nvrtc_error_with_log(cache) -> None:
    broken = 'extern "C" __global__ void broken(float* x) { x[0] = not_declared; }'
    with pytest.raises(runtime.NvrtcError) as info:
        runtime.compile_cubin(broken, "broken", "sm_90", ("-DSOME_OPTION=3",))
    msg = str(info.value)
    assert "'broken'" in msg and "sm_90" in msg and "-DSOME_OPTION=3" in msg
    assert 'error: identifier "not_declared" is undefined' in msg  # the NVRTC log line itself
    assert not list(cache.glob("*.cubin"))


def test_dtype_helpers() -> None:
    x = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)
    back = runtime.bf16_to_float32(runtime.float32_to_bf16(x))
    assert np.all(np.abs(back - x) <= np.abs(x) * 2**-8)
    assert back[5] == 1.0 and back[6] == 1.0 + 2**-6  # ties round to even
    assert [runtime.dtype_name(d) for d in (np.float32, np.float16, np.uint16)] == ["fp32", "fp16", "bf16"]
    with pytest.raises(TypeError):
        runtime.dtype_name(np.int64)


def test_as_device_array_reads_cuda_array_interface() -> None:
    class Fake:
        __cuda_array_interface__ = {
            "data": (4096, False),
            "shape": (2, 3),
            "typestr": "<f2",
            "strides": None,
            "version": 3,
        }

    a = runtime.as_device_array(Fake())
    assert (a.ptr, a.shape, a.dtype, a.strides) == (4096, (2, 3), np.float16, None)
    assert runtime.as_device_array(a) is a
    with pytest.raises(TypeError):
        runtime.as_device_array(np.zeros(3))


def test_pack_args_points_at_each_value_in_its_c_type() -> None:
    import ctypes

    args = [2**64 - 1, np.int32(-7), np.float32(1.5), np.int64(-(2**40)), np.uint64(2**63), np.float64(0.25), 4096]
    params, holders = runtime.pack_args(args)
    assert params.dtype == np.uint64 and len(params) == len(args) and holders
    read = (ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double)
    values = [c.from_address(int(p)).value for c, p in zip((*read, ctypes.c_uint64), params)]
    assert values == [2**64 - 1, -7, 1.5, -(2**40), 2**63, 0.25, 4096]
    for bad in (True, 1.5, -1, 2**64, "0"):
        with pytest.raises(TypeError, match="kernel"):
            runtime.pack_args([0, bad])


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.gpu_available(), reason="needs an NVIDIA GPU")
def test_launch_round_trip_on_gpu(cache) -> None:
    drv, chk = runtime.driver, runtime._check
    kernel = runtime.load_kernel(ADD_ONE, "add_one")
    assert runtime.load_kernel(ADD_ONE, "add_one") is kernel  # per-process cache
    host = np.arange(1000, dtype=np.float32)
    ptr = runtime.device_alloc(host.nbytes)
    try:
        chk(drv.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "HtoD")
        kernel.launch(((host.size + 255) // 256,), (256,), [ptr, np.int32(host.size), np.float32(1.5)])
        chk(drv.cuCtxSynchronize(), "sync")
        out = np.empty_like(host)
        chk(drv.cuMemcpyDtoH(out.ctypes.data, ptr, host.nbytes), "DtoH")
    finally:
        runtime.device_free(ptr)
    np.testing.assert_array_equal(out, host + 1.5)
    with pytest.raises(TypeError, match="numpy scalar"):
        kernel.launch((1,), (1,), [ptr, 3, 1.5])
