"""Logits of a model directory's first two steps, in this process (one rank), and checkpoints rounded to a
16-bit dtype: what the 16-bit export tests (tests/kernels/test_cpu_linear_op.py, tests/graphs/
test_deepseek_export.py) compare."""

from __future__ import annotations

import shutil

import numpy as np

from spmd_serve.export.quant import bf16_bits, from_bf16_bits
from tests.support.sim_ranks import OneRank


def step_logits(model_dir) -> tuple[np.ndarray, np.ndarray]:
    """Logits of a 4-token prefill of 3 sequences, then of a decode step of the 3."""
    from spmd_serve.protocol import RUN, StepPlan
    from spmd_serve.worker.model_runner import ModelRunner

    runner = ModelRunner(model_dir, 0, OneRank(), num_blocks=8, block_size=16)
    seqs, blocks = np.arange(3), np.arange(1, 4).reshape(3, 1)  # sequence i in block i + 1
    prefill = np.array([[5, 17, 99, 3], [8, 8, 200, 41], [77, 2, 13, 400]], np.int64)
    pos = np.tile(np.arange(4), 3)
    first = runner.execute(
        StepPlan(
            RUN,
            1,
            prefill.reshape(-1),
            pos,
            np.full(3, 4),
            np.zeros(3, np.int64),
            blocks,
            np.repeat(blocks[:, 0], 4) * 16 + pos,
        )
    )
    step = StepPlan(
        RUN,
        2,
        np.array([9, 300, 64]),
        np.full(3, 4),
        np.ones(3, np.int64),
        np.full(3, 4),
        blocks,
        blocks[seqs, 0] * 16 + 4,
    )
    return first, runner.execute(step)


ROUND = {  # a 16-bit dtype → float32 values rounded to it (still float32)
    "bfloat16": lambda v: from_bf16_bits(bf16_bits(v)),
    "float16": lambda v: v.astype(np.float16).astype(np.float32),
}


def rounded_checkpoint(source, out, dtype: str):
    """A copy of checkpoint `source` with every float tensor rounded to `dtype`'s values (still stored
    as float32): what a bfloat16 or float16 HF checkpoint holds."""
    from safetensors.numpy import load_file, save_file

    ckpt = shutil.copytree(source, out)
    for f in ckpt.glob("*.safetensors"):
        save_file({k: ROUND[dtype](v) if v.dtype == np.float32 else v for k, v in load_file(str(f)).items()}, str(f))
    return ckpt
