// The sm80 tier's entry points: tensor-core (mma.sync) forward and backward for fp16, bf16 and
// fp32 storage with Precision::tf32 or tf32x3 (split tf32), on sm_80 and newer.
// fp32 with Precision::ieee is refused: exact fp32 is the simt tier's job.
//
// FMHA_SM80_FWD_CONFIG=<name> and FMHA_SM80_BWD_CONFIG=<name> pick the forward and the backward
// main kernel's configuration (names and what they change: sm80_config.h) at the head dims
// compiled in every variant (FMHA_TUNED_HEAD_DIMS, 64 and 128 by default); "compact" also at the
// head dims where it is compiled besides (96, 192, 256); elsewhere the default runs. Each
// variable is read once, at the first call; without it, the tuning cache's winner runs
// (src/tune/). A default that needs more shared memory than the GPU offers gives way to a
// compiled variant that fits (variant.h). Split tf32 has one configuration per direction
// (sm80_config.h split_fwd_variant), which the variables do not change.
#include "cuda/sm80/sm80_dispatch.h"

#include "backends.h"
#include "common/decode.h"
#include "common/paged.h"
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
  constexpr bool kTuned = is_tuned_head_dim(HD) && !kSplitTf32<T>;
  constexpr bool kCompact = has_compact(HD) && !kSplitTf32<T>;
  const size_t limit = props.max_shared_per_block;
  if (direction == Direction::forward)
    return with_requested_variant<kFwdVariants, default_fwd_variant_of<T>(HD), kTuned, kCompact ? kFwdCompact : -1>(
        requested_variant_index<Backend::cuda_sm80, Direction::forward>(p, kFwdVariable, kFwdVariantNames,
                                                                        kFwdVariants),
        kFwdVariable, kFwdVariantNames,
        [&](auto v) { return forward_shared_bytes<T, HD, decltype(v)::value>() <= limit; }, fwd);
  return with_requested_variant<kBwdVariants, default_bwd_variant_of<T>(HD), kTuned, kCompact ? kBwdCompact : -1>(
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

// f(T{}) for the call's storage type T: fp32 is tf32_t or tf32x3_t by the call's precision.
template <class F>
Status with_dtype(const Params& p, F&& f) {
  switch (p.q.dtype) {
    case DType::fp16: return f(fp16_t{});
    case DType::bf16: return f(bf16_t{});
    default: return p.precision == Precision::tf32x3 ? f(tf32x3_t{}) : f(tf32_t{});
  }
}

// ------------------------------------------------------------------------------------------------
// The decode kernel (sm80_decode_kernel.cuh): calls on a KV cache, and dense decode-shaped ones
// (common/decode.h is_decode_shape) at the head dims it is compiled for.
// ------------------------------------------------------------------------------------------------

// Whether the call is the decode kernel's: every call on a KV cache (which it runs or refuses, say
// for fp32: the dense kernels cannot read a cache), and dense decode-shaped ones whose head dim it
// is compiled for (the others keep the dense kernel).
bool takes_decode(const Params& p, Direction direction) {
  if (is_paged(p)) return true;
  if (!decode::is_decode_shape(p, direction)) return false;
  const Problem s = Problem::of(p);
  return has_decode_kernel(head_dim_bucket(s.head_dim, s.head_dim_v));
}

// f(std::integral_constant<int, HD>{}) for the decode kernel's compiled bucket HD.
template <class F>
Status with_decode_head_dim(int bucket, [[maybe_unused]] F&& f) {  // unused where no bucket is compiled
  switch (bucket) {
#define FMHA_CUDA_DECODE_CASE(hd) \
  case hd: return f(std::integral_constant<int, hd>{});
    FMHA_CUDA_DECODE_HEAD_DIMS(FMHA_CUDA_DECODE_CASE)
#undef FMHA_CUDA_DECODE_CASE
    default: break;
  }
  return unsupported("head_dim: the sm80 decode kernel (calls on a KV cache) is not compiled for head dim " +
                     std::to_string(bucket) + " in this build (FMHA_DECODE_HEAD_DIMS, of FMHA_HEAD_DIMS = " +
                     FMHA_CUDA_HEAD_DIMS_TEXT + ")");
}

template <class F>
Status with_decode_dtype(DType dtype, F&& f) {
  if (dtype == DType::fp16) return f(fp16_t{});
  return f(bf16_t{});
}

Status check_decode(const Params& p, DeviceProps& props) {
  const Problem s = Problem::of(p);
  if (p.cu_seqlens_q.defined() || p.cu_seqlens_k.defined())  // validation refuses these with a cache
    return unsupported("cu_seqlens_q: the sm80 decode kernel takes dense queries");
  if (p.q.dtype != DType::fp16 && p.q.dtype != DType::bf16)
    return unsupported(std::string("q: calls on a KV cache run on the GPU in fp16 and bf16; ") + to_string(p.q.dtype) +
                       " ones run on the cpu and reference backends (CPU tensors)");
  int bucket = 0;
  if (Status st = head_dim_of(s, &bucket); !st.ok()) return st;
  constexpr int64_t kMaxGridYZ = 65535;
  if (s.batch > kMaxGridYZ) return unsupported("q: batch " + std::to_string(s.batch) + " is above 65535");
  if (s.kv_heads * decode::row_tiles(s.seqlen_q, s.group) > kMaxGridYZ)
    return unsupported("q: kv_heads · ceil(seqlen_q · heads / kv_heads / 16) is above 65535 (sm80 decode grid)");
  if (s.seqlen_q * s.group > INT32_MAX / 2 || s.seqlen_k > INT32_MAX / 2)
    return unsupported("q: seqlen_q · group and the cache's capacity must stay below 2^30 (sm80 decode kernel)");
  if (Status st = check_vector_loads(p, Direction::forward); !st.ok()) return st;
  if (Status st = current_device(p, Direction::forward, &props); !st.ok()) return st;
  if (props.arch < 80 || props.arch < FMHA_CUDA_SM80_MIN_ARCH)
    return unsupported("q: cuda:" + std::to_string(props.ordinal) + " is sm_" + std::to_string(props.arch) +
                       "; the sm80 decode kernel needs sm_80 or newer (this build: FMHA_CUDA_ARCHS = " FMHA_CUDA_ARCHS_TEXT
                       ")");
  return with_decode_head_dim(bucket, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return with_decode_dtype(p.q.dtype, [&](auto type) {
      using T = decltype(type);
      return check_shared_memory("sm80 decode", Direction::forward, HD, decode_shared_bytes<T, HD>(), props);
    });
  });
}

// The decode kernel's argument block for a validated call.
DecodeArgs decode_args(const Params& p, const decode::Plan& plan) {
  const Problem s = Problem::of(p);
  DecodeArgs a;
  a.q = View4{p.q.data, p.q.stride[0], p.q.stride[1], p.q.stride[2]};
  a.o = View4{p.o.data, p.o.stride[0], p.o.stride[1], p.o.stride[2]};
  a.k = p.k.data;
  a.v = p.v.data;
  a.k_page_stride = p.k.stride[0], a.k_row_stride = p.k.stride[1], a.k_head_stride = p.k.stride[2];
  a.v_page_stride = p.v.stride[0], a.v_row_stride = p.v.stride[1], a.v_head_stride = p.v.stride[2];
  a.cache = is_paged(p) ? PagedCache::of(p) : PagedCache::dense(s.batch, s.seqlen_k);
  // A pool without pages holds no key, whatever a device table claims: no page to clamp into.
  if (a.cache.num_pages == 0) a.cache.pages_per_seq = 0;
  a.masks = CacheMask::of(p);
  if (p.lse.defined()) {
    a.lse = static_cast<float*>(p.lse.data);
    a.lse_batch_stride = p.lse.stride[0];
    a.lse_head_stride = p.lse.stride[1];
    a.lse_seq_stride = p.lse.stride[2];
  }
  a.batch = int(s.batch);
  a.heads = int(s.heads);
  a.kv_heads = int(s.kv_heads);
  a.group = int(s.group);
  a.head_dim = int(s.head_dim);
  a.head_dim_v = int(s.head_dim_v);
  a.seqlen_q = int(s.seqlen_q);
  a.rows = int(s.seqlen_q * s.group);
  a.row_tiles = int(plan.row_tiles);
  a.scale_log2 = s.scale_log2;
  a.splits = int(plan.splits);
  return a;
}

// The split-count variant a decode call runs (tune/selection.h's order: the tuner's candidate,
// the cache's winner; no environment variable: Params::num_splits is the caller's override). A
// name that is no split variant (a cache written by another build) runs the heuristic.
decode::SplitVariant split_variant_of(const Params& p) {
  const detail::VariantRequest request =
      detail::requested_variant(Backend::cuda_sm80, p, Direction::forward, nullptr);
  decode::SplitVariant variant = decode::SplitVariant::heuristic;
  decode::split_variant_of(request.name, &variant);
  return variant;
}

// The plan of the call's split variant. Where the caller's workspace cannot hold its partials and
// no split count was asked for, the heuristic's count if the workspace holds that (a winner
// cached after the caller sized the workspace), else one split; with a split count asked for,
// the missing workspace is an error.
Status decode_plan(const Params& p, const DeviceProps& props, decode::Plan* plan) {
  *plan = decode::plan(p, props.multiprocessors, split_variant_of(p));
  auto fits = [&](const decode::Plan& candidate) {
    const size_t need = candidate.workspace.total;
    return need == 0 || (p.workspace != nullptr && p.workspace_bytes >= need &&
                         reinterpret_cast<uintptr_t>(p.workspace) % decode::kWorkspaceAlign == 0);
  };
  if (fits(*plan)) return Status::success();
  const size_t need = plan->workspace.total;
  if (p.num_splits <= 0) {
    const decode::Plan heuristic = decode::plan(p, props.multiprocessors);
    if (fits(heuristic)) {
      *plan = heuristic;
      return Status::success();
    }
  }
  if (p.num_splits > 0)
    return {Code::invalid_argument, "workspace: num_splits " + std::to_string(p.num_splits) + " needs " +
                                        std::to_string(need) + " bytes of device workspace aligned to " +
                                        std::to_string(decode::kWorkspaceAlign) + " bytes (see workspace_size), got " +
                                        std::to_string(p.workspace == nullptr ? 0 : p.workspace_bytes)};
  plan->splits = 1;
  plan->workspace = decode::Workspace{};
  return Status::success();
}

Status run_decode(const Params& p, const DeviceProps& props, cudaStream_t stream) {
  decode::Plan plan;
  if (Status st = decode_plan(p, props, &plan); !st.ok()) return st;
  DecodeArgs args = decode_args(p, plan);
  if (plan.splits > 1) {
    char* base = static_cast<char*>(p.workspace);
    args.part_o = reinterpret_cast<float*>(base + plan.workspace.part_o);
    args.part_lse = reinterpret_cast<float*>(base + plan.workspace.part_lse);
  }
  const Problem s = Problem::of(p);
  const Status launched = with_decode_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return with_decode_dtype(p.q.dtype, [&](auto type) { return decode<decltype(type), HD>(args, stream); });
  });
  if (!launched.ok() || plan.splits == 1) return launched;
  detail::SplitParts parts;
  parts.out = args.part_o;
  parts.lse = args.part_lse;
  parts.splits = plan.splits;
  parts.batch = s.batch;
  parts.seqlen = s.seqlen_q;
  parts.heads = s.heads;
  parts.head_dim_v = s.head_dim_v;
  return detail::cuda_merge_splits(parts, p.o, p.lse, stream);
}

// supports(), and the device's properties for run().
Status check_call(const Params& p, Direction direction, DeviceProps& props) {
  if (takes_decode(p, direction)) return check_decode(p, props);
  const Problem s = Problem::of(p);
  if (p.q.dtype == DType::fp32 && p.precision == Precision::ieee)
    return unsupported("precision: fp32 with ieee precision is exact fp32, which the simt tier computes; "
                       "the sm80 tier takes fp16, bf16, or fp32 with precision tf32 or tf32x3");
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
    return with_dtype(p, [&](auto type) {
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
  static constexpr bool kRunsKvCache = true;  // on the decode kernel
  static Status check(const Params& p, Direction direction, DeviceProps& props) {
    return check_call(p, direction, props);
  }
  static Status launch(const Params& p, Direction direction, const DeviceProps& props, const AttentionArgs& args,
                       cudaStream_t stream) {
    if (takes_decode(p, direction)) return run_decode(p, props, stream);
    const Problem s = Problem::of(p);
    return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      return with_dtype(p, [&](auto type) {
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

Status workspace_size(const Params& p, Direction direction, size_t* bytes) {
  if (!takes_decode(p, direction)) return cuda::workspace_size(p, direction, bytes);
  DeviceProps props;
  if (Status st = check_decode(p, props); !st.ok()) return st;
  *bytes = decode::plan(p, props.multiprocessors, split_variant_of(p)).workspace.total;
  return Status::success();
}

std::vector<std::string> variants(const Params& p, Direction direction) {
  if (takes_decode(p, direction)) return variant_list(decode::kSplitVariantNames, decode::kSplitVariants);
  return direction == Direction::backward ? variant_list(kBwdVariantNames, kBwdVariants)
                                          : variant_list(kFwdVariantNames, kFwdVariants);
}

Status variant_of(const Params& p, Direction direction, std::string* name) {
  DeviceProps props;
  if (Status st = check_call(p, direction, props); !st.ok()) return st;
  if (takes_decode(p, direction)) {
    *name = decode::kSplitVariantNames[int(split_variant_of(p))];
    return Status::success();
  }
  const Problem s = Problem::of(p);
  return with_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return with_dtype(p, [&](auto type) {
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
