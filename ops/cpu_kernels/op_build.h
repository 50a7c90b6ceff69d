// One registration of a Paddle custom op with one output and no attributes, for the files that
// register several alike: SPMD_OP(name, kernel, shape function, dtype function, "Input", ...).
#pragma once

#include "paddle/extension.h"

#define SPMD_OP(name, fn, shape, dtype, ...)          \
  PD_BUILD_OP(name)                                   \
      .Inputs({__VA_ARGS__})                          \
      .Outputs({"Out"})                               \
      .SetKernelFn(PD_KERNEL(fn))                     \
      .SetInferShapeFn(PD_INFER_SHAPE(shape))         \
      .SetInferDtypeFn(PD_INFER_DTYPE(dtype))
