// The harness behind `fmha run`, `fmha bench` and the tests: one attention case with its inputs
// (fresh random data on the CPU or a CUDA device), the Params for it, poisoned outputs, timing,
// and the comparison with the fp64 oracle under the one tolerance rule (common/tolerance.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::tools {

// A case as `fmha run` describes it. Zero for kv_heads / seqlen_k / head_dim_v means "same as
// heads / seqlen_q / head_dim".
struct CaseSpec {
  int64_t batch = 4, heads = 4, kv_heads = 0;
  int64_t seqlen_q = 4096, seqlen_k = 0;
  int64_t head_dim = 64, head_dim_v = 0;
  DType dtype = DType::fp32;
  Precision precision = Precision::ieee;
  Causal causal = Causal::none;
  int64_t window_left = -1, window_right = -1, q_offset = 0;
  float softmax_scale = 0.f;
  Direction mode = Direction::forward;
  Backend backend = Backend::auto_select;
  bool deterministic = false;
  bool with_lse = true;  // forward: also write LSE
  uint64_t seed = 0;
  int num_threads = 0;
  int num_splits = 0;  // GPU decode kernel: CTAs per sequence's keys (Params::num_splits; 0 = chosen)
  // A variable-length (packed) batch when non-empty: one entry per sequence (batch and seqlen_q /
  // seqlen_k are then the count and the longest); seqlens_k empty means "same as seqlens_q".
  std::vector<int64_t> seqlens_q, seqlens_k;
  // > 0: K and V in a paged KV cache of this page size (common/paged.h), each sequence's
  // ceil(seqlen_k / page_size) pages drawn in a random order from the pool, every sequence
  // seqlen_k keys long. Forward only; not with a varlen batch.
  int64_t page_size = 0;

  bool varlen() const { return !seqlens_q.empty(); }
  bool paged() const { return page_size > 0; }
  int64_t total_q() const;  // query tokens of all sequences
  int64_t total_k() const;

  CaseSpec resolved() const;  // fills the "same as" defaults (and batch / seqlens of a varlen case)
  std::string dtype_name() const;  // fp32 / tf32 / fp16 / bf16
  double flops() const;            // FlashAttention convention (see Problem::flops); varlen: real work only
  // Bytes of Q, K, V and O, each counted once (what a forward must move at least: the measure of
  // memory-bound decoding).
  double bytes() const;
};

// Host or device memory of a fixed size.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host);
  void download(void* host) const;
  void fill_bytes(unsigned char value);

 private:
  Device device_{};
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

struct CheckResult {
  bool pass = false;
  bool sampled = false;       // the oracle ran on a sample of rows / heads
  double tolerance = 0.0;
  double rel_err = 0.0;       // worst of the compared outputs
  double max_abs_err = 0.0;
  double rel_err_o = 0.0, lse_err = 0.0;                  // forward
  double rel_err_dq = 0.0, rel_err_dk = 0.0, rel_err_dv = 0.0;  // backward
  std::string failure;        // why it failed (NaN, unwritten element, masked row, tolerance)
};

class Harness {
 public:
  // Allocates and fills the inputs on `device`. `input_sets` > 1 allocates that many independent
  // copies of the inputs for timing with rotation (so the L2 cache does not hold them).
  Harness(const CaseSpec& spec, Device device, int input_sets = 1);
  ~Harness();

  const CaseSpec& spec() const { return spec_; }
  Device device() const { return device_; }
  Params params(int input_set = 0) const;

  // Runs the case's direction once on input set 0 (a backward case first runs the forward with
  // the same backend to produce O and LSE). Outputs are poisoned (all bits set: NaN) first.
  Status run_once();
  // Median milliseconds over `iters` runs after `warmup` runs, rotating input sets.
  Status time(int warmup, int iters, double* median_ms);
  // Compares the outputs of the last run_once() with the oracle. With `budget_flops` > 0, runs
  // the oracle on a random sample of rows (forward) or KV-head groups (backward) when the full
  // oracle would cost more.
  CheckResult check(double budget_flops = 0.0) const;

  Backend backend_used() const { return backend_used_; }

  // Multiplies the downloaded result (o, or dq for a backward case) by `factor`: lets tests prove
  // that check() rejects a wrong answer.
  void perturb_result_for_testing(float factor);

 private:
  struct Set;
  Params views(const Set& set, bool host_copies, bool with_lse) const;
  Status prepare_backward_inputs(int set);
  Status run(int set, Direction direction);

  CaseSpec spec_;
  Device device_;
  std::vector<std::unique_ptr<Set>> sets_;
  Buffer workspace_;
  Backend backend_used_ = Backend::auto_select;
  bool backward_ready_ = false;
  void* stream_ = nullptr;
};

// True when this build can use CUDA device 0.
bool cuda_available();
// A readable name of the device (CPU model or GPU name).
std::string device_description(Device device);

}  // namespace fmha::tools
