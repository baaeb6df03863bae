// Shared pieces of the GPU kernel tests: device buffers, random inputs, the naive
// same-precision attention, and the accuracy rule every kernel test applies.
//
// THE RULE (after FlashAttention-3's tests). For each output tensor X of a call,
//     max|X_kernel - X_fp64|  <=  2 · max|X_naive - X_fp64|  +  2 · u(dtype) · max|X_fp64|  +  1e-6
// where X_fp64 is the oracle (src/cpu/reference), X_naive is a plain CPU computation in the
// tier's precision (fp32 arithmetic, inputs as stored, P and dS rounded to the tier's matmul
// format before their products, output rounded to the storage dtype), and u is the unit
// roundoff of the storage dtype (2^-24 fp32, 2^-11 fp16, 2^-8 bf16): the kernel may be at most
// twice as wrong as the naive method plus the rounding of storing the result. The LSE of a
// tensor-core tier adds one term to its bound: ceil(D / 8) · 2 · 2^-24 · max scale·sum_d|q_d k_d|,
// what the tensor cores' truncating accumulation may add to a score beyond the naive fp32 FMAs
// (accumulation_bound in gpu_test_util.cpp). Rows that see no key must be exact: O = 0,
// LSE = -inf, dQ = 0; keys no query sees get dK = dV = 0 exactly.
#pragma once

#include <cuda_runtime.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "fmha/fmha.h"
#include "tune/cache.h"

namespace fmha::test {

bool have_cuda_device();
// The current device's compute capability as major · 10 + minor (90 for sm_90).
int device_arch();
// The head-dim buckets the sm80 decode kernel is compiled for (FMHA_DECODE_HEAD_DIMS of those in
// FMHA_HEAD_DIMS).
std::vector<int64_t> decode_head_dims();
// The seed of this process's random inputs (from the clock unless FMHA_TEST_SEED is set).
uint64_t test_seed();

// A device allocation that frees itself.
struct DeviceBuffer {
  void* ptr = nullptr;   // the usable bytes: `offset` bytes past the allocation's start
  void* base = nullptr;  // what cudaMalloc returned
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, size_t offset = 0);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), base(o.base), bytes(o.bytes) {
    o.ptr = o.base = nullptr;
    o.bytes = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  void upload(const std::vector<uint8_t>& host);
  std::vector<uint8_t> download() const;
  void poison();  // every byte 0xFF: NaN in fp32, fp16 and bf16
};

struct Case {
  Backend backend = Backend::cuda_simt;
  DType dtype = DType::fp32;
  Precision precision = Precision::ieee;
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads = 1, kv_heads = 1, head_dim = 64, head_dim_v = 64;
  Causal causal = Causal::none;
  int64_t window_left = -1, window_right = -1, q_offset = 0;
  bool with_lse = true;
  bool deterministic = false;
  bool bhsd_layout = false;  // q/o/dout/dq stored [B, H, S, D] (a strided view)
  int base_offset = 0;       // bytes between each tensor's allocation and its data (alignment tests)
  int grad_offset = 0;       // more bytes before dQ, dK and dV only (the outputs no tier loads in tiles)
  // Scores that grow along the keys: with key_ramp > 0 every query's first component is 1 and key
  // j's is key_ramp · (j / seqlen_k)², so a row's max climbs slowly over the first key tiles and
  // steeply over the last (the online softmax's rescaling paths, lazy and not, all taken).
  double key_ramp = 0;
  float softmax_scale = 0.f;  // Params::softmax_scale (0: 1/sqrt(head_dim)); negative ones too
  std::string name() const;
};

// Host copies of one call's tensors (storage bytes) and views of them.
struct HostProblem {
  Case c;
  std::vector<uint8_t> q, k, v, o, lse, dout;
  // The oracle's forward in fp64 (o and lse above are it rounded to the storage formats):
  // make_problem computes it once, and the forward checks compare with it.
  reference::ForwardResult ref;
  Params params() const;  // CPU views (for the oracle)
};

HostProblem make_problem(const Case& c, uint64_t seed);

struct Errors {
  double kernel = 0, naive = 0, ref_max = 0;
  // What the kernel's matmuls may add beyond the naive computation's rounding (tensor cores'
  // accumulation; 0 where the kernel rounds as the naive one does). Part of the bound.
  double accumulation = 0;
  int64_t nan = 0, not_exact = 0;  // NaN/unwritten elements; masked elements that are not exact
  std::string first_bad;
};

// Runs the case's forward on the GPU and checks O and (if requested) LSE; returns a message
// (empty on success).
std::string check_forward(const Case& c, uint64_t seed);
std::string check_backward(const Case& c, uint64_t seed);
// Rows that see exactly one key (P = 1): dS = P·(dP - Δ) is 0 in exact arithmetic, so dQ of such
// a row, and dK of a key that only such rows see, must be 0 up to fp32 rounding of the dP and Δ
// sums: |x| <= kCancelUlps · 2^-24 · |scale| · sum_d |dO·V| · max|K (or Q)|, with O and LSE from
// the tier's own forward (O = V as its matmuls saw it). Empty when they are.
std::string check_single_key_rows_cancel(const Case& c, uint64_t seed);

// The largest error against the fp64 oracle of each output, for comparing tiers and precisions on
// the same inputs (the same case and seed give the same inputs): the backward with O and LSE as
// the oracle's rounded to storage, then the forward. `error` is empty when both calls ran.
struct OutputErrors {
  double o = 0, dq = 0, dk = 0, dv = 0;              // max |x - x_fp64|
  double o_max = 0, dq_max = 0, dk_max = 0, dv_max = 0;  // max |x_fp64|
  std::string error;
};
OutputErrors output_errors(const Case& c, uint64_t seed, bool with_backward = true);  // else O alone

// Two deterministic backward runs; empty when dq, dk, dv are bitwise identical.
std::string check_deterministic(const Case& c, uint64_t seed);

// The forward with its workspace (a dynamic tile schedule, where the tier has one) and without
// (static); empty when O and LSE are bitwise identical: a work tile's result does not depend on
// which block computes it.
std::string check_schedules_agree(const Case& c, uint64_t seed);
// The naive computations' dot products, formed 8 keys at a time (gpu_test_util.cpp): whether each
// has the bits of its key alone, summed by fma in order, on random rows of several lengths (the
// clone for this CPU); empty when all agree, else the first difference. Needs no GPU.
std::string check_naive_dots(uint64_t seed);
// The LSE bound's accumulation term (THE RULE above) for the case's inputs from `seed`. Needs no GPU.
double lse_accumulation_bound(const Case& c, uint64_t seed);

// A variable-length (packed) call: `base` gives the tier, dtype, heads, head dims and options
// (its batch, seqlens, layout and offset are ignored); sequence b has seqlens_q[b] queries and
// seqlens_k[b] keys. max_seqlen_q/k are the longest lengths plus `extra_max` (a grid with more
// tiles than any sequence needs).
struct VarlenCase {
  Case base;
  std::vector<int64_t> seqlens_q, seqlens_k;
  int64_t extra_max = 0;
  std::string name() const;
};

// Run the packed call on the GPU with its sequence tables in device memory, and check it under
// THE RULE: each sequence against its own oracle and naive result as the dense batch-1 call it
// is (its own masked rows exact), the errors combined over the packed tensor. Empty on success.
std::string check_varlen_forward(const VarlenCase& c, uint64_t seed);
std::string check_varlen_backward(const VarlenCase& c, uint64_t seed);

// A tuning cache file of the test's own (`name`, in the temporary directory) for the scope, so
// that no cache on the machine picks the variant a test expects; the process forgets it, and the
// file goes, at the scope's end (an ASSERT's early return included).
class ScopedTuneCache {
 public:
  explicit ScopedTuneCache(const std::string& name)
      : path_(std::filesystem::temp_directory_path().string() + "/" + name + "_" + std::to_string(getpid()) +
              ".json") {
    setenv(fmha::detail::kCacheVariable, path_.c_str(), 1);
    fmha::detail::reload_tune_cache();
  }
  ~ScopedTuneCache() {
    std::filesystem::remove(path_);
    std::filesystem::remove(path_ + ".lock");
    unsetenv(fmha::detail::kCacheVariable);
    fmha::detail::reload_tune_cache();
  }
  ScopedTuneCache(const ScopedTuneCache&) = delete;
  ScopedTuneCache& operator=(const ScopedTuneCache&) = delete;

 private:
  std::string path_;
};

}  // namespace fmha::test
