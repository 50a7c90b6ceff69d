"""ops.sample's kernel and GPU wrapper.

CI (no GPU): every kernel variant (and the Philox known-answer kernel) compiles with NVRTC, for
sm_80 or sm_90 in turn; the source embeds the twin's constants; the wrapper packs the kernel's signature.
The staged dispatch (device logits, numpy parameters and results) on a host-memory fake device.
GPU (marked `gpu`, skipped without one): the kernel equals its twin (tokens exactly, logprobs within
1e-4), on the on-chip and the multi-pass paths, all dtypes, and through the staged call; a timing print.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os

import numpy as np
import pytest

from ops import nvrtc, philox, runtime, sample_cuda, sample_twin
from ops import sample as sp
from tests.support.ops_helpers import ARCHS, device, needs_gpu, tmp_kernel_cache  # noqa: F401  (pytest fixtures)
from tests.support.ops_sample_reference import (
    assert_same,
    base_batch,
    check_16bit,
    check_edge_cases,
    check_greedy_scan,
    check_sampled_split,
    check_split_gather_lists,
    make_batch,
    run_gpu,
)


# ----------------------------------------------------------------------------- NVRTC
def test_every_kernel_compiles() -> None:
    """Every dtype's kernel, the archs taken in turn (each arch at least once): the first a cubin
    (NVRTC's front end and PTX assembler), the others their PTX (the front end, where dtypes and
    archs differ; the assembler is ~60 % of a cubin's ~10 s here). The `gpu` tests build cubins."""
    plan = [(ARCHS[i % len(ARCHS)], dt, opts) for i, (dt, opts) in enumerate(sp.VARIANTS.items())]
    assert {arch for arch, _, _ in plan} == set(ARCHS)
    programs = [(sp.CUDA_SOURCE, sp.SAMPLE_KERNELS[dt], tuple(opts), arch) for arch, dt, opts in plan]
    programs.append((philox.KAT_SOURCE, philox.KAT_KERNEL, (), ARCHS[-1]))
    builds = [runtime.compile_cubin] + [nvrtc.compile_ptx] * (len(programs) - 1)
    with concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:  # NVRTC frees the GIL
        outs = list(pool.map(lambda b, p: b(p[0], p[1], p[3], p[2]), builds, programs))
    assert all(out and name.encode() in out for (_, name, _, _), out in zip(programs, outs))
    assert outs[0][:4] == b"\x7fELF" and b".entry " + programs[1][1].encode() in outs[1]


def test_source_constants_are_the_twins() -> None:
    """The CUDA source embeds the twin's float32 constants bit for bit."""
    for n, c in enumerate(sample_twin._COEF):
        assert f"#define COEF{n} __int_as_float(0x{int(c.view(np.uint32)):08X})" in sp.CUDA_SOURCE
    assert "#define LOG2E __int_as_float(0x3FB8AA3B)" in sp.CUDA_SOURCE
    assert float(sp.CUDA_SOURCE.split("#define LN2_31 ")[1].split()[0]) == sample_twin._LN2_31


def _check_packing(macro: str, args: list) -> dict:
    """The launch arguments match the extern "C" signature of kernel `macro` (count and C types);
    returns them by parameter name."""
    import re

    sig = re.search(macro + r"\((.*?)\)\s*\{", sp.CUDA_SOURCE, re.S).group(1)
    params = [" ".join(p.split()) for p in sig.split(",")]
    assert len(args) == len(params), macro
    for p, a in zip(params, args):
        if "*" in p:
            assert isinstance(a, int), p  # device pointer
        else:
            want = {"int": np.int32, "long long": np.int64}[p.rsplit(" ", 1)[0].replace("const ", "")]
            assert type(a) is want, p
    return dict(zip([p.rsplit(" ", 1)[1].lstrip("*") for p in params], args))


def test_gpu_wrapper_packs_the_kernel_signature(monkeypatch) -> None:
    """Without a GPU: the split scan, then the main kernel, each launched with arguments that match
    its extern "C" signature, sharing the workspace (the scan's parts, then the hash tables)."""
    launched: list[dict] = []

    class FakeKernel:
        function = None

        def __init__(self, name: str) -> None:
            self.name = name

        def launch(self, grid, block, args, stream=0, shared_mem=0):
            launched.append(dict(name=self.name, grid=grid, block=block, args=args, shared_mem=shared_mem))

    monkeypatch.setattr(runtime, "load_kernel", lambda source, name, options=(): FakeKernel(name))
    monkeypatch.setattr(runtime, "sm_count", lambda: 132)
    monkeypatch.setattr(sample_cuda, "_dynamic_smem_limit", lambda kernel: 200 * 1024)
    monkeypatch.setattr(runtime, "scratch", lambda nbytes: 0xABC000)
    b_sz, v_sz, n = 3, 5000, 2
    batch = make_batch(np.random.default_rng(0), b_sz, v_sz)
    dev = {k: runtime.DeviceArray(0x1000 * (i + 1), v.shape, v.dtype) for i, (k, v) in enumerate(batch.items())}
    outs = dict(
        out_tokens=runtime.DeviceArray(0x90000, (b_sz,), np.dtype(np.int32)),
        out_logprobs=runtime.DeviceArray(0x91000, (b_sz,), np.dtype(np.float32)),
        out_top_ids=runtime.DeviceArray(0x92000, (b_sz, n), np.dtype(np.int32)),
        out_top_logprobs=runtime.DeviceArray(0x93000, (b_sz, n), np.dtype(np.float32)),
    )
    sp.sample_gpu(**dev, num_logprobs=n, **outs)
    zero, scan, plan, split_pass, want, gather, main = launched
    assert [k["name"] for k in launched] == [
        *("sample_split_zero", "sample_scan_fp32", "sample_split_plan", "sample_split_pass_fp32"),
        *("sample_split_want", "sample_split_pass_fp32", "sample_fp32"),
    ]
    chunks, chunk = sp.scan_chunks(b_sz, v_sz, 132)
    parts = 0xABC000
    split = parts + b_sz * sample_cuda.MAX_SCAN_CHUNKS * sample_cuda.SCAN_PART_BYTES
    lists = split + b_sz * sample_cuda.SPLIT_ROW_BYTES
    tables = lists + b_sz * chunks * sample_cuda.SPLIT_CAP * 8
    assert scan["grid"] == (chunks, b_sz) and chunks == 3
    assert scan["block"] == zero["block"] == (sample_cuda.SCAN_THREADS,)
    assert zero["grid"] == plan["grid"] == main["grid"] == (b_sz,) and plan["block"] == main["block"] == (sp.THREADS,)
    s = _check_packing("SCAN_KERNEL", scan["args"])
    assert s["chunk"] == chunk and s["parts"] == parts and s["V"] == v_sz and s["num_logprobs"] == n
    assert s["split"] == split
    assert _check_packing("sample_split_zero", zero["args"])["split"] == split
    p = _check_packing("sample_split_plan", plan["args"])
    assert p["split"] == split and p["V"] == v_sz and plan["shared_mem"] == 4096 * 12
    for kernel, mode in ((split_pass, 0), (gather, 1)):  # one kernel: the second read, then the gather
        q = _check_packing("SPLIT_PASS_KERNEL", kernel["args"])
        assert (q["split"], q["lists"], q["chunk"], q["ld"], q["gather"]) == (split, lists, chunk, v_sz, mode)
        assert kernel["grid"] == (chunks, b_sz) and kernel["block"] == (sample_cuda.SCAN_THREADS,)
    w = _check_packing("sample_split_want", want["args"])
    assert (w["split"], w["num_logprobs"], w["seeds"], want["shared_mem"]) == (split, n, dev["seeds"].ptr, 4096 * 12)
    named = _check_packing("SAMPLE_KERNEL", main["args"])
    assert named["V"] == v_sz and named["ld"] == v_sz and named["num_logprobs"] == n
    assert named["scan_parts"] == parts and named["scan_chunks"] == chunks
    assert (named["split"], named["split_lists"]) == (split, lists)
    n_gen = batch["gen_token_ids"].shape[1]
    assert named["workspace"] == tables and named["hash_bits"] == sp.hash_bits(n_gen)
    assert sp.workspace_bytes(b_sz, n_gen, chunks) == tables - parts + b_sz * (8 << sp.hash_bits(n_gen))
    assert named["out_top_ids"] == 0x92000 and named["logits"] == dev["logits"].ptr
    assert main["shared_mem"] == sp.shared_bytes(v_sz, int(named["cap"])) <= 200 * 1024 and w["cap"] == named["cap"]
    launched.clear()  # the caller knows no row is a split sampled one: the scan and the main kernel only
    sp.sample_gpu(**dev, num_logprobs=n, **outs, split_sampled=False)
    assert [k["name"] for k in launched] == ["sample_scan_fp32", "sample_fp32"]
    assert _check_packing("SCAN_KERNEL", launched[0]["args"])["split"] == 0
    assert _check_packing("SAMPLE_KERNEL", launched[1]["args"])["split"] == 0
    with pytest.raises(TypeError, match=r"top_k must be int32 \[3\], got float32"):  # wrong dtype is refused
        sp.sample_gpu(**dict(dev, top_k=dev["temperature"]), **outs)
    with pytest.raises(TypeError, match="seeds must be uint64 or int64"):
        sp.sample_gpu(**dict(dev, seeds=dev["temperature"]), **outs)
    with pytest.raises(TypeError, match="out_logprobs must be float32"):
        sp.sample_gpu(**dev, num_logprobs=n, **dict(outs, out_logprobs=outs["out_tokens"]))


@pytest.mark.parametrize("batch,vocab", [(1, 131072), (128, 131072), (1000, 151936), (7, 37), (64, 2049)])
def test_scan_chunks_cover_the_row_in_aligned_chunks(batch, vocab) -> None:
    chunks, chunk = sp.scan_chunks(batch, vocab, 132)
    assert 1 <= chunks <= sample_cuda.MAX_SCAN_CHUNKS and chunk % 256 == 0
    assert (chunks - 1) * chunk < vocab <= chunks * chunk  # every chunk holds tokens
    assert chunks == 1 or chunk > 1024


def _host_view(a: runtime.DeviceArray) -> np.ndarray:
    """A numpy view of a DeviceArray whose pointer is host memory (the fake device below)."""
    n = int(np.prod(a.shape)) * a.dtype.itemsize
    return (
        np.frombuffer((ctypes.c_char * n).from_address(a.ptr), a.dtype).reshape(a.shape)
        if n
        else np.zeros(a.shape, a.dtype)
    )


def test_staged_dispatch_copies_host_parameters_and_results(monkeypatch) -> None:
    """Without a GPU: `sample` on device logits and numpy parameters (the serving loop's call)
    stages them into one device allocation, launches with the twin's argument order, copies the
    outputs back.  Host memory stands in for the device; the "kernel" is the twin on those views."""
    bufs: dict[int, ctypes.Array] = {}

    def alloc(nbytes: int) -> int:
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        bufs[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    class FakeDriver:
        CUstream = int

        @staticmethod
        def cuMemcpyHtoDAsync(dst, src, n, stream):
            ctypes.memmove(dst, src, n)
            return (0,)

        cuMemcpyDtoHAsync = cuMemcpyHtoDAsync

        @staticmethod
        def cuStreamSynchronize(stream):
            return (0,)

    def fake_kernel(logits, *params, **kw):
        outs = sp.sample_cpu(_host_view(logits), *(_host_view(a) for a in params[:12]), params[12])
        for name, val in zip(("out_tokens", "out_logprobs", "out_top_ids", "out_top_logprobs"), outs):
            _host_view(kw[name])[...] = val

    monkeypatch.setattr(runtime, "device_alloc", alloc)
    monkeypatch.setattr(runtime, "device_free", lambda ptr: bufs.pop(ptr))
    monkeypatch.setattr(runtime, "driver", FakeDriver)
    monkeypatch.setattr(sample_cuda, "sample_gpu", fake_kernel)
    batch = make_batch(np.random.default_rng(15), 9, 300, gen_len=7, n_eos=3)
    logits = np.ascontiguousarray(batch.pop("logits"))
    dev = runtime.DeviceArray(logits.ctypes.data, logits.shape, logits.dtype)
    # the engine passes int64 / Python-typed arrays: the staging converts to the kernel's dtypes
    loose = dict(batch, top_k=batch["top_k"].astype(np.int64), eos_ids=batch["eos_ids"].astype(np.int64))
    got = sp.sample(dev, **loose, num_logprobs=3, with_logprobs=False)
    want = sp.sample_cpu(logits, **batch, num_logprobs=3)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray)
        np.testing.assert_array_equal(g, w)
    assert not bufs  # the staging buffer was freed


# ----------------------------------------------------------------------------- GPU
def on_gpu(test):  # the `gpu` marker and the skip without a GPU
    return pytest.mark.gpu(needs_gpu(test))


@on_gpu
@pytest.mark.parametrize("cap", [None, 0])  # None: on-chip candidates; 0: multi-pass over the row
@pytest.mark.parametrize("v_sz,scale", [(50000, 1.0), (50000, 12.0), (151936, 4.0), (1000, 3.0), (37, 2.0)])
def test_gpu_equals_twin_fp32(device, cap, v_sz, scale) -> None:
    rng = np.random.default_rng(v_sz + int(scale))
    batch = make_batch(rng, 64, v_sz, scale=scale, gen_len=40, n_eos=3)
    assert_same(run_gpu(device, batch, n_top=5, cap=cap), sp.sample_cpu(**batch, num_logprobs=5))


@on_gpu
@pytest.mark.parametrize("cap", [None, 0])
def test_gpu_equals_twin_edge_cases(device, cap) -> None:
    check_edge_cases(device, cap, v_sz=70000, big_k=10000, rows=32)


@on_gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_gpu_equals_twin_16bit(device, dtype) -> None:
    check_16bit(device, dtype, rows=32, v_sz=32003)


@on_gpu
@pytest.mark.parametrize("dtype,v_sz", [("fp32", 131072), ("fp16", 151936), ("bf16", 32003), ("fp32", 37)])
def test_gpu_split_scan_equals_twin(device, dtype, v_sz) -> None:
    check_greedy_scan(device, dtype, v_sz)


@on_gpu
@pytest.mark.parametrize(
    "dtype,v_sz,cap", [("fp32", 131072, None), ("fp32", 131072, 0), ("fp16", 151936, None), ("bf16", 32003, None)]
)
def test_gpu_sampled_split_equals_twin(device, dtype, v_sz, cap) -> None:
    check_sampled_split(device, dtype, v_sz, cap)
    if (dtype, v_sz, cap) == ("fp32", 131072, None):  # 128 rows: 9 chunks of 14592, a list is 4096
        check_split_gather_lists(device, rows=128, v_sz=v_sz)


@on_gpu
def test_gpu_timing_against_one_read_of_the_logits(device, capsys) -> None:
    """Prints (no assertion: speed goals live in benchmarks) sampling time / one copy of the logits
    for 128 x 128k fp32; goal <= 3.  Device time only (ops.bench's timing: the calls queue behind a
    spin kernel), and the host's launch cost per call beside it."""
    from ops.bench import time_per_call

    drv, chk = runtime.driver, runtime._check
    b_sz, v_sz = 128, 128 * 1024
    rng = np.random.default_rng(12)
    for label, scale, over in (
        ("flat top_p=0.9", 1.0, dict(top_p=0.9)),
        ("flat T only", 1.0, {}),
        ("top_k=50 top_p=0.9", 1.0, dict(top_k=50, top_p=0.9)),
        ("peaked top_p=0.9", 8.0, dict(top_p=0.9)),
        ("greedy", 1.0, dict(temperature=0.0)),
    ):
        logits = (rng.standard_normal((b_sz, v_sz)) * scale).astype(np.float32)
        batch = base_batch(logits, counters=np.arange(b_sz), **over)
        dev = {k: device.put(v) for k, v in batch.items()}
        outs = dict(out_tokens=device.empty((b_sz,), np.int32), out_logprobs=device.empty((b_sz,), np.float32))
        copy_dst = device.empty(logits.shape, np.float32)
        split = label != "greedy"  # as the staged call decides
        t_sample, host = time_per_call(lambda: sp.sample_gpu(**dev, **outs, split_sampled=split))  # noqa: B023
        # the one-block path of the same rows, for the split's gain
        t_one = time_per_call(lambda: sp.sample_gpu(**dev, **outs, split_sampled=False))[0]  # noqa: B023
        # a device-to-device copy reads and writes: half its time is one read of the logits
        copy = lambda: chk(drv.cuMemcpyDtoD(copy_dst.ptr, dev["logits"].ptr, logits.nbytes), "DtoD")  # noqa: B023, E731
        t_read = time_per_call(copy)[0] / 2
        with capsys.disabled():
            print(
                f"\nsample {label}: {t_sample * 1e6:.1f} us (host {host * 1e6:.0f} us a call), one read "
                f"{t_read * 1e6:.1f} us, ratio {t_sample / t_read:.2f} (goal <= 3; one block {t_one / t_read:.2f})"
            )


@on_gpu
def test_gpu_staged_call_equals_twin(device) -> None:
    """The serving loop's call: device logits, numpy parameters, numpy results."""
    batch = make_batch(np.random.default_rng(16), 48, 32000, scale=3.0, gen_len=20)
    logits = device.put(batch.pop("logits"))
    assert_same(sp.sample(logits, **batch, num_logprobs=4), sp.sample_cpu(device.get(logits), **batch, num_logprobs=4))
