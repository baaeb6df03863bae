// Host-side pieces shared by the GPU tiers (see host.h).
#include "cuda/common/host.h"

#include <algorithm>

namespace fmha::cuda {
namespace {

// Dense [B, S, H, D] views as they are. Packed [total, H, D] ones take a sequence's first row
// where dense ones take the batch index (SequenceStart), so their batch stride is the row stride.
View4 view(const Tensor& t) {
  View4 v;
  v.data = t.data;
  if (t.rank == 4) {
    v.batch_stride = t.stride[0];
    v.seq_stride = t.stride[1];
    v.head_stride = t.stride[2];
  } else if (t.rank == 3) {
    v.batch_stride = t.stride[0];
    v.seq_stride = t.stride[0];
    v.head_stride = t.stride[1];
  }
  return v;
}

constexpr size_t kWorkspaceAlign = 256;  // bytes: every part starts on a fresh cache sector group

size_t align_up(size_t x) { return (x + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

int64_t stat_rows(int64_t seqlen_q) { return (seqlen_q + kStatRowAlign - 1) / kStatRowAlign * kStatRowAlign; }

}  // namespace

Status unsupported(const std::string& message) { return {Code::unsupported, message}; }

int head_dim_bucket(int64_t head_dim, int64_t head_dim_v) {
  const int64_t need = std::max(head_dim, head_dim_v);
  for (int bucket : kHeadDimBuckets)
    if (need <= bucket) return bucket;
  return 0;
}

AttentionArgs make_args(const Params& p, const Problem& s) {
  AttentionArgs a;
  a.q = view(p.q);
  a.k = view(p.k);
  a.v = view(p.v);
  a.o = view(p.o);
  a.dout = view(p.dout);
  a.dq = view(p.dq);
  a.dk = view(p.dk);
  a.dv = view(p.dv);
  if (p.lse.defined() && s.packed) {  // [H, total_q]; the sequence's first row in place of the batch
    a.lse = static_cast<float*>(p.lse.data);
    a.lse_batch_stride = p.lse.stride[1];
    a.lse_head_stride = p.lse.stride[0];
    a.lse_seq_stride = p.lse.stride[1];
  } else if (p.lse.defined()) {
    a.lse = static_cast<float*>(p.lse.data);
    a.lse_batch_stride = p.lse.stride[0];
    a.lse_head_stride = p.lse.stride[1];
    a.lse_seq_stride = p.lse.stride[2];
  }
  a.batch = int(s.batch);
  a.heads = int(s.heads);
  a.kv_heads = int(s.kv_heads);
  a.group = int(s.group);
  a.head_dim = int(s.head_dim);
  a.head_dim_v = int(s.head_dim_v);
  a.dq_accum_stride = a.head_dim;  // the workspace binding sets a tier's own
  // Packed calls: no sequence can be longer than the packed tensors (sequence() clamps it
  // so), which bounds the grids however large a max_seqlen the caller passes.
  a.seqlen_q = s.packed ? std::min(s.seqlen_q, s.total_q) : s.seqlen_q;
  a.seqlen_k = s.packed ? std::min(s.seqlen_k, s.total_k) : s.seqlen_k;
  a.scale = s.scale;
  a.scale_log2 = s.scale_log2;
  a.mask = s.mask;
  // Workspace rows (args.h): dense [B, H, Sq], packed [H, total_q].
  a.row_start_stride = s.packed ? 1 : s.heads * s.seqlen_q;
  a.row_head_stride = s.packed ? s.total_q : s.seqlen_q;
  a.stat_rows = stat_rows(s.packed ? s.total_q : s.seqlen_q);
  a.stat_start_stride = s.packed ? 1 : s.heads * a.stat_rows;
  if (s.packed) {
    a.packed.cu_seqlens_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
    a.packed.cu_seqlens_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
    a.packed.stride_q = p.cu_seqlens_q.stride[0];
    a.packed.stride_k = p.cu_seqlens_k.stride[0];
    a.packed.total_q = s.total_q;
    a.packed.total_k = s.total_k;
    a.packed.q_offset = p.q_offset;
    a.packed.bottom_right = p.causal == Causal::bottom_right;
  }
  return a;
}

WorkspaceLayout workspace_layout(const Problem& s, bool deterministic, OrderedDq ordered) {
  WorkspaceLayout w;
  // One entry per (query row, head): B · Sq · H dense, total_q · H packed (not batch ·
  // max_seqlen_q, which can be far more, or less where the tables break their promise).
  const size_t rows = size_t(s.total_q) * size_t(s.heads);
  const int64_t stat_run = stat_rows(s.packed ? s.total_q : s.seqlen_q);
  const size_t padded_rows = size_t(s.packed ? 1 : s.batch) * size_t(s.heads) * size_t(stat_run);
  size_t at = 0;
  w.has_dq_accum = !deterministic || ordered.rows > 0;
  w.dq_accum_stride = s.head_dim;
  if (ordered.accum_align > 1) {
    const int64_t widest = std::max(s.head_dim, s.head_dim_v);
    w.dq_accum_stride =
        (widest + ordered.accum_align - 1) / ordered.accum_align * ordered.accum_align + ordered.accum_pad;
  }
  if (w.has_dq_accum) {
    w.dq_accum = at;
    at = align_up(at + rows * size_t(w.dq_accum_stride) * sizeof(float));
  }
  w.lse_log2 = at;
  at = align_up(at + padded_rows * sizeof(float));
  w.delta = at;
  at = align_up(at + padded_rows * sizeof(float));
  w.row_max = at;
  at = align_up(at + padded_rows * sizeof(float));
  w.row_inv_sum = at;
  at = align_up(at + padded_rows * sizeof(float));
  if (deterministic && ordered.rows > 0) {
    w.has_dq_turns = true;
    w.dq_turn_tiles = (s.seqlen_q + ordered.rows - 1) / ordered.rows;
    w.dq_turns = at;
    at = align_up(at + size_t(s.batch) * size_t(s.heads) * size_t(w.dq_turn_tiles) * size_t(ordered.parts) *
                           sizeof(int32_t));
  }
  w.total = rows == 0 ? 0 : at;
  return w;
}

Status bind_workspace(const Params& p, const WorkspaceLayout& w, AttentionArgs* a) {
  if (w.total == 0) return Status::success();
  if (p.workspace == nullptr)
    return {Code::invalid_argument, "workspace: the backward needs " + std::to_string(w.total) +
                                        " bytes of device workspace (see workspace_size), got none"};
  if (p.workspace_bytes < w.total)
    return {Code::invalid_argument, "workspace: " + std::to_string(p.workspace_bytes) + " bytes given, " +
                                        std::to_string(w.total) + " needed (see workspace_size)"};
  if (reinterpret_cast<uintptr_t>(p.workspace) % kWorkspaceAlign != 0)
    return {Code::invalid_argument, "workspace: pointer must be aligned to " + std::to_string(kWorkspaceAlign) +
                                        " bytes (cudaMalloc's alignment)"};
  char* base = static_cast<char*>(p.workspace);
  a->dq_accum = w.has_dq_accum ? reinterpret_cast<float*>(base + w.dq_accum) : nullptr;
  a->dq_accum_stride = w.dq_accum_stride;
  a->lse_log2 = reinterpret_cast<float*>(base + w.lse_log2);
  a->delta = reinterpret_cast<float*>(base + w.delta);
  a->row_max = reinterpret_cast<float*>(base + w.row_max);
  a->row_inv_sum = reinterpret_cast<float*>(base + w.row_inv_sum);
  a->dq_turns = w.has_dq_turns ? reinterpret_cast<int*>(base + w.dq_turns) : nullptr;
  a->dq_turn_tiles = w.dq_turn_tiles;
  return Status::success();
}

Status workspace_size(const Params& p, Direction direction, size_t* bytes, OrderedDq ordered) {
  *bytes = direction == Direction::backward ? workspace_layout(Problem::of(p), p.deterministic, ordered).total : 0;
  return Status::success();
}

Status workspace_size(const Params& p, Direction direction, size_t* bytes) {
  return workspace_size(p, direction, bytes, OrderedDq{});
}

Status current_device(const Params& p, Direction direction, DeviceProps* props) {
  int ordinal = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&ordinal) != cudaSuccess) {
    cudaGetLastError();
    return {Code::no_device, "q: no usable CUDA device (none found, or no driver)"};
  }
  const struct {
    const char* name;
    const Tensor* t;
  } tensors[] = {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"o", &p.o}, {"lse", &p.lse},
                 {"cu_seqlens_q", &p.cu_seqlens_q}, {"cu_seqlens_k", &p.cu_seqlens_k},
                 {"block_table", &p.block_table}, {"cache_seqlens", &p.cache_seqlens},
                 {"dout", &p.dout}, {"dq", &p.dq}, {"dk", &p.dk}, {"dv", &p.dv}};
  for (const auto& named : tensors) {
    if (!named.t->defined()) continue;
    const bool forward_only = named.t == &p.o || named.t == &p.lse || named.t == &p.q || named.t == &p.k ||
                              named.t == &p.v || named.t == &p.cu_seqlens_q || named.t == &p.cu_seqlens_k ||
                              named.t == &p.block_table || named.t == &p.cache_seqlens;
    if (direction == Direction::forward && !forward_only) continue;
    if (named.t->device.index != ordinal)
      return unsupported(std::string(named.name) + ": is on cuda:" + std::to_string(named.t->device.index) +
                         " but the current device is cuda:" + std::to_string(ordinal) +
                         "; make that device current (cudaSetDevice) before the call");
  }
  int major = 0, minor = 0, shared = 0, sms = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess) {
    const cudaError_t err = cudaGetLastError();
    return {Code::cuda_error, std::string("device attributes of cuda:") + std::to_string(ordinal) + ": " +
                                  cudaGetErrorString(err)};
  }
  props->ordinal = ordinal;
  props->arch = major * 10 + minor;
  props->max_shared_per_block = size_t(shared);
  props->multiprocessors = sms;
  return Status::success();
}

Status check_grid_limits(const Problem& s) {
  constexpr int64_t kMaxGridYZ = 65535;
  if (s.heads > kMaxGridYZ) return unsupported("q: heads " + std::to_string(s.heads) + " is above 65535");
  if (s.batch > kMaxGridYZ && s.packed)
    return unsupported("cu_seqlens_q: " + std::to_string(s.batch) + " sequences are above 65535");
  if (s.batch > kMaxGridYZ) return unsupported("q: batch " + std::to_string(s.batch) + " is above 65535");
  return Status::success();
}

}  // namespace fmha::cuda
