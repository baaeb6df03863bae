// The sm90 tier's entry points: the Hopper forward (wgmma + TMA, warp-specialised, persistent)
// for fp16 and bf16 storage on sm_90 (H100/H200), head dims 64 to 256, and for fp32 storage with
// precision tf32 at head dims 64 to 128 (one configuration, the default) and with tf32x3 (split
// tf32) at head dim 64; the backward (wgmma + TMA, warp-specialised) for fp16 and bf16 at head
// dims 64 to 256, for fp32 with precision tf32 at head dims 64 to 128 and with tf32x3 at head dim
// 64, deterministic on request (dQ added in descending key-tile order). Calls it cannot take
// (another GPU, exact fp32, head dims below 64 or above a precision's largest, views TMA cannot
// address) are refused with the reason, and auto-selection moves on to the sm80 tier.
//
// FMHA_SM90_FWD_CONFIG=<name> picks the forward's configuration (sm90_config.h) at the head dims
// compiled in every variant (FMHA_TUNED_HEAD_DIMS); elsewhere the default runs. Read once;
// without it, the tuning cache's winner runs (src/tune/).
//
// The forward's workspace (workspace_size: one counter) is optional. With it, work tiles past the
// first wave go to whichever block finishes first (a dynamic schedule); without it, each block
// takes every grid-th tile. FMHA_SM90_SCHEDULER=static forces the latter (to measure the two).
//
// Variable-length (packed) calls run here too, forward and backward, on the kernels' packed
// instantiations: the forward's producer walks the sequence table on the device
// (sm90_packed_tiles.h), the backward has a block per key tile of the longest sequence.
#include "cuda/sm90/sm90_dispatch.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/decode.h"
#include "common/env_switch.h"
#include "cuda/common/dispatch_util.h"
#include "cuda/common/launch.h"
#include "cuda/common/tier.h"
#include "cuda/common/variant.h"
#include "cuda/sm90/sm90_launch.h"
#include "cuda/sm90/sm90_tma.h"

namespace fmha::cuda::sm90 {
namespace {

static_assert(kFwdVariants == FMHA_CUDA_SM90_FWD_VARIANTS, "cmake/cuda.cmake instantiates every forward variant");
static_assert(kFwdSpeculate == kFwdVariants - 1, "cmake/cuda.cmake compiles the last variant as spec");

// True where `spec` is compiled outside the tuned head dims (FMHA_SM90_SPEC_HEAD_DIMS: the head
// dims where it is the dense calls' default, default_fwd_variant).
constexpr bool has_spec(int head_dim) {
  return in_head_dims(head_dim, {FMHA_CUDA_SM90_SPEC_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)});
}

constexpr const char* kFwdVariable = "FMHA_SM90_FWD_CONFIG";
constexpr int kMinHeadDim = 64;  // smaller head dims run on the sm80 tier
// K/V bytes of one L2 section of heads: a share of the H100/H200's 50/60 MB L2 that leaves room
// for the queries and outputs in flight.
constexpr double kL2SectionBytes = 32.0 * 1024 * 1024;
// The forward's workspace: the dynamic scheduler's counter, in the workspace's alignment unit.
constexpr size_t kFwdWorkspaceBytes = 256;
// Calls that walk their query tiles in order (no causal mask or window) take each head's query
// tiles together (TileScheduler::tiles_fastest: at head dim 256, 2k, K/V read about once from
// DRAM where the heads of an L2 section together read them ~1.75 times, docs/PERF.md runs 59-61);
// FMHA_SM90_FWD_ORDER=heads walks the heads of a section together instead (kSm90HeadsTogether),
// and FMHA_SM90_L2_SECTION_MB=<MB> sets the forward's section budget (kL2SectionBytes otherwise) and
// the deterministic backward's (kBwdL2SectionBytes); both to measure the walks.
constexpr const char* kSectionBudgetVariable = "FMHA_SM90_L2_SECTION_MB";
// The deterministic backward's Q, dO and dQ-accumulator bytes of one section of its block order
// (BwdBlockOrder).
constexpr double kBwdL2SectionBytes = 32.0 * 1024 * 1024;

// The tier's measurement switches (common/env_switch.h: FMHA_SM90_SCHEDULER, FMHA_SM90_FWD_ORDER
// and, in backward_block_order, FMHA_SM90_BWD_ORDER; read once, at their first use; text they do
// not take is reported on stderr and gives the default).
bool static_schedule_forced() {
  static const bool forced = read_switch_on(kSm90StaticSchedule);
  return forced;
}

bool tiles_fastest_walk() {
  static const bool tiles = !read_switch_on(kSm90HeadsTogether);
  return tiles;
}

// An L2 section budget in bytes: FMHA_SM90_L2_SECTION_MB's or `fallback` (sm90_sections.h).
double section_budget(double fallback) {
  static const std::string mb = [] {
    const char* text = std::getenv(kSectionBudgetVariable);
    std::string warning;
    l2_section_budget(text, 1.0, &warning);
    report_switch(warning);
    return std::string(text ? text : "");
  }();
  return l2_section_budget(mb.c_str(), fallback);
}

// The forward's tile counter from the caller's workspace, zeroed on the call's stream; null (a
// static schedule) when the call brings none.
Status forward_tile_counter(const Params& p, cudaStream_t stream, int** counter) {
  *counter = nullptr;
  if (p.workspace == nullptr || static_schedule_forced()) return Status::success();
  if (p.workspace_bytes < sizeof(int))
    return {Code::invalid_argument, "workspace: " + std::to_string(p.workspace_bytes) +
                                        " bytes given; the sm90 forward uses " + std::to_string(kFwdWorkspaceBytes) +
                                        " (see workspace_size), or none for a static schedule"};
  if (reinterpret_cast<uintptr_t>(p.workspace) % alignof(int) != 0)
    return {Code::invalid_argument, "workspace: pointer must be aligned to " + std::to_string(alignof(int)) + " bytes"};
  *counter = static_cast<int*>(p.workspace);
  return cuda_status(cudaMemsetAsync(*counter, 0, sizeof(int), stream), "sm90 forward tile counter reset");
}

// f(std::integral_constant<int, HD>{}) for the sm90 buckets compiled into this build.
template <class F>
Status with_sm90_head_dim(int bucket, F&& f) {
  switch (bucket) {
#define FMHA_CUDA_SM90_HEAD_DIM_CASE(hd) \
  case hd: return f(std::integral_constant<int, hd>{});
    FMHA_CUDA_SM90_HEAD_DIMS(FMHA_CUDA_SM90_HEAD_DIM_CASE)
#undef FMHA_CUDA_SM90_HEAD_DIM_CASE
    default: break;
  }
  return unsupported("head_dim: bucket " + std::to_string(bucket) + " has no sm90 kernel in this build");
}

// The tf32 forward (fp32 storage) is compiled at the tf32 head dims in the default variant only,
// the split-tf32 one (tf32x3) at its head dim (64) likewise.
template <int HD, int V>
constexpr bool has_tf32_forward() {
  return V == kFwdDefault && tf32_head_dim(HD);
}
template <int HD, int V>
constexpr bool has_tf32x3_forward() {
  return V == kFwdDefault && tf32x3_head_dim(HD);
}
bool split_tf32(const Params& p) { return p.q.dtype == DType::fp32 && p.precision == Precision::tf32x3; }

template <class F>
Status with_dtype(DType dtype, F&& f) {
  if (dtype == DType::fp16) return f(fp16_t{});
  return f(bf16_t{});
}
// The backward's storage types at HD: fp32 where tf32_backward_head_dim, split tf32 (tf32x3_t)
// where tf32x3_backward_head_dim.
template <int HD, class F>
Status with_backward_dtype(const Params& p, F&& f) {
  if (split_tf32(p)) {
    if constexpr (tf32x3_backward_head_dim(HD)) return f(tf32x3_t{});
    return unsupported("precision: no sm90 split-tf32 (tf32x3) backward kernel at head dim " + std::to_string(HD));
  }
  if (p.q.dtype == DType::fp32) {
    if constexpr (tf32_backward_head_dim(HD)) return f(fp32_t{});
    return unsupported("precision: no sm90 tf32 backward kernel at head dim " + std::to_string(HD));
  }
  return with_dtype(p.q.dtype, f);
}
// Shared memory of the backward's kernels a call runs at HD.
template <int HD>
size_t backward_shared_bytes_of(const Params& p) {
  if constexpr (tf32x3_backward_head_dim(HD))
    if (split_tf32(p)) return backward_shared_bytes<tf32x3_t, HD>();
  if constexpr (tf32_backward_head_dim(HD))
    if (p.q.dtype == DType::fp32) return backward_shared_bytes<fp32_t, HD>();
  return backward_shared_bytes<bf16_t, HD>();
}
// The forward's storage types at (HD, V): fp32 where has_tf32_forward, split tf32 (tf32x3_t)
// where has_tf32x3_forward.
template <int HD, int V, class F>
Status with_forward_dtype(const Params& p, F&& f) {
  if (split_tf32(p)) {
    if constexpr (has_tf32x3_forward<HD, V>()) return f(tf32x3_t{});
    return unsupported("precision: no sm90 split-tf32 (tf32x3) forward kernel at head dim " + std::to_string(HD) +
                       " in variant " + kFwdVariantNames[V]);
  }
  if (p.q.dtype == DType::fp32) {
    if constexpr (has_tf32_forward<HD, V>()) return f(fp32_t{});
    return unsupported("precision: no sm90 tf32 forward kernel at head dim " + std::to_string(HD) + " in variant " +
                       kFwdVariantNames[V]);
  }
  return with_dtype(p.q.dtype, f);
}
// Shared memory of the forward kernel the call runs at (HD, V).
template <int HD, int V>
size_t forward_shared_bytes_of(const Params& p) {
  if constexpr (has_tf32x3_forward<HD, V>())
    if (split_tf32(p)) return forward_shared_bytes<tf32x3_t, HD, V>();
  if constexpr (has_tf32_forward<HD, V>())
    if (p.q.dtype == DType::fp32) return forward_shared_bytes<fp32_t, HD, V>();
  return forward_shared_bytes<bf16_t, HD, V>();
}

// The forward variant a call gets when nothing requests one: default_fwd_variant of its shape
// (kDefaultVariant where that is the tier's default); fp32 (tf32) has the default alone.
int shape_default_variant(int head_dim, const Params& p) {
  if (p.q.dtype == DType::fp32) return kDefaultVariant;
  const bool packed = p.cu_seqlens_q.defined() || p.cu_seqlens_k.defined();
  const int v = default_fwd_variant(head_dim, packed);
  return v == kFwdDefault ? kDefaultVariant : v;
}

// The request (tuner, variable, cache), else the shape's default. fp32 (tf32) calls compile the
// default variant alone: a request naming another is refused (as at an untuned head dim, where
// the default runs, but a named variant here must not silently run something else).
template <int HD, class F>
Status with_config_variant(const Params& p, const DeviceProps& props, F&& f) {
  int requested = requested_variant_index<Backend::cuda_sm90, Direction::forward>(p, kFwdVariable, kFwdVariantNames,
                                                                                 kFwdVariants);
  if (requested == kDefaultVariant) requested = shape_default_variant(HD, p);
  auto fits = [&](auto v) { return forward_shared_bytes_of<HD, decltype(v)::value>(p) <= props.max_shared_per_block; };
  if (p.q.dtype == DType::fp32) {
    if (requested != kDefaultVariant && requested != kFwdDefault && requested >= 0)
      return unsupported(std::string(kFwdVariable) + ": the sm90 " + (split_tf32(p) ? "split-tf32" : "tf32") +
                         " forward (fp32 storage) compiles only the " +
                         kFwdVariantNames[kFwdDefault] + " configuration, not " + kFwdVariantNames[requested]);
    return with_requested_variant<kFwdVariants, kFwdDefault, false>(requested, kFwdVariable, kFwdVariantNames, fits, f);
  }
  // A request for a variant this build does not compile at HD is ignored: the call runs what it
  // runs with none (the shape's default, spec where it is compiled).
  if (requested >= 0 && !fwd_variant_built(requested, is_tuned_head_dim(HD), has_spec(HD)))
    requested = shape_default_variant(HD, p);
  return with_requested_variant<kFwdVariants, kFwdDefault, is_tuned_head_dim(HD), has_spec(HD) ? kFwdSpeculate : -1>(
      requested, kFwdVariable, kFwdVariantNames, fits, f);
}

Status check_call(const Params& p, Direction direction, DeviceProps& props) {
  const Problem s = Problem::of(p);
  // Decoding (seqlen_q <= 16) is bound by reading K and V once: `auto` leaves it to the sm80
  // tier's decode kernel, which packs the query heads of a KV head into one tile and splits long
  // caches over CTAs; naming this tier still runs it here.
  if (p.backend == Backend::auto_select && decode::is_decode_shape(p, direction) &&
      has_decode_kernel(head_dim_bucket(s.head_dim, s.head_dim_v)))
    return unsupported("q: seqlen_q " + std::to_string(s.seqlen_q) +
                       " <= 16 is decoding, which auto runs on the sm80 tier's decode kernel");
  int bucket = 0;
  const bool backward = direction == Direction::backward;
  const bool fp32 = p.q.dtype == DType::fp32;
  const bool split = split_tf32(p);
  if (fp32 && p.precision != Precision::tf32 && !split)
    return unsupported(std::string("precision: fp32 storage with precision ") + to_string(p.precision) +
                       " is not on the sm90 tier (it runs tf32, and tf32x3 at head dim 64); the simt tier runs "
                       "exact fp32");
  if (Status st = head_dim_of(s, &bucket); !st.ok()) return st;
  if (split && backward && bucket >= kMinHeadDim && !tf32x3_backward_head_dim(bucket))
    return unsupported("head_dim: " + std::to_string(std::max(s.head_dim, s.head_dim_v)) +
                       " is above the sm90 split-tf32 backward's largest head dim (" +
                       std::to_string(kTf32x3BwdMaxHeadDim) + ": its residual tiles fill shared memory); the sm80 "
                       "tier runs it");
  if (split && bucket >= kMinHeadDim && !tf32x3_head_dim(bucket))
    return unsupported("head_dim: " + std::to_string(std::max(s.head_dim, s.head_dim_v)) +
                       " is above the sm90 split-tf32 forward's largest head dim (" + std::to_string(kTf32x3MaxHeadDim) +
                       ": its residual tiles double shared memory); the sm80 tier runs it");
  if (fp32 && backward && bucket >= kMinHeadDim && !tf32_backward_head_dim(bucket))
    return unsupported("head_dim: " + std::to_string(std::max(s.head_dim, s.head_dim_v)) +
                       " is above the sm90 tf32 backward's largest head dim (" + std::to_string(kTf32BwdMaxHeadDim) +
                       ": its fp32 tiles and their transposes fill shared memory); the sm80 tier runs it");
  if (fp32 && bucket >= kMinHeadDim && !tf32_head_dim(bucket))
    return unsupported("head_dim: " + std::to_string(std::max(s.head_dim, s.head_dim_v)) +
                       " is above the sm90 tf32 forward's largest head dim (" + std::to_string(kTf32MaxHeadDim) +
                       ": fp32 tiles take twice the shared memory); the sm80 tier runs it");
  if (bucket < kMinHeadDim)
    return unsupported("head_dim: " + std::to_string(std::max(s.head_dim, s.head_dim_v)) +
                       " is below the sm90 tier's smallest head dim (64); the sm80 tier runs it");
  if (backward && bucket > kBwdMaxHeadDim)
    return unsupported("head_dim: " + std::to_string(std::max(s.head_dim, s.head_dim_v)) +
                       " is above the sm90 backward's largest head dim (" + std::to_string(kBwdMaxHeadDim) +
                       "); the sm80 tier runs it");
  const struct {
    const char* name;
    const Tensor* t;
  } views[] = {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"o", &p.o}, {"dout", &p.dout}};
  for (const auto& v : views) {
    if (v.t == &p.dout && !backward) continue;
    if (Status st = check_tma_view(*v.t, v.name); !st.ok()) return st;
  }
  constexpr int64_t kMaxCoordinate = (int64_t(1) << 31) - 1;  // TMA coordinates are int32
  if (s.seqlen_q > kMaxCoordinate || s.seqlen_k > kMaxCoordinate)
    return unsupported("q: sequence lengths above 2^31 - 1 exceed TMA's coordinates (sm90 tier)");
  // Packed tensors are addressed from their first row: every row index is a coordinate.
  if (s.packed && (s.total_q > kMaxCoordinate || s.total_k > kMaxCoordinate))
    return unsupported(std::string(s.total_q > kMaxCoordinate ? "q" : "k") +
                       ": packed tensors of more than 2^31 - 1 tokens exceed TMA's coordinates (sm90 tier)");
  // The backward's grid: a block per (key tile, KV head, batch or sequence); the deterministic
  // kernel's in one dimension.
  if (backward) {
    if (Status st = check_grid_limits(s); !st.ok()) return st;
    const int64_t blocks =
        ceil_div(s.seqlen_k, int64_t(bwd_config(bucket, int(dtype_size(s.dtype)), split).keys)) * s.batch * s.kv_heads;
    if (p.deterministic && blocks > int64_t(INT32_MAX))
      return unsupported("deterministic: " + std::to_string(blocks) +
                         " blocks (key tiles · KV heads · batch) exceed the sm90 deterministic backward's grid "
                         "(2^31 - 1)");
  }
  if (Status st = current_device(p, direction, &props); !st.ok()) return st;
  if (props.arch != 90)
    return unsupported("q: cuda:" + std::to_string(props.ordinal) + " is sm_" + std::to_string(props.arch) +
                       "; the sm90 tier runs on sm_90 (H100/H200) only");
  return with_sm90_head_dim(bucket, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    if (backward) {
      if constexpr (HD <= kBwdMaxHeadDim)
        return check_shared_memory("sm90", direction, HD, backward_shared_bytes_of<HD>(p), props);
      return unsupported("head_dim: no sm90 backward kernel at head dim " + std::to_string(HD));
    }
    return with_config_variant<HD>(p, props, [&](auto v) {
      return check_shared_memory("sm90", direction, HD, forward_shared_bytes_of<HD, decltype(v)::value>(p), props);
    });
  });
}

int multiprocessors(int ordinal) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return count;
}

// Heads per L2 section (forward_section): whole GQA groups whose K and V fit the section budget,
// no more than one wave of the grid covers where a head's query tiles fit in a wave.
int l2_section(const Problem& s, int64_t m_blocks, int grid, bool longest_first) {
  const double kv_bytes = double(s.seqlen_k) * double(s.head_dim + s.head_dim_v) * double(dtype_size(s.dtype));
  return forward_section(kv_bytes, section_budget(kL2SectionBytes), int(std::min<int64_t>(m_blocks, INT32_MAX)),
                         grid, int(s.group), s.batch * s.heads, longest_first);
}

// The backward's block order: the deterministic kernel takes sections of as many (batch, KV head)
// pairs as keep their Q, dO and dQ-accumulator rows within the section budget; the default one
// takes one pair's key tiles after another (its 3-D grid).
BwdBlockOrder backward_block_order(const Problem& s, const AttentionArgs& args, int keys, bool deterministic) {
  BwdBlockOrder order;
  order.key_tiles = int(ceil_div(args.seqlen_k, int64_t(keys)));  // packed: of the longest sequence
  order.kv_heads = int(s.kv_heads);
  // Deterministic calls: check_call bounds key tiles · pairs by INT32_MAX (the default kernel's
  // 3-D grid reads only key_tiles).
  order.pairs = int(std::min<int64_t>(s.batch * s.kv_heads, INT32_MAX));
  static const bool pairs_alone = read_switch_on(kSm90PairsAlone);
  const bool sections = deterministic && !pairs_alone;
  if (!sections) return order;
  const double row_bytes = double(s.head_dim + s.head_dim_v) * double(dtype_size(s.dtype)) +
                           double(args.dq_accum_stride) * double(sizeof(float));
  const double pair_bytes = double(s.group) * double(s.seqlen_q) * row_bytes;
  const double fit = pair_bytes > 0 ? section_budget(kBwdL2SectionBytes) / pair_bytes : double(order.pairs);
  order.section = int(std::clamp<double>(fit, 1.0, double(std::max(order.pairs, 1))));
  return order;
}

// The tier's two parts for tier_supports / tier_run (cuda/common/tier.h). launch() adds what only
// this tier needs to the argument block: the TMA tensor maps and the tile scheduler.
// The backward: TMA maps of Q, K, V and dO in the backward's tile shapes, then the launcher.
Status launch_backward(const Params& p, const AttentionArgs& args, cudaStream_t stream) {
  const Problem s = Problem::of(p);
  BwdParams params{};
  params.args = args;
  const int64_t element_bytes = int64_t(dtype_size(s.dtype));
  params.vector_key_grads =
      args.dk.vector_rows(args.batch, args.seqlen_k, args.kv_heads, args.head_dim, element_bytes) &&
      args.dv.vector_rows(args.batch, args.seqlen_k, args.kv_heads, args.head_dim_v, element_bytes);
  return with_sm90_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) -> Status {
    constexpr int HD = decltype(hd)::value;
    if constexpr (HD > kBwdMaxHeadDim) {
      return unsupported("head_dim: no sm90 backward kernel at head dim " + std::to_string(HD));
    } else {
      if (s.batch == 0) return Status::success();
      if (args.dq_accum != nullptr && args.dq_accum_stride != padded_head_dim(HD) + kBwdDqPad)
        return {Code::internal, "sm90 backward: the dQ accumulator's rows do not have the kernel's stride"};
      // Empty sides are never read (no query tiles, or no blocks), but their maps need valid
      // addresses: the other side's. Blocks with no query tile still write dK = dV = 0.
      Tensor queries = p.q, grads = p.dout, keys = p.k, values = p.v;
      if (s.seqlen_q == 0 || s.total_q == 0) queries.data = grads.data = p.k.data;
      if (s.seqlen_k == 0 || s.total_k == 0) keys.data = values.data = p.q.data;
      // Boxes of one swizzled chunk's columns (64 16-bit, 32 fp32) by the kernel's rows.
      const int box_cols = chunk_cols(size_t(element_bytes));
      const BwdConfig config = bwd_config(HD, int(element_bytes), split_tf32(p));
      if (Status st = encode_tile_map(&params.q, queries, box_cols, config.rows, "q"); !st.ok()) return st;
      const int keys_per_block = config.keys;
      params.order = backward_block_order(s, args, keys_per_block, args.dq_turns != nullptr);
      if (Status st = encode_tile_map(&params.k, keys, box_cols, keys_per_block, "k"); !st.ok()) return st;
      if (Status st = encode_tile_map(&params.v, values, box_cols, keys_per_block, "v"); !st.ok()) return st;
      if (Status st = encode_tile_map(&params.dout, grads, box_cols, config.rows, "dout"); !st.ok()) return st;
      return with_backward_dtype<HD>(p, [&](auto type) {
        using T = decltype(type);
        return backward<T, HD>(params, stream);
      });
    }
  });
}

struct Sm90 {
  // The deterministic backward adds each query tile's dQ in descending key-tile order.
  // Its dQ accumulator rows have the stride of the kernel's staging tile (whole padded tiles plus
  // a bank-conflict pad), so that a query tile's dQ leaves in one bulk reduction. Its turn
  // counters are counted in tiles of kBwdRows, the least any head dim's kernel takes: a kernel of
  // BwdConfig::rows = 128 uses the first half of each (batch, head)'s.
  static constexpr OrderedDq kOrderedDq{kBwdRows, kBwdTurnParts, kChunkCols, kBwdDqPad};
  static Status check(const Params& p, Direction direction, DeviceProps& props) {
    return check_call(p, direction, props);
  }
  static Status launch(const Params& p, Direction direction, const DeviceProps& props, const AttentionArgs& args,
                       cudaStream_t stream) {
    if (direction == Direction::backward) return launch_backward(p, args, stream);
    const Problem s = Problem::of(p);
    FwdParams params{};
    params.args = args;
    return with_sm90_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      return with_config_variant<HD>(p, props, [&](auto v) {
        constexpr int V = decltype(v)::value;
        constexpr FwdConfig c16 = fwd_config(HD, V);
        constexpr FwdConfig c32 = fwd_config(HD, V, int(sizeof(fp32_t)));
        const FwdConfig c = split_tf32(p) ? tf32x3_fwd_config() : p.q.dtype == DType::fp32 ? c32 : c16;
        const int box_cols = chunk_cols(dtype_size(p.q.dtype));
        const int64_t m_blocks = ceil_div(s.seqlen_q, c.tile_m());
        // Packed: the most work tiles any table gives (the device walk finds the real ones).
        const int64_t total = s.packed ? packed_tile_bound(args, c.tile_m()) : m_blocks * s.batch * s.heads;
        if (total == 0 || s.total_q == 0) return Status::success();
        const int grid = int(std::min<int64_t>(total, multiprocessors(props.ordinal)));
        // Tile indices run to total + grid (each block's last request).
        if (total > int64_t(INT32_MAX) - grid)
          return unsupported("q: " + std::to_string(total) + " query tiles exceed the sm90 scheduler's int32 range");
        // Empty K/V are never read, but their maps need a valid address: Q's.
        Tensor keys = p.k, values = p.v;
        if (s.seqlen_k == 0 || s.total_k == 0) keys.data = values.data = p.q.data;
        if (Status st = encode_tile_map(&params.q, p.q, box_cols, c.tile_m(), "q"); !st.ok()) return st;
        if (Status st = encode_tile_map(&params.k, keys, box_cols, c.tile_n, "k"); !st.ok()) return st;
        if (Status st = encode_tile_map(&params.v, values, box_cols, c.tile_n, "v"); !st.ok()) return st;
        if (Status st = encode_tile_map(&params.o, p.o, box_cols, kConsumerRows, "o"); !st.ok()) return st;
        // Packed calls use heads and longest_first only (PackedTileCursor).
        TileScheduler& sched = params.scheduler;
        sched.m_blocks = int(m_blocks);
        sched.heads = int(s.heads);
        sched.batch_heads = int(s.batch * s.heads);
        sched.total = int(total);
        sched.longest_first = p.causal != Causal::none || p.window_left >= 0 || p.window_right >= 0;
        sched.section = l2_section(s, m_blocks, grid, sched.longest_first);
        sched.tiles_fastest = !sched.longest_first && tiles_fastest_walk();
        if (Status st = forward_tile_counter(p, stream, &params.tile_counter); !st.ok()) return st;
        return with_forward_dtype<HD, V>(p, [&](auto type) {
          using T = decltype(type);
          return forward<T, HD, V>(params, grid, stream);
        });
      });
    });
  }
};

}  // namespace

Status supports(const Params& p, Direction direction) { return tier_supports<Sm90>(p, direction); }
Status run(const Params& p, Direction direction) { return tier_run<Sm90>(p, direction); }
Status workspace_size(const Params& p, Direction direction, size_t* bytes) {
  if (direction == Direction::forward) {
    const Problem s = Problem::of(p);
    *bytes = s.total_q * s.heads > 0 ? kFwdWorkspaceBytes : 0;
    return Status::success();
  }
  return cuda::workspace_size(p, direction, bytes, ordered_dq<Sm90>());
}

std::vector<std::string> variants(const Params&, Direction direction) {
  if (direction == Direction::backward) return {};
  return variant_list(kFwdVariantNames, kFwdVariants);
}

Status variant_of(const Params& p, Direction direction, std::string* name) {
  DeviceProps props;
  if (Status st = check_call(p, direction, props); !st.ok()) return st;
  if (direction == Direction::backward) {  // one configuration
    *name = "default";
    return Status::success();
  }
  const Problem s = Problem::of(p);
  return with_sm90_head_dim(head_dim_bucket(s.head_dim, s.head_dim_v), [&](auto hd) {
    return with_config_variant<decltype(hd)::value>(p, props, [&](auto v) {
      *name = kFwdVariantNames[decltype(v)::value];
      return Status::success();
    });
  });
}

}  // namespace fmha::cuda::sm90
