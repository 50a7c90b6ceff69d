"""A stack of [in, out] weights applied as one batched matmul ([N, T, in] @ [N, in, out]): DeepSeek's
routed experts (N = this rank's experts) and MLA's absorbed per-head projections (N = heads).

Forms as export/layers.py's Linear classes: fp32, weight_only_int8 (one scale per output channel
of each weight), weight_only_int4 (per output channel and input group, packed two per byte).  A
quantised stack is dequantised to fp32 right before its matmul (one transient weight-sized tensor;
this CPU build has no batched int8 matmul), so the params stay int8 / int4 on disk and in memory.
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle import nn

from spmd_serve.export.layers import make_param, unpack_int4
from spmd_serve.export.quant import QuantStack


class BatchedLinear(nn.Layer):
    """x [N, T, in] (or [T, in], broadcast over N) @ the stack → [N, T, out]."""

    def __init__(self, w: np.ndarray | QuantStack) -> None:
        super().__init__(name_scope="batched_linear")
        self.method = getattr(w, "method", None)
        if isinstance(w, QuantStack):
            self.register_buffer("qweight", paddle.to_tensor(w.q), persistable=True)
            self.scale = make_param(self, w.scale)
            self.n, self.fan_out = w.q.shape[0], w.q.shape[2]
            self.fan_in, self.group = w.q.shape[1] * (2 if w.method == "weight_only_int4" else 1), w.group
        else:
            self.weight = make_param(self, w)

    def weight_fp32(self):
        """The stack as fp32 [N, in, out]."""
        if self.method is None:
            return self.weight
        if self.method == "weight_only_int8":
            return self.qweight.astype("float32") * self.scale.unsqueeze(1)
        g = self.group
        q = unpack_int4(self.qweight, self.fan_in, g)  # [N, G, g, out]
        return (q * self.scale.unsqueeze(2)).reshape([self.n, self.fan_in, self.fan_out])

    def forward(self, x):
        return paddle.matmul(x, self.weight_fp32())
