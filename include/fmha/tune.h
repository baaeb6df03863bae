// fmha tuning: every backend tier except the oracle has named variants (tile sizes, pipeline
// depth, warps; on the CPU the block sizes). tune() times each variant that runs a problem class
// on this device, checks each against the default variant's output, and records the fastest in
// an on-disk cache that every later call of that class uses. (C++17 and later.)
//
// Which variant a call runs, in this order: the tier's FMHA_*_CONFIG environment variable; the
// cache's winner for the call's class on this device; the tier's built-in default.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha {

enum class MaskKind : int { none, causal, window };

// What a tuned variant is recorded for. Calls of one class share a winner: the tier, direction,
// storage (fp32, tf32, fp16, bf16), head dims, mask kind, GQA ratio and sequence lengths
// rounded up to a power of two (from 64 up). Batch and head counts are not part of it.
struct ProblemClass {
  Backend tier = Backend::cpu;
  Direction direction = Direction::forward;
  DType dtype = DType::fp32;
  Precision precision = Precision::ieee;
  int64_t head_dim = 0, head_dim_v = 0;
  MaskKind mask = MaskKind::none;  // causal wins over window when both are set
  int64_t group = 1;               // query heads per KV head
  int64_t seqlen_q_bucket = 0, seqlen_k_bucket = 0;
  bool deterministic = false;      // backward only (it changes the GPU backward's kernels)
  // sm80 calls of the decode kernel (a KV cache, or at most 16 queries a sequence in fp16/bf16):
  // their variants are split counts ("decode", "decode-half", "decode-twice", "decode-unsplit":
  // the heuristic's count, half, twice, one), chosen per class; Params::num_splits overrides.
  // How well a split count fills the GPU depends on the kernel's CTAs before splitting (batch ·
  // KV heads · tiles of 16 packed query rows), so for these calls that count, rounded up to a
  // power of two, is part of the class.
  bool decode = false;
  int64_t decode_blocks_bucket = 0;

  // The cache's key, e.g. "sm90 fwd bf16 d128 causal g1 q4096 k4096" ("... decode b8" for decode).
  std::string key() const;
};

// The class of a call on the backend that would run it (auto_select resolved). Reads the shapes,
// types, devices and options of q, k and v only (their data may be null). Errors as supports().
Status problem_class(const Params& params, Direction direction, ProblemClass* out);

// The variant a call would run and why: source is "tuner", "variable", "cache" or "default".
// The reference backend has no variants (variant empty). `precision` is the arithmetic the call
// runs in: the call's own, but tf32x3 where `auto` meets an fp32 `ieee` call with split tf32
// (Precision's comment in fmha.h says where).
struct VariantChoice {
  Backend backend = Backend::auto_select;
  std::string variant;
  std::string source;
  Precision precision = Precision::ieee;
};
Status selected_variant(const Params& params, Direction direction, VariantChoice* out);

struct TuneOptions {
  int warmup = -1;  // runs before timing; -1: 5 on a GPU, 1 on the CPU
  int iters = -1;   // timed runs (the median counts); -1: 20 on a GPU, 3 on the CPU
  int rotate = 0;   // input sets timed in turn; 0: enough to exceed a GPU's L2 (1 on the CPU)
  bool write_cache = true;
  // Called before each variant is measured and once at the end (done == total).
  std::function<void(int done, int total, const std::string& variant)> progress;
};

struct VariantTiming {
  std::string variant;
  bool is_default = false;
  bool agrees = false;    // ran, and its outputs match the default's
  double ms = 0.0;        // median time; 0 when it was not timed
  double difference = 0;  // relative L2 difference from the default's outputs (worst output)
  std::string status;     // "ok", or why it was not timed or cannot win
};

struct TuneResult {
  ProblemClass problem;
  std::string device;  // the device as the cache names it
  std::string default_variant, winner;
  double default_ms = 0.0, winner_ms = 0.0;
  std::vector<VariantTiming> variants;  // every variant of the tier, in the tier's order
};

// Tunes the class of a call with the shapes, types, device and options of `params` (their data
// are not read: the tuner allocates its own inputs on that device). Each variant that runs the
// class is first run once and compared with the default variant's outputs on the same inputs
// (within twice the accuracy rule's tolerance, src/common/tolerance.h); one that fails or
// disagrees is never chosen. The others are timed as `fmha bench` times (warm-up, median, on a
// GPU CUDA events and inputs rotated past the L2). The fastest is written to the cache; another
// variant displaces the default only when it is more than 2 % faster (timing noise is not a win).
Status tune(const Params& params, Direction direction, const TuneOptions& options, TuneResult* result);

// The cache file: $FMHA_TUNE_CACHE, else $XDG_CACHE_HOME/fmha/tune.json, else
// ~/.cache/fmha/tune.json. Empty when none of those can be formed.
std::string tune_cache_path();
// Removes the cache file (and forgets what this process read from it).
Status clear_tune_cache();

// Autotuning: when on, the first call of a class the cache has no winner for tunes it first.
// Off by default; FMHA_AUTOTUNE=1 turns it on for the process, set_autotune overrides that.
void set_autotune(bool enabled);
bool autotune_enabled();

const char* to_string(MaskKind mask);

}  // namespace fmha
