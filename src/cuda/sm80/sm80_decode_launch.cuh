// Definitions of the sm80 decode launcher (declared in sm80_launch.h), included by the generated
// instantiation files only: one per (storage type, head-dim bucket) of FMHA_DECODE_HEAD_DIMS.
#pragma once

#include <cstdlib>

#include "common/env_switch.h"
#include "cuda/common/launch.h"
#include "cuda/sm80/sm80_decode_kernel.cuh"
#include "cuda/sm80/sm80_launch.h"

namespace fmha::cuda::sm80 {

// The shape FMHA_DECODE_SHAPE picks (common/env_switch.h), read once: kDecodeShapes' index.
inline int decode_shape_choice() {
  static const int choice = [] {
    const SwitchChoice c = choose_decode_shape(std::getenv(kDecodeShapeVariable));
    report_switch(c.warning);
    return c.index;
  }();
  return choice;
}

// f(shape) for the shape the switch picks at head dim HD (the default at every other head dim).
template <int HD, class F>
auto with_decode_shape(F&& f) {
  if constexpr (HD == 128) {
    constexpr int kWide = 2 * decode::kTileKeys;  // 128 keys a stage
    switch (DecodeShapeName(decode_shape_choice())) {
      case DecodeShapeName::s2: return f(DecodeShape<decode::kTileKeys, 2>{});
      case DecodeShapeName::s4: return f(DecodeShape<decode::kTileKeys, 4>{});
      case DecodeShapeName::k128s2: return f(DecodeShape<kWide, 2>{});
      case DecodeShapeName::k128s3: return f(DecodeShape<kWide, 3>{});
      case DecodeShapeName::l2:
        return f(DecodeShape<decode::kTileKeys, decode_default_stages(HD), DecodeCopy::chunks_l2_prefetch>{});
      case DecodeShapeName::bulk:
        return f(DecodeShape<decode::kTileKeys, decode_default_stages(HD), DecodeCopy::bulk_rows>{});
      case DecodeShapeName::k128bulk: return f(DecodeShape<kWide, 2, DecodeCopy::bulk_rows>{});
      default: break;
    }
  }
  return f(DecodeDefaultShape<HD>{});
}

template <class T, int HD>
size_t decode_shared_bytes() {
  return with_decode_shape<HD>(
      [](auto shape) { return sizeof(typename DecodeTiles<T, HD, decltype(shape)>::SharedStorage); });
}

template <class T, int HD>
Status decode(const DecodeArgs& args, cudaStream_t stream) {
  const dim3 grid(unsigned(args.splits), unsigned(args.kv_heads * args.row_tiles), unsigned(args.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::success();
  return with_decode_shape<HD>([&](auto shape) {
    using Shape = decltype(shape);
    const size_t shared = sizeof(typename DecodeTiles<T, HD, Shape>::SharedStorage);
    auto kernel = decode_kernel<T, HD, Shape>;
    if (Status s = prepare_kernel(kernel, shared, "sm80 decode"); !s.ok()) return s;
    kernel<<<grid, DecodeTiles<T, HD, Shape>::kThreads, shared, stream>>>(args);
    return check_launch("sm80 decode kernel launch");
  });
}

}  // namespace fmha::cuda::sm80
