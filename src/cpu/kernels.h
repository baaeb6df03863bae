// The entry point of each compilation of the fast CPU path (src/cpu/fast_attention.cpp), one
// namespace per instruction-set path (src/cpu/isa.h). Which of them a build has is told by the
// FMHA_CPU_HAS_<PATH> definitions that CMake gives src/cpu/dispatch.cpp.
#pragma once

#include <cstdint>

#include "cpu/cpu_config.h"
#include "fmha/fmha.h"

namespace fmha::cpu {

// Each path runs `count` dense calls as one pool of work: a dense call alone, or the sequences of
// a variable-length call (common/varlen.h) together. The calls share their options and threads.

namespace portable {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config);
}
namespace avx2 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config);
}
namespace avx512 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config);
}
namespace avx512bf16 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config);
// Multiply-adds per second of this core's bf16 dot product (vdpbf16ps, 32 a 512-bit instruction)
// and of its fp32 FMA (vfmadd, 16), each on enough independent accumulators to run at its
// throughput, best of three rounds of 240,000 instructions each on the calling thread (a few
// million cycles in all).
struct DotAndFmaRates {
  double dot = 0.0, fma = 0.0;  // multiply-adds per second
};
DotAndFmaRates measure_dot_and_fma();
}
namespace amxbf16 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config);
}

}  // namespace fmha::cpu
