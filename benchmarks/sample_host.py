"""Host time of one `ops.sample_cuda.sample_gpu` call (argument checks, sizing, packing the
launches' parameters: 2, or 7 with the sampled split), without a GPU: the kernels are replaced by
launches that only pack their arguments, device arrays are views of host memory.  The GPU runner
calls it every step, so this is Python on the decode path (RESULTS.md, "Sampling's host time").

    python benchmarks/sample_host.py [--batch 64] [--vocab 32000] [--calls 500]
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

from ops import runtime, sample_cuda


class PackOnly:
    """A kernel whose launch packs its parameters as a real launch does, and stops there."""

    def __init__(self, name: str) -> None:
        self.name = name

    def launch(self, grid, block, args, stream=0, shared_mem=0) -> None:
        runtime.pack_args(args, self.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--calls", type=int, default=500)
    a = ap.parse_args()
    chunks = sample_cuda.scan_chunks(a.batch, a.vocab, 132)[0]
    workspace = np.zeros(sample_cuda.workspace_bytes(a.batch, 16, chunks) // 8 + 1, np.uint64)
    runtime.load_kernel = lambda source, name, options=(): PackOnly(name)
    runtime.sm_count = lambda: 132
    runtime.scratch = lambda nbytes: workspace.ctypes.data
    sample_cuda._dynamic_smem_limit = lambda kernel: 227 * 1024
    b = a.batch
    f32, i32 = np.ones(b, np.float32), np.zeros(b, np.int32)
    host = dict(
        logits=np.zeros((b, a.vocab), np.float32), temperature=f32, top_p=f32.copy(), top_k=i32,
        rep_penalty=f32.copy(), freq_penalty=f32 * 0, pres_penalty=f32 * 0, seeds=np.zeros(b, np.uint64),
        counters=np.zeros(b, np.int64), min_tokens=i32.copy(), num_generated=i32.copy(),
        eos_ids=np.zeros((b, 1), np.int32), gen_token_ids=np.zeros((b, 16), np.int32),
        out_tokens=i32.copy(), out_logprobs=f32.copy(),
    )  # fmt: skip
    dev = {k: runtime.DeviceArray(v.ctypes.data, v.shape, v.dtype, v.strides) for k, v in host.items()}
    for split in (False, True):  # greedy-only batches (the staged call's choice) skip the split's 5 launches
        call = lambda: sample_cuda.sample_gpu(**dev, split_sampled=split)  # noqa: B023, E731
        call()
        best = min(timeit.repeat(call, number=a.calls, repeat=5)) / a.calls
        launches = 7 if split else 2
        print(
            f"sample_gpu host time, {launches} launches: {best * 1e6:.1f} us a call (batch {b}, vocab {a.vocab};"
            f" best of 5 x {a.calls})"
        )


if __name__ == "__main__":
    main()
