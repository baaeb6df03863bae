// Host-side pieces every GPU tier shares: the kernels' argument block built from a validated
// Params, the head-dim buckets kernels are compiled for, the backward workspace layout, and the
// device checks (current device, architecture, shared memory).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.h"
#include "cuda/common/args.h"
#include "fmha/fmha.h"

namespace fmha::cuda {

// Kernels are compiled for these head dims; a call runs on the smallest one that holds both
// head_dim and head_dim_v (columns past them are zero-filled and never stored).
inline constexpr int kHeadDimBuckets[] = {32, 64, 96, 128, 192, 256};

// The bucket for max(head_dim, head_dim_v), or 0 when it is above the largest.
int head_dim_bucket(int64_t head_dim, int64_t head_dim_v);

AttentionArgs make_args(const Params& params, const Problem& problem);

// Byte offsets of the backward workspace's parts; total is what workspace_size reports.
struct WorkspaceLayout {
  // Rows are (query row, head) pairs: [B, H, Sq] dense, [H, total_q] packed (args.h); the row
  // statistics pad each head's run to a multiple of kStatRowAlign rows.
  size_t dq_accum = 0;  // [rows, dq_accum_stride] fp32; absent (size 0) when deterministic (but sm90's)
  int64_t dq_accum_stride = 0;  // floats per accumulator row: head_dim, or padded (OrderedDq)
  size_t lse_log2 = 0;  // [padded rows] fp32
  size_t delta = 0;     // [padded rows] fp32
  size_t row_max = 0;      // [padded rows] fp32 (the backward's own softmax statistics: simt, split tf32)
  size_t row_inv_sum = 0;  // [padded rows] fp32
  size_t dq_turns = 0;  // [B, H, ceil(Sq / rows), parts] int32 (OrderedDq); absent otherwise
  size_t total = 0;
  bool has_dq_accum = false;
  bool has_dq_turns = false;
  int64_t dq_turn_tiles = 0;
};
// How a tier's backward forms dQ. Deterministic: rows == 0, by a kernel of its own (no fp32
// accumulator); otherwise by additions into the accumulator in a fixed order, with `parts` turn
// counters per `rows` query rows. accum_align > 1: the accumulator's rows are padded to a multiple
// of accum_align floats covering max(head_dim, head_dim_v) (the tier's padded tile, so that a
// tile's share of a row is one contiguous run), then accum_pad floats more; 1: rows of head_dim
// floats.
struct OrderedDq {
  int rows = 0;
  int parts = 0;
  int accum_align = 1;
  int accum_pad = 0;
};
WorkspaceLayout workspace_layout(const Problem& problem, bool deterministic, OrderedDq ordered = {});

// The workspace a call of a tier needs: the backward's layout, nothing for the forward.
Status workspace_size(const Params& params, Direction direction, size_t* bytes, OrderedDq ordered);
// The same for the tiers whose deterministic dQ has a kernel of its own.
Status workspace_size(const Params& params, Direction direction, size_t* bytes);

// Fills the workspace pointers of `args`, or says why the caller's workspace does not do.
Status bind_workspace(const Params& params, const WorkspaceLayout& layout, AttentionArgs* args);

struct DeviceProps {
  int ordinal = 0;
  int arch = 0;                   // 80 for sm_80
  size_t max_shared_per_block = 0;  // opt-in limit for dynamic shared memory
  int multiprocessors = 0;
};
// The current device's properties; an error if any tensor of the call is on another device.
Status current_device(const Params& params, Direction direction, DeviceProps* props);

// Grid limits: heads and batch ride on gridDim.y / gridDim.z.
Status check_grid_limits(const Problem& problem);

Status unsupported(const std::string& message);

}  // namespace fmha::cuda
