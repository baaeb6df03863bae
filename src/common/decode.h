// The host-side plan of a GPU decode call (a few query rows against a long KV cache): which calls
// take the decode kernel, how many CTAs split each sequence's keys (split-KV), and the workspace
// their partial results need. Plain C++ so that the CPU build tests it; the sm80 tier's decode
// kernel (src/cuda/sm80/sm80_decode_kernel.cuh) is its only user at run time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/paged.h"
#include "common/problem.h"
#include "fmha/fmha.h"

namespace fmha::decode {

// The decode kernel's tile: kTileRows packed query rows (seqlen_q × group, the query heads of one
// KV head stacked in M), kTileKeys keys per pipeline stage (16 per warp).
inline constexpr int kTileRows = 16;
inline constexpr int kTileKeys = 64;
// Queries per sequence up to which a dense call counts as decoding (speculative decoding's range).
inline constexpr int64_t kMaxSeqlenQ = 16;
// A split never gets fewer keys than this from the heuristic: below it the fixed cost of a CTA
// (its query tile, its share of the merge) outweighs its loads.
inline constexpr int64_t kMinKeysPerSplit = 4 * kTileKeys;
// The most splits of one sequence (heuristic or Params::num_splits).
inline constexpr int64_t kMaxSplits = 256;
// CTAs per SM the split heuristic aims for: two waves of single-CTA SMs keep enough loads in flight
// to cover DRAM latency on sm_80 and sm_90.
inline constexpr int64_t kBlocksPerSm = 2;
inline constexpr size_t kWorkspaceAlign = 256;

// Whether a call is of the decode kernel's shape: a KV cache (paged or contiguous), or a dense
// forward with at most kMaxSeqlenQ queries per sequence; fp16 or bf16 storage.
inline bool is_decode_shape(const Params& p, Direction direction) {
  if (direction != Direction::forward || p.cu_seqlens_q.defined() || p.cu_seqlens_k.defined()) return false;
  if (p.q.dtype != DType::fp16 && p.q.dtype != DType::bf16) return false;
  return is_paged(p) || (p.q.rank == 4 && p.q.shape[1] <= kMaxSeqlenQ);
}

// Packed query-row tiles per (sequence, KV head): seqlen_q · group rows, kTileRows at a time.
inline int64_t row_tiles(int64_t seqlen_q, int64_t group) {
  return (seqlen_q * group + kTileRows - 1) / kTileRows;
}

// A split count is taken over a smaller one only when it fills the GPU's CTA slots by more than
// this fraction (relative) better: each split adds a CTA's fixed cost and partials to merge.
inline constexpr double kSplitGain = 0.05;

// How well `ctas` CTAs fill whole waves of `slots` CTA slots (1: the last wave is full).
inline double wave_efficiency(int64_t ctas, int64_t slots) {
  const int64_t waves = (ctas + slots - 1) / slots;
  return waves > 0 ? double(ctas) / double(waves * slots) : 0.0;
}

// Splits of each sequence's keys for `blocks` CTAs without splitting (batch · kv_heads · row
// tiles) on a GPU of `sm_count` SMs, where a sequence has at most `max_keys` keys. One split when
// the CTAs fill the GPU's kBlocksPerSm slots per SM; otherwise the count up to the one that fills
// them all, no more than leave each split kMinKeysPerSplit keys and at most kMaxSplits, whose
// waves are fullest (the smallest such count within kSplitGain of the best: 128 CTAs on 264
// slots take 2 splits, one nearly full wave, rather than 3, one and a half). `requested` > 0
// (Params::num_splits) overrides the heuristic (up to kMaxSplits).
inline int64_t choose_splits(int64_t blocks, int64_t max_keys, int64_t sm_count, int64_t requested = 0) {
  if (requested > 0) return std::min(requested, kMaxSplits);
  const int64_t slots = std::max<int64_t>(1, sm_count) * kBlocksPerSm;
  if (blocks <= 0 || blocks >= slots) return 1;
  const int64_t fill = (slots + blocks - 1) / blocks;
  const int64_t by_keys = std::max<int64_t>(1, (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  const int64_t most = std::max<int64_t>(1, std::min({fill, by_keys, kMaxSplits}));
  double best = 0.0;
  for (int64_t s = 1; s <= most; ++s) best = std::max(best, wave_efficiency(blocks * s, slots));
  for (int64_t s = 1; s <= most; ++s)
    if (wave_efficiency(blocks * s, slots) >= best * (1.0 - kSplitGain)) return s;
  return most;
}

// The split partials in the workspace: fp32 outputs [splits, B, Sq, H, Dv] and LSEs
// [splits, B, H, Sq], each part on a kWorkspaceAlign boundary. None for one split (the kernel
// writes o and lse itself).
struct Workspace {
  size_t part_o = 0, part_lse = 0, total = 0;
};
inline Workspace workspace(int64_t splits, int64_t batch, int64_t seqlen_q, int64_t heads, int64_t head_dim_v) {
  Workspace w;
  if (splits <= 1) return w;
  auto align = [](size_t x) { return (x + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; };
  const size_t rows = size_t(splits) * size_t(batch) * size_t(seqlen_q) * size_t(heads);
  w.part_o = 0;
  w.part_lse = align(rows * size_t(head_dim_v) * sizeof(float));
  w.total = rows == 0 ? 0 : align(w.part_lse + rows * sizeof(float));
  return w;
}

// The decode kernel's tuned variants (include/fmha/tune.h): the split count of choose_splits
// (the default), half of it, twice it (at most kMaxSplits), or no split. Params::num_splits, when
// set, overrides every variant.
enum class SplitVariant : int { heuristic, half, twice, unsplit };
inline constexpr int kSplitVariants = 4;
inline constexpr const char* kSplitVariantNames[kSplitVariants] = {"decode", "decode-half", "decode-twice",
                                                                   "decode-unsplit"};
// The variant a name denotes; false for a name that is none of them.
inline bool split_variant_of(const std::string& name, SplitVariant* out) {
  for (int i = 0; i < kSplitVariants; ++i)
    if (name == kSplitVariantNames[i]) {
      *out = SplitVariant(i);
      return true;
    }
  return false;
}
inline int64_t apply_split_variant(int64_t splits, SplitVariant variant) {
  switch (variant) {
    case SplitVariant::heuristic: return splits;
    case SplitVariant::half: return std::max<int64_t>(1, splits / 2);
    case SplitVariant::twice: return std::min(2 * splits, kMaxSplits);
    case SplitVariant::unsplit: return 1;
  }
  return splits;
}

// The whole plan of a validated decode-shaped call on a GPU of `sm_count` SMs.
struct Plan {
  int64_t row_tiles = 0;  // per (sequence, KV head)
  int64_t splits = 1;
  int64_t max_keys = 0;   // a sequence's capacity: every key any sequence may have
  Workspace workspace;
};
inline Plan plan(const Params& p, int64_t sm_count, SplitVariant variant = SplitVariant::heuristic) {
  const Problem s = Problem::of(p);
  Plan plan;
  plan.row_tiles = row_tiles(s.seqlen_q, s.group);
  // A cache's lengths may sit in device memory: the capacity bounds them without reading them.
  plan.max_keys = is_paged(p) ? PagedCache::of(p).capacity() : s.seqlen_k;
  plan.splits = choose_splits(s.batch * s.kv_heads * plan.row_tiles, plan.max_keys, sm_count, p.num_splits);
  if (p.num_splits <= 0) plan.splits = apply_split_variant(plan.splits, variant);
  plan.workspace = workspace(plan.splits, s.batch, s.seqlen_q, s.heads, s.head_dim_v);
  return plan;
}

}  // namespace fmha::decode
