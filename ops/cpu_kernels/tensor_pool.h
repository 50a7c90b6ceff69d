// The ops' output and scratch tensors, from a free list of this library's own instead of
// paddle::empty.
//
// paddle::empty is a phi kernel call: the kernel's lookup in hash tables, the device context, the
// allocator's layers, then malloc, whose bins glibc consolidates on the next large request.  Right
// after a linear has streamed megabytes of weights through the caches, all of that runs cold: at a
// batch-1 decode step of `--demo small` it was ~6 % of the step (`perf`, benchmarks/RESULTS.md
// "Session 49").  A decode step asks for the same sizes every step, so a buffer freed by one step
// is taken by the next: new_tensor() wraps it with paddle::from_blob and its deleter gives it back.
//
// Free buffers are kept by their byte size rounded up to 64, up to 64 MB of them: when a freed
// buffer would pass that, the whole list goes back to the heap and refills with the sizes in use
// (another batch size's).  Tensors over 4 MB (a prefill chunk's) always come from the heap: their
// malloc is small beside their arithmetic.  The list is behind a mutex: Paddle may drop a tensor
// on another thread.  (Paddle frees a step's garbage ~4 MB at a time, worker/predictor.py's
// GC_BATCH_GB, so a decode step's buffers come back a few steps later, hundreds of them.)
#pragma once

#include <cstdint>
#include <vector>

#include "paddle/extension.h"

namespace spmd {

// A float32 (or `dtype`) tensor of `shape` on the CPU, uninitialised, as paddle::empty(shape,
// dtype, CPU) gives; its memory 64-byte aligned.
paddle::Tensor new_tensor(const std::vector<int64_t>& shape, paddle::DataType dtype = paddle::DataType::FLOAT32);

}  // namespace spmd
