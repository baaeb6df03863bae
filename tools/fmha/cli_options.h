// The flags that describe one attention case, shared by `fmha run` and `fmha bench`.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "harness.h"

namespace fmha::tools {

struct RunOptions {
  std::string backend = "auto";
  int64_t batch = 4, heads = 4, kv_heads = 0, seqlen_q = 4096, seqlen_k = 0, head_dim = 64, head_dim_v = 0;
  std::string dtype = "fp32";
  std::string precision;  // empty: ieee (tf32 with --dtype tf32)
  std::string causal = "none";
  std::string window;  // "L,R"
  std::string seqlens_q, seqlens_k;  // varlen: "100,2000,37"
  int64_t q_offset = 0;
  std::string mode = "fwd";
  int iters = -1;       // -1: 20 on a GPU, 3 on the CPU
  int warmup = -1;      // -1: 5 on a GPU, 1 on the CPU
  int64_t seed = -1;    // -1: a fresh random seed (reported)
  int threads = 0;
  int num_splits = 0;
  float scale = 0.f;
  bool deterministic = false;
  bool no_lse = false;
  bool paged = false;       // K/V in a paged cache of page_size rows per page, pages shuffled
  int64_t page_size = 64;
  bool check = false;
  bool json = false;

  // Validates the flag values and fills `spec`; on failure `error` names the flag.
  bool to_case(CaseSpec* spec, std::string* error) const;
};

void add_case_options(CLI::App* app, RunOptions& opt);

// The device a backend choice runs on: CUDA device 0 for GPU tiers (and for auto where one
// exists), else the CPU. Fails for a GPU tier when no CUDA device is usable.
bool choose_device(Backend backend, Device* device, std::string* error);

}  // namespace fmha::tools
