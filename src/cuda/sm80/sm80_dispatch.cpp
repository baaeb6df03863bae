// The sm80 tier's entry points: tensor-core (mma.sync) forward and backward for fp16, bf16 and
// fp32 storage with Precision::tf32, on sm_80 and newer.
// fp32 with Precision::ieee is refused: exact fp32 is the simt tier's job.
//
// FMHA_SM80_FWD_CONFIG=<name> and FMHA_SM80_BWD_CONFIG=<name> pick the forward and the backward
// main kernel's configuration (names and what they change: sm80_config.h) at the head dims
// compiled in every variant (FMHA_TUNED_HEAD_DIMS, 64 and 128 by default); "compact" also at the
// head dims where it is compiled besides (96, 192, 256); elsewhere the default runs. Each
// variable is read once, at the first call; without it, the tuning cache's winner runs
// (src/tune/). A default that needs more shared memory than the GPU offers gives way to a
// compiled variant that fits (variant.h).
#include "cuda/sm80/sm80_dispatch.h"

#include "cuda/common/dispatch_util.h"
#include "cuda/common/tier.h"
#include "cuda/common/variant.h"
#include "cuda/sm80/sm80_launch.h"

namespace fmha::cuda::sm80 {
namespace {

static_assert(kFwdVariants == FMHA_CUDA_SM80_FWD_VARIANTS, "cmake/cuda.cmake instantiates every forward variant");
static_assert(kBwdVariants == FMHA_CUDA_SM80_BWD_VARIANTS, "cmake/cuda.cmake instantiates every backward variant");

constexpr const char* kFwdVariable = "FMHA_SM80_FWD_CONFIG";
constexpr const char* kBwdVariable = "FMHA_SM80_BWD_CONFIG";

// True where the compact variants are compiled outside the tuned head dims.
constexpr bool has_compact(int head_dim) {
  return in_head_dims(head_dim, {FMHA_CUDA_SM80_COMPACT_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)});
}

// fwd(std::integral_constant<int, V>{}) or bwd(...) for the variant this call runs in `direction`
// for storage T at head dim HD on a device with `props` (a default that needs more shared memory
// than the device offers gives way to one that fits).
template <class T, int HD, class Fwd, class Bwd>
Status with_config_variant(const Params& p, Direction direction, const DeviceProps& props, Fwd&& fwd, Bwd&& bwd) {
  constexpr int kBytes = int(sizeof(T));
  constexpr bool kTuned = is_tuned_head_dim(HD);
  const size_t limit = props.max_shared_per_block;
  if (direction == Direction::forward)
    return with_requested_variant<kFwdVariants, default_fwd_variant(kBytes, HD), kTuned,
                                  has_compact(HD) ? kFwdCompact : -1>(
        requested_variant_index<Backend::cuda_sm80, Direction::forward>(p, kFwdVariable, kFwdVariantNames,
                                                                        kFwdVariants),
        kFwdVariable, kFwdVariantNames,
        [&](auto v) { return forward_shared_bytes<T, HD, decltype(v)::value>() <= limit; }, fwd);
  return with_requested_variant<kBwdVariants, default_bwd_variant(kBytes, HD), kTuned,
                                has_compact(HD) ? kBwdCompact : -1>(
      requested_variant_index<Backend::cuda_sm80, Direction::backward>(p, kBwdVariable, kBwdVariantNames,
                                                                       kBwdVariants),
      kBwdVariable, kBwdVariantNames,
      [&](auto v) { return backward_shared_bytes<T, HD, decltype(v)::value>(p.deterministic) <= limit; }, bwd);
}

constexpr int kVectorBytes = 16;  // the kernels' cp.async width

// The 16-byte loads need aligned bases, strides and head dims (q, k, v; dO for the backward).
Status check_vector_loads(const Params& p, Direction direction) {
  const int64_t vec = kVectorBytes / int64_t(dtype_size(p.q.dtype));
  const struct {
    const char* name;
    const Tensor* t;
  } inputs[] = {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"dout", &p.dout}};
  for (const auto& in : inputs) {
    if (in.t->numel() == 0 || (in.t == &p.dout && direction == Direction::forward)) continue;
    if (reinterpret_cast<uintptr_t>(in.t->data) % kVectorBytes != 0)
      return unsupported(std::string(in.name) + ": the sm80 tier loads 16-byte vectors; the data pointer must be "
                                                "16-byte aligned");
    // Every stride but the head dim's ([B, S, H, D], or packed [total, H, D]): a packed
    // sequence starts a whole number of row strides into the tensor, so it stays aligned too.
    const int last = in.t->rank - 1;
    for (int d = 0; d < last; ++d)
      if (in.t->stride[d] % vec != 0)
        return unsupported(std::string(in.name) + ": stride " + std::to_string(in.t->stride[d]) + " of dimension " +
                           std::to_string(d) + " must be a multiple of " + std::to_string(vec) +
                           " elements (16 bytes) for the sm80 tier");
    if (in.t->shape[last] % vec != 0)
      return unsupported(std::string(in.name) + ": head dim " + std::to_string(in.t->shape[last]) +
                         " must be a multiple of " + std::to_string(vec) + " elements (16 bytes) for the sm80 tier");
  }
  return Status::success();
}

template <class F>
Status with_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::fp16: return f(fp16_t{});
    case DType::bf16: return f(bf16_t{});
    default: return f(tf32_t{});
  }
}

// supports(), and the device's properties for run().
Status check_call(const Params& p, Direction direction, DeviceProps& props) {
  const Problem s = Problem::of(p);
  if (p.q.dtype == DType::fp32 && p.precision != Precision::tf32)
    return unsupported("precision: fp32 with ieee precision is exact fp32, which the simt tier computes; "
                       "the sm80 tier takes fp16, bf16, or fp32 with precision tf32");
  int bucket = 0;
  if (Status st = head_dim_of(s, &bucket); !st.ok()) return st;
  if (Status st = check_grid_limits(s); !st.ok()) return st;
  if (Status st = check_vector_loads(p, direction); !st.ok()) return st;
  if (Status st = current_device(p, direction, &props); !st.ok()) return st;
  if (props.arch < 80 || props.arch < FMHA_CUDA_SM80_MIN_ARCH)
    return unsupported("q: cuda:" + std::to_string(props.ordinal) + " is sm_" + std::to_string(props.arch) +
                       "; the sm80 tier needs sm_80 or newer (this build: FMHA_CUDA_ARCHS = " FMHA_CUDA_ARCHS_TEXT ")");
  return with_head_dim(bucket, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return with_dtype(p.q.dtype, [&](auto type) {
      using T = decltype(type);
      auto check = [&](size_t need) { return check_shared_memory("sm80", direction, HD, need, props); };
      return with_config_variant<T, HD>(
          p, direction, props, [&](auto v) { return check(forward_shared_bytes<T, HD, decltype(v)::value>()); },
          [&](auto v) { return check(backward_shared_bytes<T, HD, decltype(v)::value>(p.deterministic)); });
    });
  });
}

// The tier's two parts for tier_supports / tier_run (cuda/common/tier.h).
struct Sm80 {
  static Status check(const Params& p, Direction direction, DeviceProps& props) {
    return check_call(p, direction, props);
  }
  static Status launch(const Params& p, Direction direction, const DeviceProps& props, const AttentionArgs& args,
                       cudaStream_t stream) {
    const Problem s = Problem::of(p);
    return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      return with_dtype(p.q.dtype, [&](auto type) {
        using T = decltype(type);
        return with_config_variant<T, HD>(
            p, direction, props, [&](auto v) { return forward<T, HD, decltype(v)::value>(args, stream); },
            [&](auto v) { return backward<T, HD, decltype(v)::value>(args, stream); });
      });
    });
  }
};

}  // namespace

Status supports(const Params& p, Direction direction) { return tier_supports<Sm80>(p, direction); }
Status run(const Params& p, Direction direction) { return tier_run<Sm80>(p, direction); }

std::vector<std::string> variants(Direction direction) {
  return direction == Direction::backward ? variant_list(kBwdVariantNames, kBwdVariants)
                                          : variant_list(kFwdVariantNames, kFwdVariants);
}

Status variant_of(const Params& p, Direction direction, std::string* name) {
  DeviceProps props;
  if (Status st = check_call(p, direction, props); !st.ok()) return st;
  const Problem s = Problem::of(p);
  return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return with_dtype(p.q.dtype, [&](auto type) {
      using T = decltype(type);
      auto record = [&](const char* const* names, auto v) {
        *name = names[decltype(v)::value];
        return Status::success();
      };
      return with_config_variant<T, HD>(
          p, direction, props, [&](auto v) { return record(kFwdVariantNames, v); },
          [&](auto v) { return record(kBwdVariantNames, v); });
    });
  });
}

}  // namespace fmha::cuda::sm80
