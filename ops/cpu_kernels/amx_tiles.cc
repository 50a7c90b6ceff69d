// The AMX tile state for gemm_amx.h: Linux hands it out per process on request
// (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+); each thread then loads a tile configuration.
// Without the grant (an older kernel, a seccomp filter) amx_enabled() is false and int8 weights take
// gemm.h's fp32 paths.
#include "gemm_amx.h"

#ifdef SPMD_HAVE_EXACT_INT8
#include <sys/syscall.h>
#include <unistd.h>

namespace spmd {
namespace {

constexpr long kArchReqXcompPerm = 0x1023;   // <asm/prctl.h>
constexpr long kXfeatureXtiledata = 18;

// the LDTILECFG operand: palette 1, eight tiles of up to 16 rows x 64 bytes
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool request() {
  return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
         syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

bool amx_enabled() {
  static const bool on = request();
  return on;
}

void amx_configure_thread(int rows) {
  thread_local int current = 0;   // the rows loaded on this thread (0: none yet)
  if (current == rows) return;
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = i == 7 ? kAmxRows : rows;   // 7: W's
  // not _tile_loadconfig: GCC 12 -O3 dropped the stores of cfg's rows and columns before it (the
  // builtin's memory operand is not seen as read) and the instruction faulted on stack garbage
  asm volatile("ldtilecfg %0" ::"m"(cfg));
  current = rows;
}

}  // namespace spmd
#endif

// 1 when int8 weights take the exact path (gemm.h), for the tests and the logs
extern "C" int spmd_int8_exact() {
#ifdef SPMD_HAVE_EXACT_INT8
  return spmd::amx_enabled() ? 1 : 0;
#else
  return 0;
#endif
}
