"""A stack of [in, out] weights applied as one batched matmul ([N, T, in] @ [N, in, out]): DeepSeek's
routed experts (N = this rank's experts) and MLA's absorbed per-head projections (N = heads).

Forms as export/layers.py's Linear classes: fp32, weight_only_int8 (one scale per output channel
of each weight), weight_only_int4 (per output channel and input group, packed two per byte).  A stack
built `dense` (the routed experts) is held as `dense_weights` says the dense linears are: in the
export's --dtype (fp32, bfloat16 or float16), each weight in the panel layout with the C++ ops (the
grouped op's, export/deepseek/moe.py).  A quantised or 16-bit stack is widened to fp32 right before
Paddle's matmul (one transient weight-sized tensor; this CPU build has no batched int8 or 16-bit
matmul), so the params stay int8 / int4 / 16-bit on disk and in memory.  MLA's absorbed stacks stay
fp32 [N, in, out] in a 16-bit export (a small part of the model); with the C++ ops they run
ops/cpu_kernels/batched_matmul.cc's ops (fp32: `batched_matmul`, which mla.py's prefill attention
takes too; int8 / int4: read as they are held, not widened).
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle import nn

from ops import paddle_ext
from spmd_serve.export.layers import dense_form, hold_dense, make_param, unpack_int4
from spmd_serve.export.panels import to_panels
from spmd_serve.export.quant import QuantStack
from spmd_serve.export.variant import GraphVariant

# the grouped expert op (ops/cpu_kernels/moe_experts*.cc) of a stack in the panel layout, by dtype
_PANEL_EXPERTS = {
    "float32": "spmd_moe_experts_panels",
    "bfloat16": "spmd_moe_experts_bf16",
    "float16": "spmd_moe_experts_f16",
}


class BatchedLinear(nn.Layer):
    """x [N, T, in] (or [T, in], broadcast over N) @ the stack → [N, T, out]."""

    def __init__(self, w: np.ndarray | QuantStack, dense: bool = False) -> None:
        super().__init__(name_scope="batched_linear")
        self.method = getattr(w, "method", None)
        self.panels, self.dtype = dense_form() if dense and self.method is None else (False, "float32")
        if isinstance(w, QuantStack):
            self.register_buffer("qweight", paddle.to_tensor(w.q), persistable=True)
            self.scale = make_param(self, w.scale)
            self.n, self.fan_out = w.q.shape[0], w.q.shape[2]
            self.fan_in, self.group = w.q.shape[1] * (2 if w.method == "weight_only_int4" else 1), w.group
        elif not dense:  # fp32 [N, in, out] whatever the export's dtype
            self.weight = make_param(self, w)
        else:  # [N, in, out] as dense_weights says, each [in, out] in the panel layout with the C++ ops
            hold_dense(self, np.stack([to_panels(np.asarray(x, np.float32)) for x in w]) if self.panels else w)

    def weight_fp32(self):
        """The stack as fp32 [N, in, out]."""
        if self.panels:
            raise ValueError("a stack in the panel layout has only the C++ op (GraphVariant.cpp_ops)")
        if self.method is None:
            return self.weight if self.dtype == "float32" else self.weight.astype("float32")
        if self.method == "weight_only_int8":
            return self.qweight.astype("float32") * self.scale.unsqueeze(1)
        g = self.group
        q = unpack_int4(self.qweight, self.fan_in, g)  # [N, G, g, out]
        return (q * self.scale.unsqueeze(2)).reshape([self.n, self.fan_in, self.fan_out])

    def grouped_op(self) -> tuple[str, list[paddle.Tensor]]:
        """The grouped expert op that reads this stack (export/deepseek/moe.py) and its tensors."""
        if self.method is not None:
            op = "spmd_moe_experts_int8" if self.method == "weight_only_int8" else "spmd_moe_experts_int4"
            return op, [self.qweight, self.scale]
        if self.panels:
            return _PANEL_EXPERTS[self.dtype], [self.weight]
        if self.dtype != "float32":
            raise ValueError(f"{self.dtype} experts have C++ ops in the panel layout only (dense_weights(True, ...))")
        return "spmd_moe_experts", [self.weight]  # [E, in, out]: exports from before the panels

    def forward(self, x, variant: GraphVariant | None = None):
        """x [N, T, in]; with the C++ ops an fp32 [N, in, out] stack runs `spmd_batched_matmul`, a
        quantised one `spmd_batched_linear_int8` / `_int4` (no fp32 copy of the stack)."""
        if variant is None or not variant.cpp_ops:
            return paddle.matmul(x, self.weight_fp32())
        if self.method is not None:
            op = "spmd_batched_linear_int8" if self.method == "weight_only_int8" else "spmd_batched_linear_int4"
            return paddle_ext.run_op(op, x, self.qweight, self.scale)
        if self.dtype == "float32" and not self.panels:
            return batched_matmul(x, self.weight, variant)
        return paddle.matmul(x, self.weight_fp32())


def batched_matmul(x, y, variant: GraphVariant, transpose_y: bool = False):
    """x [N, T, K] @ y [N, K, M] (y [N, M, K] when transpose_y) → [N, T, M]: with the C++ ops
    `spmd_batched_matmul` (ops/cpu_kernels/batched_matmul.cc: gemm.h's product a slice, on the op
    library's threads), else Paddle's matmul."""
    if variant.cpp_ops:
        return paddle_ext.run_op("spmd_batched_matmul", x, y, transpose_y)
    return paddle.matmul(x, y, transpose_y=transpose_y)
