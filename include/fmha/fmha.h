// fmha — fused multi-head attention, forward and backward. (C++17 and later.)
// The whole public C++ API: tensor views, the one Params struct that carries a call to every
// backend, and the entry points (forward, backward, supports, workspace_size, select_backend, append_kv).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmha {

const char* version();

// ---------------------------------------------------------------------------------------------
// Tensor views
// ---------------------------------------------------------------------------------------------

// int32 is for the tables of variable-length calls and of a paged KV cache (Params::cu_seqlens_q/k,
// block_table, cache_seqlens) only.
enum class DType : int { fp32, fp16, bf16, int32 };
enum class DeviceType : int { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA device ordinal; 0 for the CPU
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

inline constexpr int kMaxRank = 4;

// A non-owning strided view. Strides are in elements (not bytes); the last dimension must be
// contiguous (stride 1) wherever it has more than one element. Sizes and strides are int64.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::fp32;
  Device device{};
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};

  int64_t size(int dim) const { return shape[dim]; }
  int64_t numel() const;
  bool defined() const { return rank > 0; }
};

// A contiguous (row-major) view of `shape`.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
// A view with explicit element strides.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides, Device device = {});

size_t dtype_size(DType dtype);

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

// Causal masking. Query row i (0-based, local to the call) sits at absolute position
//
//     pos(i) = i + q_offset                          for none and top-left
//     pos(i) = i + q_offset + seqlen_k - seqlen_q    for bottom-right
//
// and key j sits at position j. Causal attention lets query i see keys j <= pos(i).
//   top-left:     the first query is aligned with the first key (query 0 sees key 0 only).
//   bottom-right: the last query is aligned with the last key (query seqlen_q-1 sees every key),
//                 as when the queries are the newest tokens of a sequence whose keys are all cached.
// With seqlen_q > seqlen_k and bottom-right, the first seqlen_q - seqlen_k rows see no key.
enum class Causal : int { none, top_left, bottom_right };

// For fp32 storage: `ieee` computes in exact fp32 (FMA) arithmetic; `tf32` lets GPU tiers use
// tf32 tensor cores (the CPU path emulates it by rounding the matmul operands to tf32; the sm90
// tier's forward rounds P and V but truncates Q and K, whose tiles its tensor cores read as they
// are stored: the top 19 bits of each fp32 value; its backward, head dims 64 to 128, truncates Q
// and K in the scores and rounds the rest).
// `tf32x3` ("split tf32") keeps fp32 accuracy on tf32 tensor cores: every matmul operand x is
// split into hi = tf32(x) and lo = tf32(x - hi), and each product is hi·hi + hi·lo + lo·hi (three
// tensor-core products, fp32 accumulation; the lo·lo term, below 2^-22 of the product, is
// dropped). The softmax stays fp32. The sm80 tier runs it, the sm90 tier its forward and backward
// at head dim 64 (elsewhere supports() says why not); the CPU backends and the simt tier compute
// it in exact fp32, which is what it approximates. Split tf32 is as accurate as exact fp32 (its
// mean error at most the simt tier's on every class of the GPU fuzz), so `auto` also meets an
// `ieee` call with it on a GPU where it is measured faster: compute capability 9.0, every forward
// and the backward at head dim 64 and above 128 (not for KV caches or calls of at most 16 query
// rows); elsewhere, and with Backend::cuda_simt named, `ieee` runs in exact fp32
// (src/common/precision.h).
// fp16 and bf16 storage always multiply in their own format with fp32 accumulation; `tf32` and
// `tf32x3` are errors for them.
enum class Precision : int { ieee, tf32, tf32x3 };

// Which implementation runs a call. `auto_select` picks the fastest one that supports the call
// (select_backend says which). `reference` is the fp64 oracle: exact, slow, CPU only.
enum class Backend : int { auto_select, reference, cpu, cuda_simt, cuda_sm80, cuda_sm90 };

enum class Direction : int { forward, backward };

// ---------------------------------------------------------------------------------------------
// The call
// ---------------------------------------------------------------------------------------------

// One plain struct carries a call to every backend.
//
// Shapes (B = batch, Sq/Sk = seqlen_q/seqlen_k, H = heads, Hkv = kv_heads, D/Dv = head dims):
//   q, o, dout, dq : [B, Sq, H, D]    (o, dout: last dim Dv)
//   k, dk          : [B, Sk, Hkv, D]
//   v, dv          : [B, Sk, Hkv, Dv]
//   lse            : [B, H, Sq], fp32, natural log of the softmax denominator (scaled scores)
// The [B, H, S, D] layout is a view with strides {H*S*D, D, S*D, 1}.
// H must be a multiple of Hkv (GQA/MQA): query head h reads KV head h / (H / Hkv).
//
// Variable-length (packed) batches: when cu_seqlens_q is defined, the batch is packed sequence
// after sequence along the token dimension, each sequence its own attention problem:
//   q, o, dout, dq : [total_q, H, D]   (o, dout: last dim Dv)
//   k, dk          : [total_k, Hkv, D]
//   v, dv          : [total_k, Hkv, Dv]
//   lse            : [H, total_q], fp32
//   cu_seqlens_q/k : [B + 1], int32, on the tensors' device: sequence b is rows
//                    cu_seqlens_q[b] ... cu_seqlens_q[b+1] - 1 of q (likewise k, v)
//   max_seqlen_q/k : the longest sequence of each table (sizes the GPU grids)
// Causal alignment, window and q_offset apply within each sequence (pos(i) counts from the
// sequence's first query, with that sequence's own seqlen_q and seqlen_k). Sequences of length 0
// are allowed. Tables in CPU memory are checked in full (first entry 0, non-decreasing, last entry
// = total tokens, every length <= its max_seqlen); tables in device memory cannot be read without a
// synchronising copy, so their shape, dtype, device and alignment are checked and their contents
// are the caller's promise. The GPU kernels read device tables as they run and clamp each entry
// (a sequence's begin to [0, total], its end to [begin, total], its length to max_seqlen), so a
// table that breaks the promise gives wrong results, and may leave output rows that no sequence
// covers unwritten, but never reads or writes outside the tensors or the workspace.
// Backends: reference, cpu, and the simt, sm80 and sm90 GPU tiers (sm90: fp16 and bf16, as for
// dense calls; `auto` picks the tier as it does for a dense call of the same dtype and head dims,
// on the longest sequences' lengths). The backward's GPU
// workspace (workspace_size) grows with total_q · H, not with batch · max_seqlen_q.
//
// Paged KV cache (decoding): when block_table is defined, k and v are a pool of fixed-size pages
// shared by every sequence, and each sequence lists the pages that hold its keys in order:
//   q, o           : [B, Sq, H, D]      (o: last dim Dv), dense as above
//   k              : [num_pages, page_size, Hkv, D]
//   v              : [num_pages, page_size, Hkv, Dv]
//   lse            : [B, H, Sq], fp32
//   block_table    : [B, max_pages_per_seq], int32: key j of sequence b is row j % page_size of
//                    page block_table[b][j / page_size]
//   cache_seqlens  : [B], int32: sequence b has cache_seqlens[b] keys (0 ... max_pages_per_seq *
//                    page_size); the mask's seqlen_k is this length, sequence by sequence
// page_size is kMinPageSize ... kMaxPageSize; pages may be shared between sequences (a common
// prefix) and appear in any order. Without block_table but with cache_seqlens, k and v are a
// contiguous cache [B, capacity, Hkv, D] of which sequence b uses the first cache_seqlens[b] rows
// (the degenerate case: one page per sequence); without either, the call is the dense one above.
// Causal alignment, window and q_offset apply per sequence with its own seqlen_k, so bottom-right
// puts the last query at the last cached key. Tables in CPU memory are checked: every length in
// range, and every entry that a length reaches (pages 0 ... ceil(cache_seqlens[b] / page_size) - 1
// of row b) in [0, num_pages); entries past a sequence's length are never read and may hold
// anything (e.g. -1). Tables in device memory cannot be read without a synchronising copy: that
// they are in range is the caller's promise, and every implementation clamps lengths to
// [0, capacity] and entries to [0, num_pages) (common/paged.h) so that a bad table reads wrong
// pages but never memory outside k and v. Forward only (backward is refused), dense queries only
// (not with cu_seqlens). Backends: reference and cpu, and on the GPU the sm80 tier's decode kernel
// (fp16 and bf16; sm_80 and newer, the H100/H200 included), which packs the query heads of one KV
// head into one tile (each K/V byte read once per sequence) and splits a sequence's keys over
// several CTAs when batch · kv_heads cannot fill the GPU (num_splits below); `auto` also runs
// dense fp16/bf16 forwards with seqlen_q <= 16 on it. fp32 calls on a cache run on the CPU only.
// The split partials live in the workspace (workspace_size counts them): without enough of it
// the call runs unsplit, which is slower for few long sequences, unless num_splits asks for
// splits, which is then an error.
//
// forward writes o and (when lse is defined) lse.
// backward reads q, k, v, o, dout, lse and writes dq, dk, dv; dk/dv are summed over the query
// heads that share a KV head. lse defines the softmax the gradients are of, P = exp(S - lse): the
// call's own lse, or a larger one merged over more keys (fmha::merge), for which the gradients are
// those of this part of the keys. (Where lse is the call's own, the cpu backend takes P from each
// row's recomputed max and sum instead, as a plain softmax does: an fp32 lse's rounding costs
// accuracy when logits are large.)
// A query row that sees no key gets o = 0, lse = -inf and zero gradients.
struct Params {
  Tensor q, k, v;
  Tensor o, lse;
  Tensor dout, dq, dk, dv;

  // Variable-length batches (see above); leave undefined for the dense [B, S, H, D] layout.
  Tensor cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;

  // Paged KV cache (see above); leave both undefined for the dense layout.
  Tensor block_table, cache_seqlens;
  // Rows to write into the cache by append_kv (below), [B, seqlen_new, Hkv, D] and
  // [B, seqlen_new, Hkv, Dv]; forward and backward refuse them.
  Tensor k_new, v_new;

  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  Causal causal = Causal::none;
  // Sliding window around pos(i): query i sees keys pos(i) - window_left ... pos(i) + window_right.
  // -1 = unbounded on that side. With causal masking, window_right must be -1 or 0.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Absolute position of query row 0 (a KV cache's length before these queries). May be negative.
  int64_t q_offset = 0;

  Precision precision = Precision::ieee;
  bool deterministic = false;  // backward: bitwise reproducible results (dQ summed in a fixed order)
  Backend backend = Backend::auto_select;

  void* stream = nullptr;      // cudaStream_t for GPU backends; nullptr = legacy default stream
  void* workspace = nullptr;   // device memory of at least workspace_size(...) bytes (GPU backends)
  size_t workspace_bytes = 0;
  int num_threads = 0;         // CPU backends: 0 = all hardware threads
  // GPU decode kernel (KV cache, or dense forward with seqlen_q <= 16): CTAs that split each
  // sequence's keys, 0 = chosen from the shape and the SM count, else 1 ... 256 (for tests and
  // tuning). Other implementations ignore it.
  int num_splits = 0;
};

// The page sizes a paged KV cache may use (Params::block_table).
inline constexpr int64_t kMinPageSize = 16;
inline constexpr int64_t kMaxPageSize = 256;

enum class Code : int { ok, invalid_argument, unsupported, no_device, cuda_error, internal };

struct Status {
  Code code = Code::ok;
  std::string message;
  bool ok() const { return code == Code::ok; }
  explicit operator bool() const { return ok(); }
  static Status success() { return {}; }
};

class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

// Throws fmha::Error when `status` is not ok.
void throw_if_error(const Status& status);

// Runs the call. On any error nothing is written to any output and the Status says which
// argument is wrong and what was expected.
Status forward(const Params& params);
Status backward(const Params& params);

// Whether the call could run (with the backend it names, or any backend for auto_select), and
// if not, why. Does no work and writes nothing.
Status supports(const Params& params, Direction direction);

// The backend that forward/backward would run (resolving auto_select). Errors as supports().
Status select_backend(const Params& params, Direction direction, Backend* chosen);

// Bytes of device workspace the call needs: 0 for CPU backends; the GPU backward's row statistics
// and dQ accumulator; 256 for the sm90 forward (its tile scheduler's counter), which is optional
// there: without a workspace the sm90 forward assigns its tiles statically (slower on causal and
// short problems). The workspace's contents need no initialisation.
Status workspace_size(const Params& params, Direction direction, size_t* bytes);

// Appends new keys and values to a KV cache: for each sequence b, rows k_new[b, i] and v_new[b, i]
// (i < seqlen_new) are written at key position cache_seqlens[b] + i of the cache that
// params.k / params.v / params.block_table / params.cache_seqlens describe (paged or contiguous,
// as for forward; q, o and lse are not read). cache_seqlens is read, not updated: the next
// forward passes cache_seqlens + seqlen_new. Every page that a written position falls in must be
// listed in the table, and no two sequences may write the same cache row (a shared prefix page
// is read-only). k_new / v_new have the cache's dtype and device: CPU tensors, or CUDA tensors
// (one kernel on params.stream, no synchronisation; device tables are clamped as for forward, so
// a broken promise writes wrong rows of the cache but never outside it). On any error nothing is
// written. Rotary embedding is the caller's.
Status append_kv(const Params& params);

// ---------------------------------------------------------------------------------------------
// Merging partial results
// ---------------------------------------------------------------------------------------------

// The attention of the same queries over two disjoint key sets A and B, each given as its output
// and log-sum-exp, combined into the attention over A ∪ B (the step of split-KV decoding and of
// ring attention):
//
//     lse = log(exp(lse_a) + exp(lse_b))
//     out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b
//
// computed in fp32 for any LSE values: a row whose lse is -inf on one side takes the other side
// unchanged (its out is not used, so it may hold anything, NaN included), and a row with -inf on both sides
// gets out = 0, lse = -inf.
//
// Layouts, as for attention (Params): dense out [B, S, H, Dv] with lse [B, H, S], or packed
// (variable-length) out [total, H, Dv] with lse [H, total]. The three outputs may differ in dtype
// (fp32, fp16, bf16; e.g. bf16 parts into an fp32 accumulator); lse tensors are fp32. All six
// tensors are on one device. `out` and `lse` may be exactly `out_a`/`lse_a` or `out_b`/`lse_b`
// (the same view), which is the in-place form; any other overlap is refused.
struct MergeParams {
  Tensor out_a, lse_a;
  Tensor out_b, lse_b;
  Tensor out, lse;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors; nullptr = legacy default stream
  int num_threads = 0;     // CPU tensors: 0 = all hardware threads
};

Status merge(const MergeParams& params);

// The accumulate form, for merging many parts one after another: (acc_out, acc_lse) becomes the
// merge of itself with (part_out, part_lse). Start the accumulator with acc_lse = -inf (its out is
// then never read) or with the first part.
Status merge_into(const Tensor& acc_out, const Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse,
                  void* stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Introspection and names
// ---------------------------------------------------------------------------------------------

struct DeviceInfo {
  Device device;
  std::string name;
  int compute_capability = 0;  // 90 for sm_90; 0 for the CPU
  int multiprocessors = 0;     // CPU: hardware threads
  size_t memory_bytes = 0;
};

// Backends compiled into this build (reference and cpu always).
std::vector<Backend> compiled_backends();
// The CPU and every CUDA device visible to this process.
std::vector<DeviceInfo> devices();

// The `cpu` backend's instruction-set paths (portable, avx2, avx512, avx512bf16, amxbf16): those
// compiled into this build, those of them this CPU runs, and the one calls take now, which is the
// fastest of those (a path that measured slower here than the one before it is passed over)
// unless the environment variable FMHA_CPU_ISA names another. A path that this build or this CPU
// lacks is refused, never run: calls to the cpu backend then fail with `error`.
struct CpuPaths {
  std::vector<std::string> compiled;
  std::vector<std::string> runnable;
  std::vector<std::string> not_runnable;  // "<path>: why this CPU cannot run it", each compiled path it cannot
  // "<path>: why the choice passes it over", each runnable path that measured slower here than
  // the path before it (FMHA_CPU_ISA can still force it)
  std::vector<std::string> passed_over;
  std::string selected;  // empty when FMHA_CPU_ISA is refused
  std::string error;     // why FMHA_CPU_ISA is refused; empty otherwise
};
CpuPaths cpu_paths();

const char* to_string(Backend backend);
const char* to_string(DType dtype);
const char* to_string(Causal causal);
const char* to_string(Precision precision);
const char* to_string(Direction direction);
const char* to_string(Code code);
bool parse(const std::string& text, Backend* out);
bool parse(const std::string& text, DType* out);
bool parse(const std::string& text, Causal* out);
bool parse(const std::string& text, Precision* out);

}  // namespace fmha
