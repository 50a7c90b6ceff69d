// The core's L2 size, for the kernels that size what they prefetch by it (attention_prefetch.h,
// gemm_blocked.h): sysconf's figure, or 512 KiB where the system does not say.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace spmd {

inline int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) : int64_t{512} << 10;
  }();
  return bytes;
}

}  // namespace spmd
