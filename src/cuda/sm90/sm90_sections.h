// The sm90 kernels' walks in L2 sections. Plain C++ (host and device).
#pragma once

#include <cstdlib>
#include <string>

#include "fmha/mask.h"

namespace fmha::cuda::sm90 {

// Position `index` of a walk over items × units that takes the units in sections of `section`:
// inside a section its units vary fastest, then the items; the last section may be narrower.
// The forward's tile scheduler walks (query tile, head) so, the backward's blocks (key tile, pair).
struct SectionedIndex {
  int item, unit;
};
FMHA_HOST_DEVICE SectionedIndex sectioned_index(int index, int items, int units, int section) {
  const int per_section = items * section;  // at most INT32_MAX (the callers' bounds)
  const int s = index / per_section;
  const int in_section = index - s * per_section;
  const int first = s * section;
  const int width = units - first < section ? units - first : section;
  const int item = in_section / width;
  return {item, first + (in_section - item * width)};
}

// (Batch, head) pairs per section of the forward's walk. `fit`: as many pairs as keep their K and
// V (kv_bytes a KV head) within `budget`, a power of two of KV heads. Where one head's query tiles
// (m_blocks) fit in a wave of the grid's blocks, no more pairs than a wave covers: the wave then
// holds every query tile of its heads at once, and each head's K and V come from memory once.
// (Wider sections put one query tile of many heads in a wave, and the K/V of the first tiles have
// left the L2 when the next wave reads them again.) Calls that walk their query tiles longest
// first (causal, windows) keep the wide sections once a head has more than kWaveSectionTiles
// query tiles: the wide walk's spread of lengths then balances the grid's tail better than the
// L2 saves (docs/PERF.md run 52). Whole GQA groups; from one group to `pairs`.
inline constexpr int kWaveSectionTiles = 8;
FMHA_HOST_DEVICE int forward_section(double kv_bytes, double budget, int m_blocks, int grid, int group, int64_t pairs,
                                     bool longest_first) {
  int64_t kv_heads = kv_bytes > 0 ? int64_t(budget / kv_bytes) : 1;
  if (kv_heads < 1) kv_heads = 1;
  int64_t fit = 1;
  while (fit * 2 <= kv_heads) fit *= 2;
  fit *= group;
  if (m_blocks > 0 && m_blocks <= grid && (!longest_first || m_blocks <= kWaveSectionTiles)) {
    int64_t wave = grid / (int64_t(m_blocks) * group) * group;
    if (wave < group) wave = group;
    if (wave < fit) fit = wave;
  }
  return int(fit < pairs ? fit : pairs);
}

// An L2 section budget in bytes from the text of FMHA_SM90_L2_SECTION_MB (`mb`, null when unset):
// a positive number of MB, else `fallback` (the tier's budget); text that is set but not a
// positive number also leaves a line for stderr in `warning` (when given). Host only.
inline double l2_section_budget(const char* mb, double fallback, std::string* warning = nullptr) {
  if (mb == nullptr || *mb == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(mb, &end);
  if (value > 0.0 && end != mb && *end == '\0') return value * 1024 * 1024;
  if (warning)
    *warning = std::string("FMHA_SM90_L2_SECTION_MB=") + mb + " is not a positive number of MB; using the default";
  return fallback;
}

}  // namespace fmha::cuda::sm90
