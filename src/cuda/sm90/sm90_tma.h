// Host side of the sm90 tier's TMA: the rules a tensor must meet for the copy engine, and the
// encoding of a [batch, seqlen, heads, head_dim] view into a tensor map of 64-column boxes with
// the 128-byte swizzle the wgmma operands use. The driver's encode function is reached through
// the CUDA runtime (cudaGetDriverEntryPointByVersion), so nothing but the runtime is linked.
#pragma once

#include <cuda.h>

#include "fmha/fmha.h"

namespace fmha::cuda::sm90 {

// Whether `t` (named `name` in messages) meets TMA's rules: a 16-byte aligned base, and strides
// of whole 16-byte units, non-zero and below 2^40 bytes, on every dimension longer than 1.
Status check_tma_view(const Tensor& t, const char* name);

// Both take dense [B, S, H, D] views and packed [total, H, D] ones, the latter as [1, total, H, D]
// (a packed kernel addresses a sequence's rows from its first row in the packed tensor).
// A tiled map over `t` ([B, S, H, D]) with boxes of box_cols × box_rows (columns × sequence rows),
// SWIZZLE_128B, zero fill outside the tensor. A dimension of length 0 is encoded as length 1 (the
// kernels never read a map of an empty tensor, but its address must still be valid).
Status encode_tile_map(CUtensorMap* map, const Tensor& t, int box_cols, int box_rows, const char* name);

}  // namespace fmha::cuda::sm90
