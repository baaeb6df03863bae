// Argument checks shared by every backend. Each failure names the argument and says what was
// expected; nothing is written before all of them pass.
#include <cmath>
#include <cstdint>
#include <string>

#include "backends.h"

namespace fmha::detail {
namespace {

// Plain string building, no iostreams: the Python extension links libstdc++ statically, and its
// stream locale facets were seen to crash there.
std::string shape_string(const Tensor& t) {
  std::string out = "[";
  for (int d = 0; d < t.rank; ++d) out += (d ? ", " : "") + std::to_string(t.shape[d]);
  return out + "]";
}

Status invalid(const std::string& message) { return {Code::invalid_argument, message}; }

bool valid_dtype(DType d) { return d == DType::fp32 || d == DType::fp16 || d == DType::bf16; }

// Rank, sizes, strides, pointer and alignment of one view. `dims` names each dimension.
Status check_view(const char* name, const Tensor& t, int rank, const char* const* dims) {
  if (!t.defined()) return invalid(std::string(name) + ": required tensor is missing (rank 0)");
  if (t.rank != rank) {
    std::string expected = "[";
    for (int d = 0; d < rank; ++d) expected += std::string(d ? ", " : "") + dims[d];
    return invalid(std::string(name) + ": expected a " + std::to_string(rank) + "-d tensor " + expected + "]" +
                   ", got rank " + std::to_string(t.rank));
  }
  if (!valid_dtype(t.dtype)) return invalid(std::string(name) + ": dtype must be fp32, fp16 or bf16");
  if (t.device.type != DeviceType::cpu && t.device.type != DeviceType::cuda)
    return invalid(std::string(name) + ": unknown device type");
  if (t.device.index < 0) return invalid(std::string(name) + ": device index must be >= 0");
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 0)
      return invalid(std::string(name) + ": " + dims[d] + " is " + std::to_string(t.shape[d]) +
                     ", expected a size >= 0");
    if (t.stride[d] < 0)
      return invalid(std::string(name) + ": stride of " + dims[d] + " is " + std::to_string(t.stride[d]) +
                     ", expected >= 0");
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    return invalid(std::string(name) + ": the last dimension (" + dims[rank - 1] + ") must be contiguous " +
                   "(stride 1), got stride " + std::to_string(t.stride[rank - 1]));
  if (t.numel() > 0) {
    if (t.data == nullptr) return invalid(std::string(name) + ": data pointer is null for a non-empty tensor");
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
      return invalid(std::string(name) + ": data pointer is not aligned to its " + std::to_string(dtype_size(t.dtype)) +
                     "-byte " + to_string(t.dtype) + " elements");
  }
  return Status::success();
}

const char* const kQDims[] = {"batch", "seqlen_q", "heads", "head_dim"};
const char* const kODims[] = {"batch", "seqlen_q", "heads", "head_dim_v"};
const char* const kKDims[] = {"batch", "seqlen_k", "kv_heads", "head_dim"};
const char* const kVDims[] = {"batch", "seqlen_k", "kv_heads", "head_dim_v"};
const char* const kLseDims[] = {"batch", "heads", "seqlen_q"};

// `t` must have exactly `expected` sizes; `like` names where they come from.
Status check_shape(const char* name, const Tensor& t, const int64_t* expected, const char* const* dims,
                   const char* like) {
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] != expected[d])
      return invalid(std::string(name) + ": " + dims[d] + " is " + std::to_string(t.shape[d]) + ", expected " +
                     std::to_string(expected[d]) + " (" + like + "); shape is " + shape_string(t));
  return Status::success();
}

Status check_same_kind(const char* name, const Tensor& t, const Tensor& q, bool check_dtype) {
  if (check_dtype && t.dtype != q.dtype)
    return invalid(std::string(name) + ": dtype is " + to_string(t.dtype) + ", expected " + to_string(q.dtype) +
                   " like q");
  if (!(t.device == q.device))
    return invalid(std::string(name) + ": is on a different device than q (" +
                   (t.device.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(t.device.index)) +
                   " vs " +
                   (q.device.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(q.device.index)) +
                   ")");
  return Status::success();
}

#define FMHA_TRY(expr)                \
  do {                                \
    Status status_ = (expr);          \
    if (!status_.ok()) return status_; \
  } while (0)

}  // namespace

Status validate(const Params& p, Direction direction) {
  if (direction != Direction::forward && direction != Direction::backward)
    return invalid("direction: expected forward or backward");
  FMHA_TRY(check_view("q", p.q, 4, kQDims));
  FMHA_TRY(check_view("k", p.k, 4, kKDims));
  FMHA_TRY(check_view("v", p.v, 4, kVDims));
  FMHA_TRY(check_view("o", p.o, 4, kODims));

  const int64_t batch = p.q.shape[0], seqlen_q = p.q.shape[1], heads = p.q.shape[2], head_dim = p.q.shape[3];
  const int64_t seqlen_k = p.k.shape[1], kv_heads = p.k.shape[2], head_dim_v = p.v.shape[3];

  const int64_t k_expected[] = {batch, seqlen_k, kv_heads, head_dim};
  FMHA_TRY(check_shape("k", p.k, k_expected, kKDims, "batch and head_dim of q"));
  const int64_t v_expected[] = {batch, seqlen_k, kv_heads, head_dim_v};
  FMHA_TRY(check_shape("v", p.v, v_expected, kVDims, "batch, seqlen_k and kv_heads of k"));
  const int64_t o_expected[] = {batch, seqlen_q, heads, head_dim_v};
  FMHA_TRY(check_shape("o", p.o, o_expected, kODims, "q's [batch, seqlen_q, heads] and v's head_dim_v"));

  if (head_dim < 1) return invalid("q: head_dim is " + std::to_string(head_dim) + ", expected >= 1");
  if (head_dim_v < 1) return invalid("v: head_dim_v is " + std::to_string(head_dim_v) + ", expected >= 1");
  if (heads > 0 && kv_heads < 1) return invalid("k: kv_heads is 0, expected >= 1 when heads > 0");
  if (kv_heads > 0 && heads % kv_heads != 0)
    return invalid("k: kv_heads (" + std::to_string(kv_heads) + ") must divide heads (" + std::to_string(heads) +
                   ") of q");

  FMHA_TRY(check_same_kind("k", p.k, p.q, true));
  FMHA_TRY(check_same_kind("v", p.v, p.q, true));
  FMHA_TRY(check_same_kind("o", p.o, p.q, true));

  const bool need_lse = direction == Direction::backward;
  if (need_lse || p.lse.defined()) {
    FMHA_TRY(check_view("lse", p.lse, 3, kLseDims));
    if (p.lse.dtype != DType::fp32) return invalid("lse: dtype must be fp32, got " + std::string(to_string(p.lse.dtype)));
    const int64_t lse_expected[] = {batch, heads, seqlen_q};
    FMHA_TRY(check_shape("lse", p.lse, lse_expected, kLseDims, "q's batch, heads and seqlen_q"));
    FMHA_TRY(check_same_kind("lse", p.lse, p.q, false));
  }

  if (direction == Direction::backward) {
    FMHA_TRY(check_view("dout", p.dout, 4, kODims));
    FMHA_TRY(check_shape("dout", p.dout, o_expected, kODims, "the shape of o"));
    FMHA_TRY(check_view("dq", p.dq, 4, kQDims));
    const int64_t q_expected[] = {batch, seqlen_q, heads, head_dim};
    FMHA_TRY(check_shape("dq", p.dq, q_expected, kQDims, "the shape of q"));
    FMHA_TRY(check_view("dk", p.dk, 4, kKDims));
    FMHA_TRY(check_shape("dk", p.dk, k_expected, kKDims, "the shape of k"));
    FMHA_TRY(check_view("dv", p.dv, 4, kVDims));
    FMHA_TRY(check_shape("dv", p.dv, v_expected, kVDims, "the shape of v"));
    FMHA_TRY(check_same_kind("dout", p.dout, p.q, true));
    FMHA_TRY(check_same_kind("dq", p.dq, p.q, true));
    FMHA_TRY(check_same_kind("dk", p.dk, p.q, true));
    FMHA_TRY(check_same_kind("dv", p.dv, p.q, true));
  }

  if (!std::isfinite(p.softmax_scale))
    return invalid("softmax_scale: must be finite (0 selects 1/sqrt(head_dim))");
  if (p.causal != Causal::none && p.causal != Causal::top_left && p.causal != Causal::bottom_right)
    return invalid("causal: expected none, top-left or bottom-right");
  if (p.window_left < -1)
    return invalid("window_left: is " + std::to_string(p.window_left) + ", expected >= 0 or -1 (unbounded)");
  if (p.window_right < -1)
    return invalid("window_right: is " + std::to_string(p.window_right) + ", expected >= 0 or -1 (unbounded)");
  if (p.causal != Causal::none && p.window_right > 0)
    return invalid("window_right: is " + std::to_string(p.window_right) + " but causal masking (" +
                   to_string(p.causal) + ") allows no key to the right; use -1 or 0");
  if (p.precision != Precision::ieee && p.precision != Precision::tf32)
    return invalid("precision: expected ieee or tf32");
  if (p.precision == Precision::tf32 && p.q.dtype != DType::fp32)
    return invalid(std::string("precision: tf32 applies to fp32 inputs only; q is ") + to_string(p.q.dtype));
  if (p.num_threads < 0) return invalid("num_threads: is " + std::to_string(p.num_threads) + ", expected >= 0");
  if (p.workspace_bytes > 0 && p.workspace == nullptr)
    return invalid("workspace: null pointer with workspace_bytes > 0");
  return Status::success();
}

}  // namespace fmha::detail
