// fmha::merge on CUDA tensors: a memory-bound kernel. Rows of one storage format made of aligned
// 16-byte vectors take the vector kernel (a row's lanes load and store up to two vectors each a
// round); any other view the element kernel, one warp per (batch, row, head) row of the output,
// lanes striding over head_dim_v so that loads and stores are coalesced. The per-row weights are
// common/merge.h's, the same function the CPU path calls. The decode kernel's split partials are
// combined here too, all splits of a row at once, by the same element rule.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends.h"
#include "common/decode.h"
#include "common/env_switch.h"
#include "common/merge.h"

namespace fmha::detail {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreadsPerBlock = kWarpSize * kWarpsPerBlock;
// Blocks beyond this loop over the rows (grid-stride) instead of being launched.
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

// A [batch, seqlen, heads, dim] view (lse: [batch, heads, seqlen]) with its storage format.
struct RowView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t stride[4] = {};
};

RowView row_view(const Tensor& t) {
  RowView v;
  v.data = t.data;
  v.dtype = t.dtype;
  for (int d = 0; d < t.rank; ++d) v.stride[d] = t.stride[d];
  return v;
}

struct MergeArgs {
  RowView out_a, lse_a, out_b, lse_b, out, lse;
  int64_t seqlen = 0, heads = 0, head_dim_v = 0, rows = 0;
};

__device__ __forceinline__ float load(const RowView& v, int64_t index) {
  switch (v.dtype) {
    case DType::fp16: return __half2float(static_cast<const __half*>(v.data)[index]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(v.data)[index]);
    default: return static_cast<const float*>(v.data)[index];
  }
}

__device__ __forceinline__ void store(const RowView& v, int64_t index, float x) {
  switch (v.dtype) {
    case DType::fp16: static_cast<__half*>(v.data)[index] = __float2half_rn(x); break;
    case DType::bf16: static_cast<__nv_bfloat16*>(v.data)[index] = __float2bfloat16_rn(x); break;
    default: static_cast<float*>(v.data)[index] = x; break;
  }
}

// A row index r of [B, S, H] (h fastest) or [B, H, S] (s fastest) as (b, s, h). The divisions are
// 32-bit where the indices fit (every practical call): a 64-bit one is a subroutine of ~70
// instructions, which bounds a kernel that moves a few vectors a row.
struct RowIndex {
  int64_t b, s, h;
};
template <bool LSE_ORDER>
__device__ __forceinline__ RowIndex row_index(int64_t r, int64_t seqlen, int64_t heads) {
  const int64_t inner = LSE_ORDER ? seqlen : heads, outer = LSE_ORDER ? heads : seqlen;
  int64_t i, j, b;
  if (((r | inner | outer) >> 32) == 0) {
    const uint32_t r32 = uint32_t(r), rest = r32 / uint32_t(inner);
    i = r32 - rest * uint32_t(inner), j = rest % uint32_t(outer), b = rest / uint32_t(outer);
  } else {
    i = r % inner, j = (r / inner) % outer, b = r / (inner * outer);
  }
  return LSE_ORDER ? RowIndex{b, i, j} : RowIndex{b, j, i};
}

__device__ __forceinline__ int64_t out_offset(const RowView& v, int64_t b, int64_t s, int64_t h) {
  return b * v.stride[0] + s * v.stride[1] + h * v.stride[2];
}
__device__ __forceinline__ int64_t lse_offset(const RowView& v, int64_t b, int64_t s, int64_t h) {
  return b * v.stride[0] + h * v.stride[1] + s * v.stride[2];
}

// One merged element: weight_a · a() + weight_b · b(), where a side of weight 0 is not read (an
// unstarted accumulator, a part that saw no key).
template <class A, class B>
__device__ __forceinline__ float merged(const MergeWeights& w, A a, B b) {
  float x = 0.f;
  if (w.a != 0.f) x += w.a * a();
  if (w.b != 0.f) x += w.b * b();
  return x;
}

__global__ void __launch_bounds__(kThreadsPerBlock) merge_kernel(const MergeArgs a) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize; r < a.rows; r += warps) {
    const auto [b, s, h] = row_index<false>(r, a.seqlen, a.heads);
    // Every lane reads both LSEs before lane 0 writes the merged one: lse may be lse_a or lse_b.
    const float lse_a = static_cast<const float*>(a.lse_a.data)[lse_offset(a.lse_a, b, s, h)];
    const float lse_b = static_cast<const float*>(a.lse_b.data)[lse_offset(a.lse_b, b, s, h)];
    const MergeWeights w = merge_weights(lse_a, lse_b);
    const int64_t oa = out_offset(a.out_a, b, s, h), ob = out_offset(a.out_b, b, s, h), o = out_offset(a.out, b, s, h);
    // Each element is read and written by the same lane, so out may be out_a or out_b.
    for (int64_t d = lane; d < a.head_dim_v; d += kWarpSize)
      store(a.out, o + d, merged(w, [&] { return load(a.out_a, oa + d); }, [&] { return load(a.out_b, ob + d); }));
    __syncwarp();
    if (lane == 0) static_cast<float*>(a.lse.data)[lse_offset(a.lse, b, s, h)] = w.lse;
  }
}

// The same merge in vectors of kVectorBytes (8 fp16/bf16 or 4 fp32 values) of the widest of the
// three formats, for rows of whole vectors that start on vector boundaries: one storage format
// (TA = TB = TO), or ring attention's accumulate, an fp32 accumulator merged in place with a
// 16-bit part (whose vectors of 4 values are then 8 bytes). A lane takes up to kVectorsPerLane
// vectors of a row per round, loads all of them before it uses any (more bytes in flight per
// thread), and a row takes `lanes_per_row` lanes of one warp (the smallest power of two that
// covers its vectors in one round, at most a warp, which then loops), so a warp merges
// kWarpSize / lanes_per_row rows at a time. A row's lanes all read both LSEs before its first lane
// writes the merged one (lse may be lse_a or lse_b).
constexpr int kVectorBytes = int(sizeof(uint4));
constexpr int kVectorsPerLane = 2;

// One load or store of BYTES bytes.
template <int BYTES>
struct RawOf;
template <>
struct RawOf<16> {
  using type = uint4;
};
template <>
struct RawOf<8> {
  using type = uint2;
};

// N values of T as one aligned access, widened to fp32 and back.
template <class T, int N>
struct Values {
  using Raw = typename RawOf<N * int(sizeof(T))>::type;
  __device__ static void to_float(const Raw& raw, float (&x)[N]) {
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (sizeof(T) == 4) x[i] = v[i];
      else if constexpr (std::is_same_v<T, __half>) x[i] = __half2float(v[i]);
      else x[i] = __bfloat162float(v[i]);
    }
  }
  __device__ static Raw from_float(const float (&x)[N]) {
    Raw raw;
    T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (sizeof(T) == 4) v[i] = x[i];
      else if constexpr (std::is_same_v<T, __half>) v[i] = __float2half_rn(x[i]);
      else v[i] = __float2bfloat16_rn(x[i]);
    }
    return raw;
  }
};

template <class TA, class TB, class TO>
struct VectorFormats {
  static constexpr int kWidest = int(sizeof(TA) > sizeof(TB) ? (sizeof(TA) > sizeof(TO) ? sizeof(TA) : sizeof(TO))
                                                             : (sizeof(TB) > sizeof(TO) ? sizeof(TB) : sizeof(TO)));
  static constexpr int kValues = kVectorBytes / kWidest;  // values per vector
  using A = Values<TA, kValues>;
  using B = Values<TB, kValues>;
  using O = Values<TO, kValues>;
  // weight_a · a + weight_b · b, a side of weight 0 not used (it may hold NaN).
  __device__ static typename O::Raw merge(const MergeWeights& w, const typename A::Raw& raw_a,
                                          const typename B::Raw& raw_b) {
    float x[kValues] = {}, y[kValues];
    if (w.a != 0.f) {
      A::to_float(raw_a, y);
#pragma unroll
      for (int i = 0; i < kValues; ++i) x[i] = w.a * y[i];
    }
    if (w.b != 0.f) {
      B::to_float(raw_b, y);
#pragma unroll
      for (int i = 0; i < kValues; ++i) x[i] += w.b * y[i];
    }
    return O::from_float(x);
  }
};

template <class TA, class TB, class TO>
__global__ void __launch_bounds__(kThreadsPerBlock) merge_vector_kernel(const MergeArgs a, const int lanes_per_row) {
  using F = VectorFormats<TA, TB, TO>;
  using RawA = typename F::A::Raw;
  using RawB = typename F::B::Raw;
  using RawO = typename F::O::Raw;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int rows_per_warp = kWarpSize / lanes_per_row;
  const int sub = lane % lanes_per_row;
  const int64_t vectors = a.head_dim_v / F::kValues;
  const int64_t round = int64_t(lanes_per_row) * kVectorsPerLane;  // vectors of a row per round
  const int64_t step = int64_t(gridDim.x) * kWarpsPerBlock * rows_per_warp;
  // Warp-uniform trip count: lanes past the last row still reach the __syncwarp.
  for (int64_t first = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize) * rows_per_warp;
       first < a.rows; first += step) {
    const int64_t r = first + lane / lanes_per_row;
    const bool live = r < a.rows;
    // Rows in LSE order ([B, H, S]: s fastest), so that neighbouring rows share LSE sectors.
    const auto [b, s, h] = row_index<true>(live ? r : 0, a.seqlen, a.heads);
    MergeWeights w{};
    if (live) {
      const float lse_a = static_cast<const float*>(a.lse_a.data)[lse_offset(a.lse_a, b, s, h)];
      const float lse_b = static_cast<const float*>(a.lse_b.data)[lse_offset(a.lse_b, b, s, h)];
      const RawA* row_a = reinterpret_cast<const RawA*>(static_cast<const TA*>(a.out_a.data) + out_offset(a.out_a, b, s, h));
      const RawB* row_b = reinterpret_cast<const RawB*>(static_cast<const TB*>(a.out_b.data) + out_offset(a.out_b, b, s, h));
      RawO* row = reinterpret_cast<RawO*>(static_cast<TO*>(a.out.data) + out_offset(a.out, b, s, h));
      // A round's vectors are loaded before they are used; the first round's beside the LSEs,
      // before the weights say whether they count (a side of weight 0 is read, in bounds, but
      // never used): one memory latency a row, not two.
      RawA raw_a[kVectorsPerLane];
      RawB raw_b[kVectorsPerLane];
      auto load_round = [&](int64_t v0) {
#pragma unroll
        for (int u = 0; u < kVectorsPerLane; ++u) {
          const int64_t v = v0 + int64_t(u) * lanes_per_row;
          if (v < vectors) raw_a[u] = row_a[v], raw_b[u] = row_b[v];
        }
      };
      load_round(sub);
      w = merge_weights(lse_a, lse_b);
      for (int64_t v0 = sub; v0 < vectors; v0 += round) {
#pragma unroll
        for (int u = 0; u < kVectorsPerLane; ++u) {
          const int64_t v = v0 + int64_t(u) * lanes_per_row;
          if (v < vectors) row[v] = F::merge(w, raw_a[u], raw_b[u]);
        }
        if (v0 + round < vectors) load_round(v0 + round);
      }
    }
    __syncwarp();
    if (live && sub == 0) static_cast<float*>(a.lse.data)[lse_offset(a.lse, b, s, h)] = w.lse;
  }
}

// Whether every row of `t` starts on a boundary of `vector_bytes` and holds whole vectors of
// `values` values.
bool rows_of_vectors(const Tensor& t, int64_t head_dim_v, int values) {
  const int64_t bytes = int64_t(dtype_size(t.dtype)), vector_bytes = bytes * values;
  if (head_dim_v % values != 0 || reinterpret_cast<uintptr_t>(t.data) % vector_bytes != 0) return false;
  if (t.rank != 4 || t.stride[3] != 1) return false;
  for (int d = 0; d < 3; ++d)
    if ((t.stride[d] * bytes) % vector_bytes != 0) return false;
  return true;
}

// The split-KV parts of the decode kernel: fp32 out [splits, B, S, H, Dv] and lse [splits, B, H, S].
constexpr int kMaxSplitDim = 256;  // the GPU tiers' largest head dim
constexpr int kSplitValuesPerLane = kMaxSplitDim / kWarpSize;
struct SplitMergeArgs {
  const float* part_out = nullptr;
  const float* part_lse = nullptr;
  RowView out, lse;  // lse.data null: the caller wants no LSE
  int64_t splits = 0, batch = 0, seqlen = 0, heads = 0, head_dim_v = 0, rows = 0;
};

// A row's splits in two phases, so that nothing waits on a chain of loads one split long (a fold
// of one split at a time waits on each split's LSE, then on its values: two memory latencies a
// split, and a decode call at 1 × 8k has 31 splits per row). First the LSEs: lane l holds splits l, l + 32,
// ...; the row's LSE is max + log Σ 2-sided weights as in merge_weights (a split equal to the
// max weighs exactly 1; NaN anywhere gives NaN; all -inf gives O = 0, LSE = -inf). Then each
// split's final weight exp(lse_s - max) / Σ is broadcast from its lane and the values are summed
// with every load independent of the others, kSplitBatch splits in flight at a time (a split of
// weight 0 is read, in bounds, and not used: it may hold anything). Rounding differs from a fold
// in split order (one normalisation instead of one per step); the function is the same.
//
// A row takes `row_warps` warps of a block (1, 2, 4 or 8: split_row_warps), warp w of them the
// splits w, w + row_warps, ...; each forms the LSE phase itself (the LSEs are a few hundred bytes,
// read again from L1) and its splits' weighted sum, and the row's warps add their sums through
// shared memory. A decode call at 1 × 8k merges 32 rows of 31 splits: one warp a row would put
// the whole merge on 4 SMs, each warp waiting on four batches of loads in turn; eight warps a row
// spread it over 32 blocks, each warp's four splits in one batch.
constexpr int kSplitsPerLane = int((decode::kMaxSplits + kWarpSize - 1) / kWarpSize);
constexpr int kSplitBatch = 8;  // splits whose values are in flight together, per warp
constexpr int kSplitsPerWarp = 4;  // a row's splits per warp that split_row_warps aims for
constexpr int kDependentLaunchArch = 90;  // programmatic dependent launches: compute capability 9.0

// Warps per row: the power of two (at most a block) that leaves each about kSplitsPerWarp splits.
int split_row_warps(int64_t splits) {
  int warps = 1;
  while (warps < kWarpsPerBlock && int64_t(warps) * kSplitsPerWarp < splits) warps *= 2;
  return warps;
}

__global__ void __launch_bounds__(kThreadsPerBlock) merge_splits_kernel(const SplitMergeArgs a, const int row_warps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();  // the decode kernel's parts written (a no-op without a programmatic launch)
#endif
  __shared__ float sums[kWarpsPerBlock][kMaxSplitDim];  // each warp's weighted sum of its splits
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int part = warp % row_warps;  // this warp's place among its row's warps
  const int rows_per_block = kWarpsPerBlock / row_warps;
  const int chunks = int((a.splits + kWarpSize - 1) / kWarpSize);
  // Every thread of a block takes the same number of turns (the block's __syncthreads).
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < a.rows;
       first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t r = first + warp / row_warps;
    const bool live = r < a.rows;
    const auto [b, s, h] = row_index<false>(live ? r : 0, a.seqlen, a.heads);
    float lse[kSplitsPerLane];
    float hi = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int c = 0; c < kSplitsPerLane; ++c) {
      const int64_t split = int64_t(c) * kWarpSize + lane;
      lse[c] = live && c < chunks && split < a.splits ? a.part_lse[((split * a.batch + b) * a.heads + h) * a.seqlen + s]
                                                      : -INFINITY;
      nan |= lse[c] != lse[c];
      hi = fmaxf(hi, lse[c]);
    }
    nan = __any_sync(0xffffffffu, nan);
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kSplitsPerLane; ++c) {
      lse[c] = hi == -INFINITY ? 0.f : (lse[c] == hi ? 1.f : expf(lse[c] - hi));  // unnormalised weight
      sum += lse[c];
    }
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float inv = hi == -INFINITY || nan ? 0.f : 1.f / sum;
    const float row_lse = nan ? NAN : (hi == -INFINITY ? -INFINITY : hi + logf(sum));
    // This warp's splits part, part + row_warps, ..., kSplitBatch at a time: all their loads issued
    // before any is used.
    float acc[kSplitValuesPerLane] = {};
    const int64_t mine = live ? (a.splits - part + row_warps - 1) / row_warps : 0;  // how many
    for (int64_t k0 = 0; k0 < mine; k0 += kSplitBatch) {
      float x[kSplitBatch][kSplitValuesPerLane];
#pragma unroll
      for (int u = 0; u < kSplitBatch; ++u) {
        const int64_t k = k0 + u < mine ? k0 + u : mine - 1;
        const int64_t split = part + k * row_warps;
        const float* from = a.part_out + (((split * a.batch + b) * a.seqlen + s) * a.heads + h) * a.head_dim_v;
#pragma unroll
        for (int e = 0; e < kSplitValuesPerLane; ++e) {
          const int64_t d = lane + int64_t(e) * kWarpSize;
          x[u][e] = d < a.head_dim_v ? from[d] : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kSplitBatch; ++u) {
        const int64_t split = part + (k0 + u) * row_warps;
        const int c = int(split / kWarpSize);
        float weight = 0.f;
#pragma unroll
        for (int j = 0; j < kSplitsPerLane; ++j)
          if (j == c) weight = lse[j];
        const float w = __shfl_sync(0xffffffffu, weight, int(split % kWarpSize)) * inv;
        if (k0 + u < mine && w != 0.f) {
#pragma unroll
          for (int e = 0; e < kSplitValuesPerLane; ++e) acc[e] += w * x[u][e];
        }
      }
    }
    const int64_t o = live ? out_offset(a.out, b, s, h) : 0;
    if (row_warps == 1) {  // the warp's sum is the row's
      if (live) {
#pragma unroll
        for (int e = 0; e < kSplitValuesPerLane; ++e) {
          const int64_t d = lane + int64_t(e) * kWarpSize;
          if (d < a.head_dim_v) store(a.out, o + d, nan ? NAN : acc[e]);
        }
      }
    } else {  // the row's warps' sums added in warp order, each column by one of the row's threads
#pragma unroll
      for (int e = 0; e < kSplitValuesPerLane; ++e) sums[warp][lane + e * kWarpSize] = acc[e];
      __syncthreads();
      const int first_warp = warp - part;
      if (live)
        for (int d = part * kWarpSize + lane; d < a.head_dim_v; d += row_warps * kWarpSize) {
          float x = 0.f;
          for (int w = 0; w < row_warps; ++w) x += sums[first_warp + w][d];
          store(a.out, o + d, nan ? NAN : x);
        }
      __syncthreads();  // the sums read before the next turn's are written
    }
    if (live && part == 0 && lane == 0 && a.lse.data != nullptr)
      static_cast<float*>(a.lse.data)[lse_offset(a.lse, b, s, h)] = row_lse;
  }
}

// Whether merge_splits_kernel runs on this device as code that waits for the kernel before it
// (griddepcontrol.wait, compute capability 9.0 and above): then it is launched as a programmatic
// dependent of the decode kernel, its blocks starting while the decode kernel's last ones run (the
// decode kernel lets them, sm80_decode_kernel.cuh). Asked once per device; FMHA_DEPENDENT_LAUNCH=0
// launches it after the decode kernel ends instead (the comparison docs/PERF.md reports).
bool waits_for_its_primary() {
  static const bool allowed = !read_switch_on(kNoDependentLaunch);
  if (!allowed) return false;
  constexpr int kDevices = 64, kUnknown = 0, kYes = 1, kNo = 2;
  static std::atomic<int> known[kDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return false;
  int state = known[device].load(std::memory_order_relaxed);
  if (state == kUnknown) {
    cudaFuncAttributes attributes{};
    const bool yes = cudaFuncGetAttributes(&attributes, merge_splits_kernel) == cudaSuccess &&
                     attributes.binaryVersion >= kDependentLaunchArch;
    state = yes ? kYes : kNo;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state == kYes;
}

}  // namespace

Status cuda_merge_splits(const SplitParts& parts, const Tensor& out, const Tensor& lse, void* stream) {
  if (parts.head_dim_v > kMaxSplitDim)
    return {Code::internal, "merge_splits: head_dim_v " + std::to_string(parts.head_dim_v) + " is above " +
                                std::to_string(kMaxSplitDim)};
  SplitMergeArgs a;
  a.part_out = parts.out;
  a.part_lse = parts.lse;
  a.out = row_view(out);
  if (lse.defined()) a.lse = row_view(lse);
  a.splits = parts.splits;
  a.batch = parts.batch;
  a.seqlen = parts.seqlen;
  a.heads = parts.heads;
  a.head_dim_v = parts.head_dim_v;
  a.rows = parts.batch * parts.seqlen * parts.heads;
  if (a.rows == 0) return Status::success();
  const int row_warps = split_row_warps(a.splits);
  const int64_t rows_per_block = kWarpsPerBlock / row_warps;
  const int64_t blocks = std::min<int64_t>((a.rows + rows_per_block - 1) / rows_per_block, kMaxBlocks);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreadsPerBlock);
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  if (waits_for_its_primary()) {
    config.attrs = &dependent;
    config.numAttrs = 1;
  }
  if (const cudaError_t err = cudaLaunchKernelEx(&config, merge_splits_kernel, a, row_warps); err != cudaSuccess)
    return {Code::cuda_error, std::string("merge_splits: kernel launch failed: ") + cudaGetErrorString(err)};
  return Status::success();
}

Status cuda_merge(const MergeRows& m, void* stream) {
  int ordinal = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&ordinal) != cudaSuccess) {
    cudaGetLastError();
    return {Code::no_device, "out_a: no usable CUDA device (none found, or no driver)"};
  }
  if (m.out_a.device.index != ordinal)
    return {Code::invalid_argument, "out_a: is on cuda:" + std::to_string(m.out_a.device.index) +
                                        " but the current device is cuda:" + std::to_string(ordinal) +
                                        "; make that device current (cudaSetDevice) before the call"};
  MergeArgs a;
  a.out_a = row_view(m.out_a);
  a.lse_a = row_view(m.lse_a);
  a.out_b = row_view(m.out_b);
  a.lse_b = row_view(m.lse_b);
  a.out = row_view(m.out);
  a.lse = row_view(m.lse);
  a.seqlen = m.seqlen;
  a.heads = m.heads;
  a.head_dim_v = m.head_dim_v;
  a.rows = m.rows();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Vectors of one format (16 bytes), or of an fp32 accumulator and a 16-bit part (4 values).
  const DType dtype = m.out.dtype;
  const bool same = m.out_a.dtype == dtype && m.out_b.dtype == dtype;
  const bool accumulate = dtype == DType::fp32 && m.out_a.dtype == DType::fp32 && dtype_size(m.out_b.dtype) == 2;
  const int values = int(kVectorBytes / (same ? dtype_size(dtype) : sizeof(float)));
  const bool vectors = (same || accumulate) && rows_of_vectors(m.out, a.head_dim_v, values) &&
                       rows_of_vectors(m.out_a, a.head_dim_v, values) && rows_of_vectors(m.out_b, a.head_dim_v, values);
  if (vectors) {
    const int64_t row_vectors = a.head_dim_v / values;
    int lanes = 1;
    while (lanes < kWarpSize && lanes * kVectorsPerLane < row_vectors) lanes *= 2;
    const int64_t rows_per_block = int64_t(kWarpsPerBlock) * (kWarpSize / lanes);
    const unsigned blocks = unsigned(std::min<int64_t>((a.rows + rows_per_block - 1) / rows_per_block, kMaxBlocks));
    if (accumulate && m.out_b.dtype == DType::bf16)
      merge_vector_kernel<float, __nv_bfloat16, float><<<blocks, kThreadsPerBlock, 0, s>>>(a, lanes);
    else if (accumulate)
      merge_vector_kernel<float, __half, float><<<blocks, kThreadsPerBlock, 0, s>>>(a, lanes);
    else if (dtype == DType::fp16)
      merge_vector_kernel<__half, __half, __half><<<blocks, kThreadsPerBlock, 0, s>>>(a, lanes);
    else if (dtype == DType::bf16)
      merge_vector_kernel<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16><<<blocks, kThreadsPerBlock, 0, s>>>(a, lanes);
    else
      merge_vector_kernel<float, float, float><<<blocks, kThreadsPerBlock, 0, s>>>(a, lanes);
  } else {
    const int64_t blocks = std::min<int64_t>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
    merge_kernel<<<unsigned(blocks), kThreadsPerBlock, 0, s>>>(a);
  }
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    return {Code::cuda_error, std::string("merge: kernel launch failed: ") + cudaGetErrorString(err)};
  return Status::success();
}

}  // namespace fmha::detail
