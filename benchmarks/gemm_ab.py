"""gemm.h against an older commit's gemm.h, in one binary: whole passes over the `--demo small` (or
SHAPE=1b) linears alternating, as `benchmarks/gemm_ksplit.cc` times its two task splits.  Separate
processes for A and B differ by more than the change on this VM (the graph-level A/B of session 12
ranged ±25 % between runs of one build); one binary shares the allocation and the machine's state.

    python benchmarks/gemm_ab.py REV [--threads 1 2] [--rounds 15] [--shape small|1b] [--steps 1 2 4 8]

The older header is renamed into the same namespace (its functions and constants get `_old`), the
bench's baseline calls it; prints gemm_ksplit's lines, "ksplit" = this tree, "columns" = REV.
int8 on an AMX machine: this tree's gemm.h takes the exact path (int8_exact.h) while a REV before
it (0f53e12 and older) runs the fp32 one: that is the A/B of session 21; a REV with the exact path
has its headers inlined and renamed too (the tile state, amx_tiles.cc, is this tree's).
Note: an A/A build (REV = HEAD) shows 0.85-0.91 at int8 T = 2, 4 on two threads (code layout):
read ratios against an A/A run of the same shape.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "ops" / "cpu_kernels"
# what gemm.h (and, since session 12, gemm_blocked.h; since session 21, the exact int8 path's
# headers) defines at namespace scope; amx_enabled / amx_configure_thread (amx_tiles.cc) are shared
NAMES = (
    "kStreamRows kStreamSums kAccFloats kPassRows kPrefetchRows kPrefetchBytes kBlockedTasks kMR kNV kNR kKC kNC "
    "kPackPrefetchRows kPrefetchTiles BlockPrefetch Tiles add_partials PackedPanel PanelRun pack_panels stream_tile "
    "stream_columns stream_dispatch scale_columns stream_gemm pack pack_rows micro micro_dispatch blocked_columns gemm "
    "kAmxRows kAmxStep kAmxCols kAmxTile kAmxKB kAmxNC kAmxPrefetch pack_digits digit_at Interleave load_rows "
    "combine_digits finish_row amx_convert tile_load tile_store tile_zero tile_dp amx_unroll amx_micro amx_columns "
    "exact_gemm kVnniRows kVnniKC kVnniAcc kVnniPass vnni_rows vnni_gemm_t vnni_gemm kChainStreams chain_row "
    "kPanelVecs kPanelStreams kPanelSums kPanelPrefetchNear kPanelPrefetchFar panel_group panel_rows panel_block "
    "panel_dispatch prefetch_ahead "
    "panel_stream_gemm stream_tasks prefetch_pack_row BlockedKernel Trickle kTurnRows turn_rows panel_turns "
    "round_bf16 pair_float pair_lanes PairPanel "
    "pack_pairs pack_pair_rows"
).split()
# REV's headers inlined into its gemm.h, innermost last (each is included once)
INLINED = (
    "gemm_bf16.h",
    "gemm_blocked.h",
    "gemm_stream.h",
    "gemm_panels.h",
    "gemm_amx.h",
    "gemm_vnni.h",
    "int8_exact.h",
)


def _show(rev: str, name: str) -> str | None:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:ops/cpu_kernels/{name}"], capture_output=True, text=True
    )
    return out.stdout if out.returncode == 0 else None


def old_header(rev: str) -> str:
    """REV's gemm.h with the headers it includes of ours inlined, its names suffixed `_old`."""
    text = _show(rev, "gemm.h")
    assert text is not None, f"{rev} has no ops/cpu_kernels/gemm.h"

    def expand(m: re.Match[str]) -> str:
        # as the preprocessor with #pragma once: each include in place, inside a guard of its own, so
        # that a header first included under an #if that is off here is still defined where it is next
        # included (gemm_blocked.h under gemm_bf16.h's SPMD_HAVE_BF16_INT8), and only once
        name = m.group(1)
        if name not in INLINED:
            return m.group(0)
        body = _show(rev, name)
        guard = "GEMM_OLD_" + re.sub(r"\W", "_", name).upper()
        return "" if body is None else f"#ifndef {guard}\n#define {guard}\n{inline(body)}\n#endif\n"

    def inline(src: str) -> str:
        return re.sub(r'#include "([a-z0-9_]+\.h)"\n', expand, src)

    text = inline(text)
    text = re.sub(r'#include "(simd|thread_pool|weights)\.h"\n|#pragma once\n', "", text)
    return re.sub(r"\b(%s)\b" % "|".join(NAMES), r"\1_old", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rev")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shape", default="small", choices=["small", "1b"])
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8], help="rows of x (T) to time")
    ap.add_argument("--dtypes", default="fp32,int8", help="of fp32, int8, panels (fp32 in F32P)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "gemm_old.h").write_text(old_header(args.rev))
        bench = (ROOT / "benchmarks" / "gemm_ksplit.cc").read_text()
        bench = bench.replace('#include "gemm.h"\n', '#include "gemm.h"\n#include "gemm_old.h"\n')
        bench = bench.replace("which ? columns(", "which ? gemm_old(")
        # panels: REV's gemm (with a null scale) in place of this tree's
        bench = bench.replace("which ? panels_base(x.data(), w, T,", "which ? gemm_old(x.data(), w, nullptr, T,")
        (Path(tmp) / "ab.cc").write_text(bench)
        exe = Path(tmp) / "ab"
        subprocess.run(
            [
                "g++",
                "-O3",
                "-march=native",
                "-std=c++17",
                "-pthread",
                f"-I{KERNELS}",
                f"-I{tmp}",
                f"-I{ROOT / 'benchmarks'}",
                str(Path(tmp) / "ab.cc"),
                str(KERNELS / "thread_pool.cc"),
                str(KERNELS / "amx_tiles.cc"),
                "-o",
                str(exe),
            ],
            check=True,
        )
        env = dict(os.environ, SHAPE=args.shape, TS=",".join(map(str, args.steps)), DTYPES=args.dtypes)
        for threads in args.threads:
            subprocess.run([str(exe), str(threads), str(args.rounds)], check=True, env=env)


if __name__ == "__main__":
    main()
