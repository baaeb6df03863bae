// The sm90 kernels' walks in L2 sections. Plain C++ (host and device).
#pragma once

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

}  // namespace fmha::cuda::sm90
