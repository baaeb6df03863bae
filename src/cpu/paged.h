// The `cpu` backend on a KV cache (Params::block_table / cache_seqlens): decoding-shaped calls
// run by the fast path's dense kernels, one piece of a sequence's keys at a time, the pieces'
// partial results combined with the merge (common/merge.h). Also append_kv on CPU tensors.
#pragma once

#include <cstdint>
#include <functional>

#include "cpu/kernels.h"
#include "fmha/fmha.h"

namespace fmha::cpu {

// Runs `count` dense forward calls as one pool of work (the chosen instruction-set path's
// run_kernels), their key rows where `pages` says (null: their own).
using DenseRunner = std::function<Status(const Params* calls, int64_t count, const KeyPages* pages)>;

// The forward of a validated paged call.
Status run_paged(const Params& params, const DenseRunner& run_dense);

// append_kv on a validated call whose tensors are in CPU memory.
void append_kv(const Params& params);

}  // namespace fmha::cpu
