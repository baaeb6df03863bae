// Argument checks shared by every backend. Each failure names the argument and says what was
// expected; nothing is written before all of them pass.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends.h"
#include "common/decode.h"
#include "common/paged.h"

namespace fmha::detail {
namespace {

// Plain string building, no iostreams: the Python extension links libstdc++ statically, and its
// stream locale facets were seen to crash there.
std::string shape_string(const Tensor& t) {
  std::string out = "[";
  for (int d = 0; d < t.rank; ++d) out += (d ? ", " : "") + std::to_string(t.shape[d]);
  return out + "]";
}

Status invalid(const std::string& message) { return {Code::invalid_argument, message}; }

bool valid_dtype(DType d) { return d == DType::fp32 || d == DType::fp16 || d == DType::bf16; }

// Rank, sizes, strides, pointer and alignment of one view. `dims` names each dimension.
Status check_view(const char* name, const Tensor& t, int rank, const char* const* dims) {
  if (!t.defined()) return invalid(std::string(name) + ": required tensor is missing (rank 0)");
  if (t.rank != rank) {
    std::string expected = "[";
    for (int d = 0; d < rank; ++d) expected += std::string(d ? ", " : "") + dims[d];
    return invalid(std::string(name) + ": expected a " + std::to_string(rank) + "-d tensor " + expected + "]" +
                   ", got rank " + std::to_string(t.rank));
  }
  if (!valid_dtype(t.dtype)) return invalid(std::string(name) + ": dtype must be fp32, fp16 or bf16");
  if (t.device.type != DeviceType::cpu && t.device.type != DeviceType::cuda)
    return invalid(std::string(name) + ": unknown device type");
  if (t.device.index < 0) return invalid(std::string(name) + ": device index must be >= 0");
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 0)
      return invalid(std::string(name) + ": " + dims[d] + " is " + std::to_string(t.shape[d]) +
                     ", expected a size >= 0");
    if (t.stride[d] < 0)
      return invalid(std::string(name) + ": stride of " + dims[d] + " is " + std::to_string(t.stride[d]) +
                     ", expected >= 0");
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    return invalid(std::string(name) + ": the last dimension (" + dims[rank - 1] + ") must be contiguous " +
                   "(stride 1), got stride " + std::to_string(t.stride[rank - 1]));
  if (t.numel() > 0) {
    if (t.data == nullptr) return invalid(std::string(name) + ": data pointer is null for a non-empty tensor");
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
      return invalid(std::string(name) + ": data pointer is not aligned to its " + std::to_string(dtype_size(t.dtype)) +
                     "-byte " + to_string(t.dtype) + " elements");
  }
  return Status::success();
}

const char* const kQDims[] = {"batch", "seqlen_q", "heads", "head_dim"};
const char* const kODims[] = {"batch", "seqlen_q", "heads", "head_dim_v"};
const char* const kKDims[] = {"batch", "seqlen_k", "kv_heads", "head_dim"};
const char* const kVDims[] = {"batch", "seqlen_k", "kv_heads", "head_dim_v"};
const char* const kLseDims[] = {"batch", "heads", "seqlen_q"};
// The packed (variable-length) layout.
const char* const kPackedQDims[] = {"total_q", "heads", "head_dim"};
const char* const kPackedODims[] = {"total_q", "heads", "head_dim_v"};
const char* const kPackedKDims[] = {"total_k", "kv_heads", "head_dim"};
const char* const kPackedVDims[] = {"total_k", "kv_heads", "head_dim_v"};
const char* const kPackedLseDims[] = {"heads", "total_q"};
// A paged KV cache, and the contiguous cache with per-sequence lengths (common/paged.h).
const char* const kPagedKDims[] = {"num_pages", "page_size", "kv_heads", "head_dim"};
const char* const kPagedVDims[] = {"num_pages", "page_size", "kv_heads", "head_dim_v"};
const char* const kCacheKDims[] = {"batch", "capacity", "kv_heads", "head_dim"};
const char* const kCacheVDims[] = {"batch", "capacity", "kv_heads", "head_dim_v"};
const char* const kNewKDims[] = {"batch", "seqlen_new", "kv_heads", "head_dim"};
const char* const kNewVDims[] = {"batch", "seqlen_new", "kv_heads", "head_dim_v"};

// `t` must have exactly `expected` sizes; `like` names where they come from.
Status check_shape(const char* name, const Tensor& t, const int64_t* expected, const char* const* dims,
                   const char* like) {
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] != expected[d])
      return invalid(std::string(name) + ": " + dims[d] + " is " + std::to_string(t.shape[d]) + ", expected " +
                     std::to_string(expected[d]) + " (" + like + "); shape is " + shape_string(t));
  return Status::success();
}

Status check_same_kind(const char* name, const Tensor& t, const Tensor& q, bool check_dtype) {
  if (check_dtype && t.dtype != q.dtype)
    return invalid(std::string(name) + ": dtype is " + to_string(t.dtype) + ", expected " + to_string(q.dtype) +
                   " like q");
  if (!(t.device == q.device))
    return invalid(std::string(name) + ": is on a different device than q (" +
                   (t.device.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(t.device.index)) +
                   " vs " +
                   (q.device.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(q.device.index)) +
                   ")");
  return Status::success();
}

#define FMHA_TRY(expr)                \
  do {                                \
    Status status_ = (expr);          \
    if (!status_.ok()) return status_; \
  } while (0)

// The sequence tables of a varlen call: shapes always; contents when they are in CPU memory.
Status check_tables(const Params& p) {
  if (!p.cu_seqlens_q.defined())
    return invalid("cu_seqlens_q: required with cu_seqlens_k (a variable-length call needs both tables)");
  if (!p.cu_seqlens_k.defined())
    return invalid("cu_seqlens_k: required with cu_seqlens_q (a variable-length call needs both tables)");
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"cu_seqlens_q", p.cu_seqlens_q},
                                std::pair<const char*, const Tensor&>{"cu_seqlens_k", p.cu_seqlens_k}}) {
    if (t.rank != 1)
      return invalid(std::string(name) + ": expected a 1-d tensor [batch + 1], got rank " + std::to_string(t.rank));
    if (t.dtype != DType::int32)
      return invalid(std::string(name) + ": dtype must be int32, got " + to_string(t.dtype));
    if (t.shape[0] < 1)
      return invalid(std::string(name) + ": has " + std::to_string(t.shape[0]) +
                     " entries, expected batch + 1 >= 1 (the first entry is 0)");
    if (t.stride[0] < 0)
      return invalid(std::string(name) + ": stride is " + std::to_string(t.stride[0]) + ", expected >= 0");
    if (t.data == nullptr) return invalid(std::string(name) + ": data pointer is null");
    if (reinterpret_cast<uintptr_t>(t.data) % sizeof(int32_t) != 0)
      return invalid(std::string(name) + ": data pointer is not aligned to its 4-byte int32 elements");
    FMHA_TRY(check_same_kind(name, t, p.q, false));
  }
  if (p.cu_seqlens_k.shape[0] != p.cu_seqlens_q.shape[0])
    return invalid("cu_seqlens_k: has " + std::to_string(p.cu_seqlens_k.shape[0]) + " entries, expected " +
                   std::to_string(p.cu_seqlens_q.shape[0]) + " (batch + 1, like cu_seqlens_q)");
  if (p.max_seqlen_q < 0) return invalid("max_seqlen_q: is " + std::to_string(p.max_seqlen_q) + ", expected >= 0");
  if (p.max_seqlen_k < 0) return invalid("max_seqlen_k: is " + std::to_string(p.max_seqlen_k) + ", expected >= 0");
  if (p.q.device.type != DeviceType::cpu) return Status::success();  // device tables: the caller's promise

  struct Table {
    const char* name;
    const Tensor& t;
    int64_t total;
    const char* total_name;
    int64_t max_seqlen;
    const char* max_name;
  };
  for (const Table& table : {Table{"cu_seqlens_q", p.cu_seqlens_q, p.q.shape[0], "total_q of q", p.max_seqlen_q,
                                   "max_seqlen_q"},
                             Table{"cu_seqlens_k", p.cu_seqlens_k, p.k.shape[0], "total_k of k", p.max_seqlen_k,
                                   "max_seqlen_k"}}) {
    const auto* cu = static_cast<const int32_t*>(table.t.data);
    const int64_t entries = table.t.shape[0], stride = table.t.stride[0];
    if (cu[0] != 0)
      return invalid(std::string(table.name) + "[0]: is " + std::to_string(cu[0]) + ", expected 0");
    for (int64_t b = 0; b + 1 < entries; ++b) {
      const int64_t begin = cu[b * stride], end = cu[(b + 1) * stride];
      if (end < begin)
        return invalid(std::string(table.name) + ": not non-decreasing: entry " + std::to_string(b + 1) + " is " +
                       std::to_string(end) + " after " + std::to_string(begin) + " (sequence " + std::to_string(b) +
                       " would have negative length)");
      if (end - begin > table.max_seqlen)
        return invalid(std::string(table.name) + ": sequence " + std::to_string(b) + " has length " +
                       std::to_string(end - begin) + ", above " + table.max_name + " = " +
                       std::to_string(table.max_seqlen));
    }
    const int64_t last = cu[(entries - 1) * stride];
    if (last != table.total)
      return invalid(std::string(table.name) + ": last entry is " + std::to_string(last) + ", expected " +
                     std::to_string(table.total) + " (" + table.total_name + ")");
  }
  return Status::success();
}

// One int32 table of a paged cache: rank, dtype, sizes, strides, pointer, alignment and device.
Status check_int_table(const char* name, const Tensor& t, int rank, const char* shape_text, const int64_t* expected,
                       const char* const* dims, const char* like, const Tensor& device_of, const char* device_name) {
  if (!t.defined()) return invalid(std::string(name) + ": required tensor is missing (rank 0)");
  if (t.rank != rank)
    return invalid(std::string(name) + ": expected a " + std::to_string(rank) + "-d tensor " + shape_text +
                   ", got rank " + std::to_string(t.rank));
  if (t.dtype != DType::int32) return invalid(std::string(name) + ": dtype must be int32, got " + to_string(t.dtype));
  for (int d = 0; d < rank; ++d) {
    if (expected[d] >= 0 && t.shape[d] != expected[d])
      return invalid(std::string(name) + ": " + dims[d] + " is " + std::to_string(t.shape[d]) + ", expected " +
                     std::to_string(expected[d]) + " (" + like + "); shape is " + shape_string(t));
    if (t.shape[d] < 0)
      return invalid(std::string(name) + ": " + dims[d] + " is " + std::to_string(t.shape[d]) + ", expected >= 0");
    if (t.stride[d] < 0)
      return invalid(std::string(name) + ": stride of " + dims[d] + " is " + std::to_string(t.stride[d]) +
                     ", expected >= 0");
  }
  if (t.numel() > 0) {
    if (t.data == nullptr) return invalid(std::string(name) + ": data pointer is null for a non-empty tensor");
    if (reinterpret_cast<uintptr_t>(t.data) % sizeof(int32_t) != 0)
      return invalid(std::string(name) + ": data pointer is not aligned to its 4-byte int32 elements");
  }
  if (!(t.device == device_of.device))
    return invalid(std::string(name) + ": is on a different device than " + device_name);
  return Status::success();
}

// The tables of a paged (or contiguous, lengths-only) KV cache whose pages are k / v, for a batch
// of `batch` sequences: shapes always; contents when they are in CPU memory. `append` > 0 checks
// for append_kv: the rows cache_seqlens[b] ... + append - 1 are written, so they must fit and their
// pages must be listed (and no two sequences may write one row); otherwise the rows 0 ...
// cache_seqlens[b] - 1 are read and their pages must be listed.
Status check_cache_tables(const Params& p, int64_t batch, const Tensor& device_of, const char* device_name,
                          bool appending, int64_t append) {
  const bool table = p.block_table.defined();
  if (!p.cache_seqlens.defined())
    return invalid(std::string("cache_seqlens: required ") +
                   (table ? "with block_table" : "by append_kv") + " (the KV length of each sequence, int32 [batch])");
  const char* const kLengthDims[] = {"batch"};
  const int64_t lengths_shape[] = {batch};
  FMHA_TRY(check_int_table("cache_seqlens", p.cache_seqlens, 1, "[batch]", lengths_shape, kLengthDims,
                           "the batch of the call", device_of, device_name));
  if (table) {
    const char* const kTableDims[] = {"batch", "max_pages_per_seq"};
    const int64_t table_shape[] = {batch, -1};
    FMHA_TRY(check_int_table("block_table", p.block_table, 2, "[batch, max_pages_per_seq]", table_shape, kTableDims,
                             "the batch of the call", device_of, device_name));
    const int64_t page_size = p.k.shape[1];
    if (page_size < kMinPageSize || page_size > kMaxPageSize)
      return invalid("k: page_size is " + std::to_string(page_size) + ", expected " + std::to_string(kMinPageSize) +
                     " ... " + std::to_string(kMaxPageSize) + " for a paged cache (block_table given)");
  }
  if (device_of.device.type != DeviceType::cpu) return Status::success();  // device tables: the caller's promise

  const PagedCache cache = PagedCache::of(p);
  const int64_t capacity = cache.capacity();
  const std::string capacity_text =
      table ? "max_pages_per_seq * page_size = " + std::to_string(capacity) : "capacity of k = " + std::to_string(capacity);
  struct Written {
    int64_t slot, sequence;
    bool operator<(const Written& o) const { return slot < o.slot || (slot == o.slot && sequence < o.sequence); }
  };
  std::vector<Written> written;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cache.raw_length(b);
    if (length < 0)
      return invalid("cache_seqlens[" + std::to_string(b) + "]: is " + std::to_string(length) + ", expected >= 0");
    if (length + append > capacity)
      return invalid("cache_seqlens[" + std::to_string(b) + "]: is " + std::to_string(length) +
                     (append > 0 ? ", and appending seqlen_new = " + std::to_string(append) + " rows needs " +
                                       std::to_string(length + append) + " <= "
                                 : ", expected <= ") +
                     capacity_text);
    if (!table) continue;  // contiguous: sequence b is row b of k, checked by its shape
    const int64_t first = appending ? length : 0, end = appending ? length + append : length;
    if (end <= first) continue;
    for (int64_t i = first / cache.page_size; i <= (end - 1) / cache.page_size; ++i) {
      const int64_t entry = cache.raw_entry(b, i);
      if (entry < 0 || entry >= cache.num_pages)
        return invalid("block_table[" + std::to_string(b) + "][" + std::to_string(i) + "]: is " + std::to_string(entry) +
                       ", expected a page in [0, " + std::to_string(cache.num_pages) + ") (num_pages of k): it holds " +
                       (appending ? "rows written by append_kv" : "keys") + " of sequence " + std::to_string(b));
    }
    if (appending)
      for (int64_t j = length; j < length + append; ++j)
        written.push_back({cache.raw_entry(b, j / cache.page_size) * cache.page_size + j % cache.page_size, b});
  }
  std::sort(written.begin(), written.end());
  for (size_t i = 1; i < written.size(); ++i)
    if (written[i].slot == written[i - 1].slot)
      return invalid("block_table: sequences " + std::to_string(written[i - 1].sequence) + " and " +
                     std::to_string(written[i].sequence) + " would write the same cache row (page " +
                     std::to_string(written[i].slot / cache.page_size) + ", row " +
                     std::to_string(written[i].slot % cache.page_size) +
                     "); pages that sequences share are read-only, give each its own page for new rows");
  return Status::success();
}

// What a paged call may not combine with, and its tables.
Status check_paged(const Params& p, Direction direction) {
  const char* name = p.block_table.defined() ? "block_table" : "cache_seqlens";
  if (direction == Direction::backward)
    return {Code::unsupported, std::string(name) + ": backward with a KV cache (block_table / cache_seqlens) is not "
                                                   "supported; the paged cache is forward only (decoding)"};
  return check_cache_tables(p, p.q.shape[0], p.q, "q", false, 0);
}

}  // namespace

Status validate(const Params& p, Direction direction) {
  if (direction != Direction::forward && direction != Direction::backward)
    return invalid("direction: expected forward or backward");
  // Dense [B, S, H, D] tensors, or packed [total, H, D] ones with sequence tables (varlen).
  const bool varlen = p.cu_seqlens_q.defined() || p.cu_seqlens_k.defined();
  if (varlen && is_paged(p))
    return {Code::unsupported, std::string(p.block_table.defined() ? "block_table" : "cache_seqlens") +
                                   ": a KV cache does not combine with variable-length queries (cu_seqlens_q / "
                                   "cu_seqlens_k) yet; pass dense q [batch, seqlen_q, heads, head_dim]"};
  const int rank = varlen ? 3 : 4;
  const char* const* q_dims = varlen ? kPackedQDims : kQDims;
  const char* const* o_dims = varlen ? kPackedODims : kODims;
  // A KV cache: pages [num_pages, page_size, ...] with a block table, or [batch, capacity, ...].
  const bool paged = is_paged(p), table = p.block_table.defined();
  const char* const* k_dims = varlen ? kPackedKDims : table ? kPagedKDims : paged ? kCacheKDims : kKDims;
  const char* const* v_dims = varlen ? kPackedVDims : table ? kPagedVDims : paged ? kCacheVDims : kVDims;
  if (p.k_new.defined() || p.v_new.defined())
    return invalid(std::string(p.k_new.defined() ? "k_new" : "v_new") + ": " + to_string(direction) +
                   " does not append to the cache; call fmha::append_kv first, then pass cache_seqlens + seqlen_new");
  const char* const* lse_dims = varlen ? kPackedLseDims : kLseDims;
  FMHA_TRY(check_view("q", p.q, rank, q_dims));
  FMHA_TRY(check_view("k", p.k, rank, k_dims));
  FMHA_TRY(check_view("v", p.v, rank, v_dims));
  FMHA_TRY(check_view("o", p.o, rank, o_dims));
  if (varlen) FMHA_TRY(check_tables(p));
  if (paged) FMHA_TRY(check_paged(p, direction));

  // The token dimension comes first in the packed layout, after the batch in the dense one.
  const int tok = varlen ? 0 : 1;
  const int64_t batch = varlen ? 1 : p.q.shape[0];  // packed tensors have no batch dimension
  const int64_t seqlen_q = p.q.shape[tok], heads = p.q.shape[tok + 1], head_dim = p.q.shape[tok + 2];
  const int64_t seqlen_k = p.k.shape[tok], kv_heads = p.k.shape[tok + 1], head_dim_v = p.v.shape[tok + 2];
  // An expected shape in this call's layout, from the dense layout's four sizes.
  struct Shape {
    int64_t size[4];
  };
  auto layout = [&](int64_t b, int64_t s, int64_t h, int64_t d) {
    return varlen ? Shape{{s, h, d, 0}} : Shape{{b, s, h, d}};
  };

  // A paged cache's num_pages and page_size are k's own; a contiguous cache has q's batch.
  const Shape k_expected = paged ? Shape{{table ? p.k.shape[0] : batch, p.k.shape[1], kv_heads, head_dim}}
                                 : layout(batch, seqlen_k, kv_heads, head_dim);
  FMHA_TRY(check_shape("k", p.k, k_expected.size, k_dims, "batch and head_dim of q"));
  const Shape v_expected = paged ? Shape{{p.k.shape[0], p.k.shape[1], kv_heads, head_dim_v}}
                                 : layout(batch, seqlen_k, kv_heads, head_dim_v);
  FMHA_TRY(check_shape("v", p.v, v_expected.size, v_dims,
                       table ? "num_pages, page_size and kv_heads of k" : "batch, seqlen_k and kv_heads of k"));
  const Shape o_expected = layout(batch, seqlen_q, heads, head_dim_v);
  FMHA_TRY(check_shape("o", p.o, o_expected.size, o_dims, "q's [batch, seqlen_q, heads] and v's head_dim_v"));

  if (head_dim < 1) return invalid("q: head_dim is " + std::to_string(head_dim) + ", expected >= 1");
  if (head_dim_v < 1) return invalid("v: head_dim_v is " + std::to_string(head_dim_v) + ", expected >= 1");
  if (heads > 0 && kv_heads < 1) return invalid("k: kv_heads is 0, expected >= 1 when heads > 0");
  if (kv_heads > 0 && heads % kv_heads != 0)
    return invalid("k: kv_heads (" + std::to_string(kv_heads) + ") must divide heads (" + std::to_string(heads) +
                   ") of q");

  FMHA_TRY(check_same_kind("k", p.k, p.q, true));
  FMHA_TRY(check_same_kind("v", p.v, p.q, true));
  FMHA_TRY(check_same_kind("o", p.o, p.q, true));

  const bool need_lse = direction == Direction::backward;
  if (need_lse || p.lse.defined()) {
    FMHA_TRY(check_view("lse", p.lse, rank - 1, lse_dims));
    if (p.lse.dtype != DType::fp32) return invalid("lse: dtype must be fp32, got " + std::string(to_string(p.lse.dtype)));
    const Shape lse_expected = varlen ? Shape{{heads, seqlen_q, 0, 0}} : Shape{{batch, heads, seqlen_q, 0}};
    FMHA_TRY(check_shape("lse", p.lse, lse_expected.size, lse_dims, "q's batch, heads and seqlen_q"));
    FMHA_TRY(check_same_kind("lse", p.lse, p.q, false));
  }

  if (direction == Direction::backward) {
    FMHA_TRY(check_view("dout", p.dout, rank, o_dims));
    FMHA_TRY(check_shape("dout", p.dout, o_expected.size, o_dims, "the shape of o"));
    FMHA_TRY(check_view("dq", p.dq, rank, q_dims));
    const Shape q_expected = layout(batch, seqlen_q, heads, head_dim);
    FMHA_TRY(check_shape("dq", p.dq, q_expected.size, q_dims, "the shape of q"));
    FMHA_TRY(check_view("dk", p.dk, rank, k_dims));
    FMHA_TRY(check_shape("dk", p.dk, k_expected.size, k_dims, "the shape of k"));
    FMHA_TRY(check_view("dv", p.dv, rank, v_dims));
    FMHA_TRY(check_shape("dv", p.dv, v_expected.size, v_dims, "the shape of v"));
    FMHA_TRY(check_same_kind("dout", p.dout, p.q, true));
    FMHA_TRY(check_same_kind("dq", p.dq, p.q, true));
    FMHA_TRY(check_same_kind("dk", p.dk, p.q, true));
    FMHA_TRY(check_same_kind("dv", p.dv, p.q, true));
  }

  if (!std::isfinite(p.softmax_scale))
    return invalid("softmax_scale: must be finite (0 selects 1/sqrt(head_dim))");
  if (p.causal != Causal::none && p.causal != Causal::top_left && p.causal != Causal::bottom_right)
    return invalid("causal: expected none, top-left or bottom-right");
  if (p.window_left < -1)
    return invalid("window_left: is " + std::to_string(p.window_left) + ", expected >= 0 or -1 (unbounded)");
  if (p.window_right < -1)
    return invalid("window_right: is " + std::to_string(p.window_right) + ", expected >= 0 or -1 (unbounded)");
  if (p.causal != Causal::none && p.window_right > 0)
    return invalid("window_right: is " + std::to_string(p.window_right) + " but causal masking (" +
                   to_string(p.causal) + ") allows no key to the right; use -1 or 0");
  if (p.precision != Precision::ieee && p.precision != Precision::tf32 && p.precision != Precision::tf32x3)
    return invalid("precision: expected ieee, tf32 or tf32x3");
  if (p.precision != Precision::ieee && p.q.dtype != DType::fp32)
    return invalid(std::string("precision: ") + to_string(p.precision) + " applies to fp32 inputs only; q is " +
                   to_string(p.q.dtype));
  if (p.num_threads < 0) return invalid("num_threads: is " + std::to_string(p.num_threads) + ", expected >= 0");
  if (p.num_splits < 0 || p.num_splits > decode::kMaxSplits)
    return invalid("num_splits: is " + std::to_string(p.num_splits) + ", expected 0 (chosen from the shape) ... " +
                   std::to_string(decode::kMaxSplits));
  if (p.workspace_bytes > 0 && p.workspace == nullptr)
    return invalid("workspace: null pointer with workspace_bytes > 0");
  return Status::success();
}

namespace {

// The bytes a view can touch: [begin, end); empty for an empty view.
struct Span {
  uintptr_t begin = 0, end = 0;
};
Span span_of(const Tensor& t) {
  if (t.numel() == 0) return {};
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.stride[d];
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + uintptr_t(last + 1) * dtype_size(t.dtype)};
}
bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.stride[d] != b.stride[d])) return false;
  return true;
}
bool overlap(const Tensor& a, const Tensor& b) {
  const Span x = span_of(a), y = span_of(b);
  return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

// A [total, H, Dv] or [H, total] view as the dense [1, total, H, Dv] or [1, H, total] one.
Tensor with_unit_batch(const Tensor& t) {
  Tensor out = t;
  out.rank = t.rank + 1;
  for (int d = t.rank; d > 0; --d) {
    out.shape[d] = t.shape[d - 1];
    out.stride[d] = t.stride[d - 1];
  }
  out.shape[0] = 1;
  out.stride[0] = 0;
  return out;
}

}  // namespace

Status validate_merge(const MergeParams& p, MergeRows* rows) {
  // out_a fixes the layout: dense [B, S, H, Dv] (lse [B, H, S]) or packed [total, H, Dv] (lse [H, total]).
  if (!p.out_a.defined()) return invalid("out_a: required tensor is missing (rank 0)");
  if (p.out_a.rank != 4 && p.out_a.rank != 3)
    return invalid("out_a: expected a 4-d tensor [batch, seqlen, heads, head_dim_v] or a packed 3-d tensor "
                   "[total, heads, head_dim_v], got rank " + std::to_string(p.out_a.rank));
  const bool packed = p.out_a.rank == 3;
  const char* const* out_dims = packed ? kPackedODims : kODims;
  const char* const* lse_dims = packed ? kPackedLseDims : kLseDims;
  const int rank = p.out_a.rank;
  struct Part {
    const char* name;
    const Tensor& t;
    bool is_lse;
  };
  const Part parts[] = {{"out_a", p.out_a, false}, {"lse_a", p.lse_a, true}, {"out_b", p.out_b, false},
                        {"lse_b", p.lse_b, true},  {"out", p.out, false},     {"lse", p.lse, true}};
  const int tok = packed ? 0 : 1;
  const int64_t batch = packed ? 1 : p.out_a.shape[0];
  const int64_t seqlen = p.out_a.shape[tok], heads = p.out_a.shape[tok + 1], head_dim_v = p.out_a.shape[tok + 2];
  int64_t out_shape[4], lse_shape[3];
  if (packed) {
    out_shape[0] = seqlen, out_shape[1] = heads, out_shape[2] = head_dim_v;
    lse_shape[0] = heads, lse_shape[1] = seqlen;
  } else {
    out_shape[0] = batch, out_shape[1] = seqlen, out_shape[2] = heads, out_shape[3] = head_dim_v;
    lse_shape[0] = batch, lse_shape[1] = heads, lse_shape[2] = seqlen;
  }
  for (const Part& part : parts) {
    FMHA_TRY(check_view(part.name, part.t, part.is_lse ? rank - 1 : rank, part.is_lse ? lse_dims : out_dims));
    if (part.is_lse && part.t.dtype != DType::fp32)
      return invalid(std::string(part.name) + ": dtype must be fp32, got " + to_string(part.t.dtype));
    FMHA_TRY(check_shape(part.name, part.t, part.is_lse ? lse_shape : out_shape, part.is_lse ? lse_dims : out_dims,
                         part.is_lse ? "the rows of out_a" : "the shape of out_a"));
    if (!(part.t.device == p.out_a.device))
      return invalid(std::string(part.name) + ": is on a different device than out_a");
  }
  // In place means the very same view; anything else that shares memory with an input or with the
  // other output would read values the merge has already overwritten.
  for (const Part& output : {parts[4], parts[5]}) {
    for (const Part& input : {parts[0], parts[1], parts[2], parts[3]})
      if (overlap(output.t, input.t) && !same_view(output.t, input.t))
        return invalid(std::string(output.name) + ": overlaps " + input.name +
                       " without being the same view; write the result in place (the same data, shape and "
                       "strides) or to separate memory");
  }
  if (overlap(p.out, p.lse)) return invalid("lse: overlaps out");

  rows->out_a = packed ? with_unit_batch(p.out_a) : p.out_a;
  rows->lse_a = packed ? with_unit_batch(p.lse_a) : p.lse_a;
  rows->out_b = packed ? with_unit_batch(p.out_b) : p.out_b;
  rows->lse_b = packed ? with_unit_batch(p.lse_b) : p.lse_b;
  rows->out = packed ? with_unit_batch(p.out) : p.out;
  rows->lse = packed ? with_unit_batch(p.lse) : p.lse;
  rows->batch = batch;
  rows->seqlen = seqlen;
  rows->heads = heads;
  rows->head_dim_v = head_dim_v;
  return Status::success();
}

Status validate_append(const Params& p) {
  // The cache fixes the layout: pages with a block table, or contiguous [batch, capacity, ...].
  const bool table = p.block_table.defined();
  const char* const* k_dims = table ? kPagedKDims : kCacheKDims;
  const char* const* v_dims = table ? kPagedVDims : kCacheVDims;
  FMHA_TRY(check_view("k", p.k, 4, k_dims));
  FMHA_TRY(check_view("v", p.v, 4, v_dims));
  FMHA_TRY(check_view("k_new", p.k_new, 4, kNewKDims));
  FMHA_TRY(check_view("v_new", p.v_new, 4, kNewVDims));
  const int64_t batch = p.k_new.shape[0], seqlen_new = p.k_new.shape[1], kv_heads = p.k.shape[2];
  const int64_t head_dim = p.k.shape[3], head_dim_v = p.v.shape[3];
  const int64_t v_shape[] = {p.k.shape[0], p.k.shape[1], kv_heads, head_dim_v};
  FMHA_TRY(check_shape("v", p.v, v_shape, v_dims, table ? "num_pages, page_size and kv_heads of k" : "batch, capacity and kv_heads of k"));
  if (!table && p.k.shape[0] != batch)
    return invalid("k: batch is " + std::to_string(p.k.shape[0]) + ", expected " + std::to_string(batch) +
                   " (batch of k_new; a contiguous cache has one row of pages per sequence)");
  const int64_t k_new_shape[] = {batch, seqlen_new, kv_heads, head_dim};
  FMHA_TRY(check_shape("k_new", p.k_new, k_new_shape, kNewKDims, "kv_heads and head_dim of k"));
  const int64_t v_new_shape[] = {batch, seqlen_new, kv_heads, head_dim_v};
  FMHA_TRY(check_shape("v_new", p.v_new, v_new_shape, kNewVDims, "batch and seqlen_new of k_new, kv_heads and head_dim_v of v"));
  auto same_kind = [&](const char* name, const Tensor& t) -> Status {
    if (t.dtype != p.k.dtype)
      return invalid(std::string(name) + ": dtype is " + to_string(t.dtype) + ", expected " + to_string(p.k.dtype) +
                     " like k (the cache stores the rows as given)");
    if (!(t.device == p.k.device)) return invalid(std::string(name) + ": is on a different device than k");
    return Status::success();
  };
  FMHA_TRY(same_kind("v", p.v));
  FMHA_TRY(same_kind("k_new", p.k_new));
  FMHA_TRY(same_kind("v_new", p.v_new));
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"k_new", p.k_new},
                                std::pair<const char*, const Tensor&>{"v_new", p.v_new}})
    for (const auto& [cache_name, cache] : {std::pair<const char*, const Tensor&>{"k", p.k},
                                            std::pair<const char*, const Tensor&>{"v", p.v}})
      if (overlap(t, cache))
        return invalid(std::string(name) + ": overlaps " + cache_name + "; the new rows must be in separate memory");
  if (overlap(p.k, p.v)) return invalid("v: overlaps k; the key and value caches must be separate memory");
  if (p.num_threads < 0) return invalid("num_threads: is " + std::to_string(p.num_threads) + ", expected >= 0");
  return check_cache_tables(p, batch, p.k, "k", true, seqlen_new);
}

}  // namespace fmha::detail
