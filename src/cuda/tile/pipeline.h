// The position in a STAGES-deep ring of shared-memory buffers: which buffer, and which phase
// parity its mbarriers are in (tma.cuh). Producer and consumers walk the same sequence, so the
// position is a counter both keep. Host and device code (the host side is unit-tested).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fmha::cuda::tile {

template <int STAGES>
struct PipelineState {
  int index = 0;
  uint32_t phase = 0;
  __host__ __device__ __forceinline__ void advance() {
    if (++index == STAGES) index = 0, phase ^= 1;
  }
};

}  // namespace fmha::cuda::tile
