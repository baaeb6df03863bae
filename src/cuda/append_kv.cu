// fmha::append_kv on CUDA tensors: one warp per (sequence, new row, KV head) copies that row of
// k_new and v_new into its cache row, found through PagedCache (common/paged.h) as the decode
// kernel finds it. The tables in device memory are the caller's promise and are clamped: a
// sequence's length to [0, capacity], its pages into the pool, and a row that would land past the
// sequence's capacity is dropped, so a broken table writes wrong cache rows but never outside k
// and v. The values are copied as stored (the cache and the new rows share a dtype).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends.h"
#include "common/paged.h"

namespace fmha::detail {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreadsPerBlock = kWarpSize * kWarpsPerBlock;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // beyond: grid-stride

// One tensor's 4-d strides (elements).
struct Strides {
  int64_t s[4] = {};
  __device__ __forceinline__ int64_t at(int64_t a, int64_t b, int64_t c) const { return a * s[0] + b * s[1] + c * s[2]; }
};

struct AppendArgs {
  PagedCache cache;
  void* k = nullptr;
  void* v = nullptr;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides k_strides, v_strides, k_new_strides, v_new_strides;
  int64_t batch = 0, seqlen_new = 0, kv_heads = 0, head_dim = 0, head_dim_v = 0, rows = 0;
};

// E: an unsigned integer as wide as the element (the bits are copied, never converted).
template <class E>
__global__ void __launch_bounds__(kThreadsPerBlock) append_kv_kernel(const AppendArgs a) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize; r < a.rows; r += warps) {
    const int64_t h = r % a.kv_heads, i = (r / a.kv_heads) % a.seqlen_new, b = r / (a.kv_heads * a.seqlen_new);
    const int64_t key = a.cache.length(b) + i;
    if (key >= a.cache.capacity()) continue;  // only a broken table gets here
    const CacheRow at = a.cache.row_of(b, key);
    E* k = static_cast<E*>(a.k) + a.k_strides.at(at.page, at.row, h);
    E* v = static_cast<E*>(a.v) + a.v_strides.at(at.page, at.row, h);
    const E* k_new = static_cast<const E*>(a.k_new) + a.k_new_strides.at(b, i, h);
    const E* v_new = static_cast<const E*>(a.v_new) + a.v_new_strides.at(b, i, h);
    for (int64_t d = lane; d < a.head_dim; d += kWarpSize) k[d] = k_new[d];
    for (int64_t d = lane; d < a.head_dim_v; d += kWarpSize) v[d] = v_new[d];
  }
}

Strides strides_of(const Tensor& t) {
  Strides s;
  for (int d = 0; d < 4; ++d) s.s[d] = t.stride[d];
  return s;
}

}  // namespace

Status cuda_append_kv(const Params& p) {
  int ordinal = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&ordinal) != cudaSuccess) {
    cudaGetLastError();
    return {Code::no_device, "k: no usable CUDA device (none found, or no driver)"};
  }
  if (p.k.device.index != ordinal)
    return {Code::invalid_argument, "k: is on cuda:" + std::to_string(p.k.device.index) +
                                        " but the current device is cuda:" + std::to_string(ordinal) +
                                        "; make that device current (cudaSetDevice) before the call"};
  for (const Tensor* t : {&p.block_table, &p.cache_seqlens})
    if (t->defined() && !(t->device == p.k.device))
      return {Code::invalid_argument, std::string(t == &p.block_table ? "block_table" : "cache_seqlens") +
                                          ": must be on the cache's device (" + "cuda:" +
                                          std::to_string(p.k.device.index) + ") for append_kv on the GPU"};
  AppendArgs a;
  a.cache = PagedCache::of(p);
  // A pool without pages takes no row, whatever a device table claims: no page to clamp into.
  if (a.cache.num_pages == 0) a.cache.pages_per_seq = 0;
  a.k = p.k.data;
  a.v = p.v.data;
  a.k_new = p.k_new.data;
  a.v_new = p.v_new.data;
  a.k_strides = strides_of(p.k);
  a.v_strides = strides_of(p.v);
  a.k_new_strides = strides_of(p.k_new);
  a.v_new_strides = strides_of(p.v_new);
  a.batch = p.k_new.shape[0];
  a.seqlen_new = p.k_new.shape[1];
  a.kv_heads = p.k.shape[2];
  a.head_dim = p.k.shape[3];
  a.head_dim_v = p.v.shape[3];
  a.rows = a.batch * a.seqlen_new * a.kv_heads;
  if (a.rows == 0) return Status::success();
  const int64_t blocks = std::min<int64_t>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (dtype_size(p.k.dtype) == 4)
    append_kv_kernel<uint32_t><<<unsigned(blocks), kThreadsPerBlock, 0, stream>>>(a);
  else
    append_kv_kernel<uint16_t><<<unsigned(blocks), kThreadsPerBlock, 0, stream>>>(a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    return {Code::cuda_error, std::string("append_kv: kernel launch failed: ") + cudaGetErrorString(err)};
  return Status::success();
}

}  // namespace fmha::detail
