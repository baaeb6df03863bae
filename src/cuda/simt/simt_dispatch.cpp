// The simt tier's entry points for the backend table: supports, run, workspace_size. Exact fp32
// (FMA, libdevice exp2f) on any GPU this build has machine code for (sm_75 and up with CUDA 13,
// which dropped the older architectures), fp32 storage with Precision::ieee, or tf32x3 computed
// exactly (split tf32 approximates fp32).
//
// FMHA_SIMT_CONFIG=<name> picks the forward configuration and FMHA_SIMT_BWD_CONFIG=<name> the
// backward main kernel's (names and what they change: simt_config.h) at the head dims compiled in
// every variant (FMHA_TUNED_HEAD_DIMS, 64 and 128 by default); "compact" also at the head dims
// where it is compiled besides (32, 96, 192); elsewhere the default runs. Each variable is read
// once, at the first call; without it, the tuning cache's winner runs (src/tune/). A default
// that needs more shared memory than the GPU offers gives way to a compiled variant that fits
// (variant.h).
#include "cuda/simt/simt_dispatch.h"

#include "cuda/common/dispatch_util.h"
#include "cuda/common/tier.h"
#include "cuda/common/variant.h"
#include "cuda/simt/simt_config.h"
#include "cuda/simt/simt_launch.h"

namespace fmha::cuda::simt {
namespace {

static_assert(kFwdVariants == FMHA_CUDA_SIMT_FWD_VARIANTS, "cmake/cuda.cmake instantiates every forward variant");
static_assert(kBwdVariants == FMHA_CUDA_SIMT_BWD_VARIANTS, "cmake/cuda.cmake instantiates every backward variant");

constexpr const char* kConfigVariable = "FMHA_SIMT_CONFIG";
constexpr const char* kBwdVariable = "FMHA_SIMT_BWD_CONFIG";

// True where the compact variants are compiled outside the tuned head dims.
constexpr bool has_compact(int head_dim) {
  return in_head_dims(head_dim, {FMHA_CUDA_SIMT_COMPACT_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)});
}

// f(std::integral_constant<int, V>{}) for the forward / backward variant this call runs at head
// dim HD on a device with `props` (a default that needs more shared memory than the device
// offers gives way to one that fits).
template <int HD, class F>
Status with_fwd_variant(const Params& p, const DeviceProps& props, F&& f) {
  return with_requested_variant<kFwdVariants, default_fwd_variant(HD), is_tuned_head_dim(HD),
                                has_compact(HD) ? kFwdCompact : -1>(
      requested_variant_index<Backend::cuda_simt, Direction::forward>(p, kConfigVariable, kFwdVariantNames,
                                                                      kFwdVariants),
      kConfigVariable, kFwdVariantNames,
      [&](auto v) { return forward_shared_bytes<HD, decltype(v)::value>() <= props.max_shared_per_block; }, f);
}
template <int HD, class F>
Status with_bwd_variant(const Params& p, const DeviceProps& props, F&& f) {
  return with_requested_variant<kBwdVariants, default_bwd_variant(HD), is_tuned_head_dim(HD),
                                has_compact(HD) ? kBwdCompact : -1>(
      requested_variant_index<Backend::cuda_simt, Direction::backward>(p, kBwdVariable, kBwdVariantNames,
                                                                       kBwdVariants),
      kBwdVariable, kBwdVariantNames,
      [&](auto v) {
        return backward_shared_bytes<HD, decltype(v)::value>(p.deterministic) <= props.max_shared_per_block;
      },
      f);
}

// supports(), and the device's properties for run().
Status check_call(const Params& p, Direction direction, DeviceProps& props) {
  const Problem s = Problem::of(p);
  if (FMHA_CUDA_SIMT_MIN_ARCH == 0) return unsupported("backend: the simt tier is not compiled into this build");
  if (p.q.dtype != DType::fp32)
    return unsupported(std::string("q: the simt tier stores fp32 only, got ") + to_string(p.q.dtype) +
                       " (fp16/bf16 run on sm80)");
  // tf32x3 approximates fp32; this tier computes fp32 exactly, so it takes that too.
  if (p.precision == Precision::tf32)
    return unsupported("precision: the simt tier computes exact fp32 (ieee, or tf32x3 computed exactly); tf32 runs "
                       "on sm80");
  int bucket = 0;
  if (Status st = head_dim_of(s, &bucket); !st.ok()) return st;
  if (Status st = check_grid_limits(s); !st.ok()) return st;
  if (Status st = current_device(p, direction, &props); !st.ok()) return st;
  if (props.arch < FMHA_CUDA_SIMT_MIN_ARCH)
    return unsupported("q: cuda:" + std::to_string(props.ordinal) + " is sm_" + std::to_string(props.arch) +
                       "; this build has simt machine code for FMHA_CUDA_ARCHS = " FMHA_CUDA_ARCHS_TEXT);
  return with_head_dim(bucket, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    if (direction == Direction::backward)
      return with_bwd_variant<HD>(p, props, [&](auto variant) {
        return check_shared_memory("simt", direction, HD,
                                   backward_shared_bytes<HD, decltype(variant)::value>(p.deterministic), props);
      });
    return with_fwd_variant<HD>(p, props, [&](auto variant) {
      return check_shared_memory("simt", direction, HD, forward_shared_bytes<HD, decltype(variant)::value>(), props);
    });
  });
}

// The tier's two parts for tier_supports / tier_run (cuda/common/tier.h).
struct Simt {
  static Status check(const Params& p, Direction direction, DeviceProps& props) {
    return check_call(p, direction, props);
  }
  static Status launch(const Params& p, Direction direction, const DeviceProps& props, const AttentionArgs& args,
                       cudaStream_t stream) {
    const Problem s = Problem::of(p);
    return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      if (direction == Direction::backward)
        return with_bwd_variant<HD>(
            p, props, [&](auto variant) { return backward<HD, decltype(variant)::value>(args, stream); });
      return with_fwd_variant<HD>(
          p, props, [&](auto variant) { return forward<HD, decltype(variant)::value>(args, stream); });
    });
  }
};

}  // namespace

Status supports(const Params& p, Direction direction) { return tier_supports<Simt>(p, direction); }
Status run(const Params& p, Direction direction) { return tier_run<Simt>(p, direction); }

std::vector<std::string> variants(const Params&, Direction direction) {
  return direction == Direction::backward ? variant_list(kBwdVariantNames, kBwdVariants)
                                          : variant_list(kFwdVariantNames, kFwdVariants);
}

Status variant_of(const Params& p, Direction direction, std::string* name) {
  DeviceProps props;
  if (Status st = check_call(p, direction, props); !st.ok()) return st;
  const Problem s = Problem::of(p);
  return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    auto record = [&](const char* const* names, auto v) {
      *name = names[decltype(v)::value];
      return Status::success();
    };
    if (direction == Direction::backward)
      return with_bwd_variant<HD>(p, props, [&](auto v) { return record(kBwdVariantNames, v); });
    return with_fwd_variant<HD>(p, props, [&](auto v) { return record(kFwdVariantNames, v); });
  });
}

}  // namespace fmha::cuda::simt
