// The free list behind spmd::new_tensor (tensor_pool.h).
#include "tensor_pool.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace spmd {
namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kHeader = kAlign;                 // a block's size sits in the 64 bytes before its data
constexpr int64_t kPooledMax = int64_t{4} << 20;    // larger tensors (prefill chunks') go to the heap
constexpr int64_t kKeepBytes = int64_t{64} << 20;   // free bytes kept, all sizes together

using Blocks = std::unordered_map<int64_t, std::vector<char*>>;   // rounded size -> free blocks

void release(Blocks& blocks) {
  for (auto& [size, list] : blocks)
    for (char* block : list) std::free(block);
}

struct FreeList {
  std::mutex lock;
  Blocks free;
  int64_t kept = 0;   // bytes in `free`

  char* take(int64_t size) {
    if (size <= kPooledMax) {
      std::lock_guard<std::mutex> guard(lock);
      auto it = free.find(size);
      if (it != free.end() && !it->second.empty()) {
        char* block = it->second.back();
        it->second.pop_back();
        kept -= size;
        return block;
      }
    }
    char* block = static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(kHeader + size)));
    PD_CHECK(block != nullptr, "spmd ops: out of memory for a tensor of ", size, " bytes");
    *reinterpret_cast<int64_t*>(block) = size;
    return block;
  }

  // Back to the list; when that would pass kKeepBytes, the whole list goes back to the heap instead
  // (the sizes in use changed, e.g. another batch size: the list then refills with the new ones)
  void give(char* block) {
    const int64_t size = *reinterpret_cast<int64_t*>(block);
    Blocks stale;
    if (size <= kPooledMax) {
      std::lock_guard<std::mutex> guard(lock);
      if (kept + size <= kKeepBytes) {
        free[size].push_back(block);
        kept += size;
        return;
      }
      std::swap(stale, free);
      kept = 0;
    }
    release(stale);
    std::free(block);
  }
};

FreeList& free_list() {
  static FreeList* list = new FreeList();   // never destroyed: tensors may outlive static destruction
  return *list;
}

void give_back(void* data) { free_list().give(static_cast<char*>(data) - kHeader); }

}  // namespace

paddle::Tensor new_tensor(const std::vector<int64_t>& shape, paddle::DataType dtype) {
  int64_t bytes = static_cast<int64_t>(phi::SizeOf(dtype));
  for (const int64_t d : shape) bytes *= d;
  const int64_t size = std::max<int64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  char* block = free_list().take(size);
  return paddle::from_blob(block + kHeader, shape, dtype, phi::DataLayout::NCHW, paddle::CPUPlace(), give_back);
}

}  // namespace spmd
