// The entry point of each compilation of the fast CPU path (src/cpu/fast_attention.cpp), one
// namespace per instruction-set path (src/cpu/isa.h). Which of them a build has is told by the
// FMHA_CPU_HAS_<PATH> definitions that CMake gives src/cpu/dispatch.cpp.
#pragma once

#include <cstdint>

#include "cpu/cpu_config.h"
#include "fmha/fmha.h"

namespace fmha::cpu {

// Where a forward call's key rows lie when they are not the rows of its k and v as shaped: a
// piece of a paged call (src/cpu/paged.cpp), whose k and v are [1, n, Hkv, dim] views at the page
// pool's base with the pool's row and head strides, and whose row r is key first_key + r of one
// sequence, in page table[((first_key + r) / page_size) · table_stride] at row
// (first_key + r) % page_size. The table's entries are checked on the host (validate()) and
// clamped into the pool as common/paged.h clamps them.
struct KeyPages {
  const int32_t* table = nullptr;  // the sequence's block-table row
  int64_t table_stride = 1, page_size = 1, first_key = 0, num_pages = 1;
  int64_t k_page_stride = 0, v_page_stride = 0;  // elements from one page to the next in k, in v
};

// Each path runs `count` dense calls as one pool of work: a dense call alone, or the sequences of
// a variable-length call (common/varlen.h) together. The calls share their options and threads.
// `pages` (forward only; null: none): per call, where its key rows lie (KeyPages; a null table
// there: k's and v's own rows).

namespace portable {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages = nullptr);
}
namespace avx2 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages = nullptr);
}
namespace avx512 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages = nullptr);
}
namespace avx512bf16 {
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages = nullptr);
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
Status run_kernels(const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages = nullptr);
}

}  // namespace fmha::cpu
