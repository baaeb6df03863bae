// The fuzz suite's host side: a generator of random attention calls, the same-precision naive
// computation, and the check of one call against the fp64 oracle. The CPU suite
// (tests/test_fuzz.cpp) and the GPU suite (tests/gpu/fuzz_gpu_test.cpp) share all of it; only
// the Runner that executes a call differs.
//
// THE RULE (FlashAttention's, in the 2-norm over each tensor, which a single unlucky element
// does not decide; stated once here). For each output X of a call with n elements,
//     ||X - X_fp64||  <=  kNaiveFactor · ||X_naive - X_fp64||
//                         + kStorageFactor · u_storage · ||X_fp64||
//                         + kAccumulationFactor · u_fp32 · unit_X · sqrt(n)
// where X_fp64 is the oracle on the same stored inputs (src/cpu/reference), X_naive is the plain
// computation in the call's precision (fp32 arithmetic as PyTorch's math path does it: scores,
// softmax with its row max, P·V; backward P^T·dO, dP, Δ = rowsum(P∘dP) (fp16/bf16 storage:
// rowsum(dO∘O) from O rounded to the storage, as every backward forms it), dS; inputs rounded to tf32
// under tf32; P and dS rounded to the matmul format before their products; outputs rounded to the
// storage dtype; its error is the larger of two runs that sum the dot products over the head dim
// in opposite orders, since one order's rounding can cancel by chance), u_storage is the unit roundoff of the output's storage format, and unit_X is the
// size of one term summed into X (|V| for O, |dO| for dV, |scale|·|dO|·|V|·Dv·|K| for dQ,
// likewise for dK): the residue that fp32 sums leave where the exact answer cancels to zero.
// (For dQ and dK, Dv rather than sqrt(Dv): it bounds the sum of |dO|·|V| over the head dim; and
// times sqrt(the most keys a row sees) for dQ, sqrt(the most query rows, over the heads of a
// group, that see a key) for dK: each such row's residue is summed into the element. Where a
// row sees one key the exact dS is 0 and these residues are all of dK: tf32 products carry 22
// significant bits, so their fp32 sums round where bf16's 16-bit products mostly do not.)
// Elements the mask makes exact must be exact: O = 0 and LSE = -inf on rows that see no key,
// dQ = 0 there, dK = dV = 0 for keys no query sees. NaN (outputs are poisoned) never passes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::fuzz {

inline constexpr double kNaiveFactor = 3.0;
inline constexpr double kStorageFactor = 2.0;
inline constexpr double kAccumulationFactor = 4.0;

// How the [B, S, H, D] tensors are laid out in memory.
enum class Layout : int { bshd, bhsd, padded };

// One random call, drawn entirely from its seed.
struct Config {
  uint64_t seed = 0;
  Backend backend = Backend::cpu;
  DType dtype = DType::fp32;
  Precision precision = Precision::ieee;
  int64_t batch = 1, heads = 1, kv_heads = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 1, head_dim_v = 1;
  Causal causal = Causal::none;
  int64_t window_left = -1, window_right = -1, q_offset = 0;
  float softmax_scale = 0.f;  // 0: 1/sqrt(head_dim)
  float magnitude = 1.f;      // standard deviation of every input
  Layout layout = Layout::bshd;
  bool deterministic = false;
  bool backward = true;       // also run and check the backward

  std::string describe() const;
};

// What the generator may draw for one backend.
struct Tier {
  Backend backend = Backend::cpu;
  struct Flavor {
    DType dtype;
    Precision precision;
    int64_t max_head_dim = 0;  // 0: any of the tier's head dims; else those up to it (and at least one)
  };
  std::vector<Flavor> flavors;
  std::vector<int64_t> head_dims;  // empty: any head dim from 1 to kMaxHeadDim, odd ones included
  bool backward = true;
  int64_t max_seqlen = 0;
  double max_work = 0;             // cap on batch·heads·seqlen_q·seqlen_k·(head_dim + head_dim_v)
  // fp16/bf16 storage: cap on the typical logit |scale|·magnitude²·sqrt(head_dim). Above ~4 a
  // backward whose Δ = rowsum(dO∘O) comes from O as stored loses dS to O's rounding (dQ/dK at
  // 3-10x the naive error; the GPU tiers' preprocess does this, a known gap): such calls are
  // drawn with the default scale and magnitude 1 instead. The CPU path corrects Δ: no cap.
  double max_low_precision_logit = 4.0;
};

inline constexpr int64_t kMaxHeadDim = 160;

// The tier description of each backend (the GPU tiers take the head dims this build compiled).
Tier cpu_tier();
Tier gpu_tier(Backend backend, const std::vector<int64_t>& compiled_head_dims);

// The sm90 tier's largest head dims of fp32 storage: tf32 and split tf32 (tf32x3).
inline constexpr int64_t kSm90Tf32MaxHeadDim = 128, kSm90Tf32x3MaxHeadDim = 64;

// The tier's head dims a flavor may draw (all where it has no limit; empty for the CPU tier's
// free head dims).
std::vector<int64_t> flavor_head_dims(const Tier& tier, const Tier::Flavor& flavor);

Config generate(uint64_t seed, const Tier& tier);

// Host storage of every tensor of a call, in the config's layout, and CPU views of it. Inputs
// are random N(0, magnitude²) rounded to the dtype; outputs are poisoned (all bits set: NaN).
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor view;  // CPU view into `bytes`
};

struct Problem {
  Config config;
  HostTensor q, k, v, o, lse, dout, dq, dk, dv;
  Params params() const;  // CPU views of everything, with the config's options
};

Problem make_problem(const Config& config);

// Executes `params` (views into a Problem's host tensors) in `direction`; on return the outputs
// hold the results. The CPU runner calls the API directly; the GPU runner copies to a device.
using Runner = std::function<Status(const Params& params, Direction direction)>;

// One output's errors against the oracle (2-norms): the backend's and the naive computation's.
struct TensorError {
  std::string name;
  double kernel = 0, naive = 0, ref = 0;
};

struct Outcome {
  bool refused = false;  // the backend does not support this call (Code::unsupported)
  std::string failure;   // empty when the call passed (or was refused)
  std::vector<TensorError> errors;  // o, lse, then dq, dk, dv
};

// Runs the config's forward, checks O and LSE, then (when config.backward) its backward on the
// forward's own O and LSE, and checks dQ, dK and dV.
Outcome check(const Config& config, const Runner& runner);

// The peaked softmax: scale 1.0 and inputs of standard deviation kPeakedMagnitude at head dim 128
// (scores of ~100: one key dominates each row, its P near 1). The generator draws this class as
// scores of that size at any head dim (kPeakedLogit); peaked_config makes the fixed cases.
inline constexpr float kPeakedMagnitude = 3.f;
inline constexpr double kPeakedLogit = 100.0;  // the standard deviation of the scores drawn peaked

// THE PEAKED BOUND, on dQ, dK and dV of a peaked call (tighter than the fuzz rule, which lets the
// backward's own rounding through):
//     ||X - X_fp64||  <=  kPeakedNaiveFactor · ||X_naive - X_fp64||  +  kPeakedRoundingFactor · u_fp32 · ||X_fp64||
// A backward that recovers P from an fp32 LSE of ~100, or forms Δ from O as stored, misses it
// (dV ~60x, dQ and dK 2-10x the naive error on such calls).
inline constexpr double kPeakedNaiveFactor = 2.0;
inline constexpr double kPeakedRoundingFactor = 2.0;

// The call with its softmax scale negated (the default 1/sqrt(head_dim) made explicit first):
// P then favours the smallest scores, which every tier takes by the sign of its scale (the
// kernels' score_sign and their plain, unfolded update). The generator draws positive scales only.
Config with_negative_scale(Config config);

// A peaked call: batch 1, one KV head with `group` query heads, 256 queries and 200 keys (so that
// bottom_right leaves the first rows with no key), fp32 storage, head dims `head_dim`.
Config peaked_config(uint64_t seed, Backend backend, Precision precision, Causal causal, int64_t group,
                     int64_t head_dim, bool deterministic);

// Empty when dQ, dK and dV of `outcome` (from check) are within the peaked bound; otherwise what
// is not, one line per tensor.
std::string peaked_failure(const Outcome& outcome);

// The seeds of one run: FMHA_FUZZ_SEED=<seed> replays one case; otherwise `count` cases
// (FMHA_FUZZ_COUNT overrides it) from a fixed base, FMHA_FUZZ_BASE_SEED=<n>, or
// FMHA_FUZZ_BASE_SEED=clock (fresh cases every run). Shard `shard` of `shards` takes every
// shards-th of them.
std::vector<uint64_t> seeds(int64_t count, int shard, int shards);

}  // namespace fmha::fuzz
