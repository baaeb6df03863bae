// Host side of the sm90 tier's TMA (see sm90_tma.h).
#include "cuda/sm90/sm90_tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "cuda/common/host.h"

namespace fmha::cuda::sm90 {
namespace {

constexpr int64_t kTmaAlignBytes = 16;
constexpr int64_t kTmaMaxStrideBytes = int64_t(1) << 40;
constexpr int kRank = 4;  // {head_dim, seqlen, heads, batch}

PFN_cuTensorMapEncodeTiled_v12000 encode_function(Status* status) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static Status found;
  static std::once_flag once;
  std::call_once(once, [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult query{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &query);
    if (err != cudaSuccess || query != cudaDriverEntryPointSuccess || entry == nullptr) {
      cudaGetLastError();
      found = {Code::cuda_error, std::string("sm90: the driver offers no cuTensorMapEncodeTiled (") +
                                     cudaGetErrorString(err) + ")"};
      return;
    }
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  });
  *status = found;
  return fn;
}

CUtensorMapDataType tma_type(DType dtype) {
  switch (dtype) {
    case DType::fp16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    default: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  }
}

// A packed [total, H, D] view as [1, total, H, D]; a dense [B, S, H, D] one as it is.
Tensor as_rank4(const Tensor& t) {
  if (t.rank != 3) return t;
  Tensor out = t;
  out.rank = 4;
  out.shape[0] = 1;
  out.stride[0] = t.shape[0] * t.stride[0];
  for (int d = 0; d < 3; ++d) {
    out.shape[d + 1] = t.shape[d];
    out.stride[d + 1] = t.stride[d];
  }
  return out;
}

}  // namespace

Status check_tma_view(const Tensor& view, const char* name) {
  const Tensor t = as_rank4(view);
  const int64_t elem = int64_t(dtype_size(t.dtype));
  if (t.numel() == 0) return Status::success();
  if (reinterpret_cast<uintptr_t>(t.data) % kTmaAlignBytes != 0)
    return unsupported(std::string(name) + ": the sm90 tier loads and stores through TMA, which needs a 16-byte aligned "
                                           "data pointer");
  for (int d = 0; d < 3; ++d) {
    if (t.shape[d] <= 1) continue;
    const int64_t bytes = t.stride[d] * elem;
    if (bytes <= 0 || bytes % kTmaAlignBytes != 0 || bytes >= kTmaMaxStrideBytes)
      return unsupported(std::string(name) + ": stride " + std::to_string(t.stride[d]) + " of dimension " +
                         std::to_string(d - (view.rank == 3 ? 1 : 0)) + " must be a positive multiple of " +
                         std::to_string(kTmaAlignBytes / elem) + " elements (16 bytes) below 2^40 bytes for TMA "
                         "(sm90 tier)");
  }
  return Status::success();
}

Status encode_tile_map(CUtensorMap* map, const Tensor& view, int box_cols, int box_rows, const char* name) {
  const Tensor t = as_rank4(view);
  Status status;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_function(&status);
  if (encode == nullptr) return status;
  const uint64_t elem = dtype_size(t.dtype);
  // Dimension order is innermost first; a dimension of length 1 gets a stride TMA accepts (it is
  // never stepped along).
  const int order[kRank] = {3, 1, 2, 0};
  cuuint64_t dims[kRank];
  cuuint64_t strides[kRank - 1];
  for (int i = 0; i < kRank; ++i) dims[i] = cuuint64_t(t.shape[order[i]] > 0 ? t.shape[order[i]] : 1);
  uint64_t extent = (dims[0] * elem + kTmaAlignBytes - 1) / kTmaAlignBytes * kTmaAlignBytes;
  for (int i = 1; i < kRank; ++i) {
    const int d = order[i];
    strides[i - 1] = t.shape[d] > 1 ? cuuint64_t(t.stride[d]) * elem : extent;
    extent = strides[i - 1] * dims[i];
  }
  const cuuint32_t box[kRank] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[kRank] = {1, 1, 1, 1};
  const CUresult r =
      encode(map, tma_type(t.dtype), kRank, t.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return unsupported(std::string(name) + ": the driver refused its TMA descriptor (CUresult " + std::to_string(int(r)) +
                       "); the sm90 tier cannot read this view");
  return Status::success();
}

}  // namespace fmha::cuda::sm90
