"""The MTP draft's input stage (export/deepseek/mtp.py): enorm of the token embedding, hnorm of the
hidden row it reads (graph input `prev_hidden`), eh_proj over their concatenation.

eh_proj is row-parallel over the concatenation [T, 2H]: every rank normalises both halves (cheap,
replicated) and multiplies its 2H / tp columns by its rows of the weight, so its output is a
partial sum like every other stage's (the bias on rank 0 only); the next stage (MLA) starts the
residual stream from the reduced sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import paddle
from paddle.static import InputSpec

from spmd_serve.export.layers import make_linear, make_param, rms_norm
from spmd_serve.export.segment import Stage
from spmd_serve.export.variant import GraphVariant
from spmd_serve.manifest import PREV_HIDDEN, ShardDims


class MtpInputStage(Stage):
    """delta = the reduced embedding [T, H] → partial eh_proj([enorm(e) | hnorm(prev_hidden)]) [T, H]."""

    streamless = True  # the MLA stage after it starts the residual stream

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, rank: int) -> None:
        super().__init__()
        self.enorm, self.hnorm = make_param(self, w["mtp.enorm"]), make_param(self, w["mtp.hnorm"])
        self.eh_proj = make_linear(w["mtp.eh_proj"])  # [2H / tp, H]: this rank's input rows
        self.bias = make_param(self, w["mtp.eh_bias"])  # zeros but on rank 0
        per = 2 * dims.hidden // dims.tp
        self.cols = None if dims.tp == 1 else (rank * per, (rank + 1) * per)
        self.hidden, self.eps = dims.hidden, dims.rms_norm_eps

    def inputs(self, variant: GraphVariant) -> list[str]:
        return [PREV_HIDDEN]

    def input_spec(self, name: str, variant: GraphVariant) -> InputSpec | None:
        return InputSpec([-1, self.hidden], "float32", name) if name == PREV_HIDDEN else None

    def step(self, h, delta, env: dict, variant: GraphVariant):
        e = rms_norm(delta, self.enorm, self.eps, variant)
        x = paddle.concat([e, rms_norm(env[PREV_HIDDEN], self.hnorm, self.eps, variant)], axis=-1)  # [T, 2H]
        if self.cols is not None:
            x = x[:, self.cols[0] : self.cols[1]]  # [T, 2H / tp]
        return None, self.eh_proj(x, variant) + self.bias, []
