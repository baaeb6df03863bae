// The fast CPU path's block sizes as named variants, as the GPU tiers' tile configurations are
// (src/cuda/common/variant.h): the tuner (src/tune/) times each of them, FMHA_CPU_CONFIG=<name>
// forces one. The register tile itself (64 x 64 scores, src/cpu/simd.h) is fixed by the matmul
// kernel and is not a variant; what varies is how much of K/V (or Q/dO) is converted to fp32 at
// once, which trades the working set against L2 reuse, and how finely a head's work is cut
// between threads, which trades load balance against per-chunk overhead, and up to what size a
// backward keeps its score tiles instead of forming them twice, which trades memory for a matmul
// (two, for fp16/bf16 storage, whose statistics also form dP).
#pragma once

#include <cstdint>

namespace fmha::cpu {

struct CpuConfig {
  const char* name;
  int64_t key_block;        // keys converted at once (forward, backward statistics pass); a multiple of 64
  int64_t query_block;      // queries converted at once (backward fused pass); a multiple of 64
  int64_t max_chunk_tiles;  // at most this many 64-row tiles per work item (the fused pass: per key chunk,
                            // whose dQ shares are summed in chunk order, so it also fixes that order)
  int64_t score_cache_bytes;  // backward: a call whose S^T tiles fit keeps them (as the statistics pass's
                              // exponents) for the fused pass (src/cpu/fast_attention.cpp, ScoreCache); 0: never
  int64_t row_score_bytes;    // backward: a fused item that spans every key its queries see forms their
                              // statistics itself, keeping one query tile's S^T tiles (as exponents; and,
                              // 16-bit storage, dP^T) up to this size for its own use; 0: never
};

// A few L2 caches' worth: kept tiles that spill to memory would cost about what forming them again does.
inline constexpr int64_t kScoreCacheBytes = int64_t(8) << 20;
// A core's L2 or so: a query tile's row of S^T tiles (16 KiB a key tile) against 8,192 keys, or
// S^T and dP^T against 4,096 (on the 2-core CI machine kind the bf16 seed shape, 4,096 keys, ran
// 1.2–1.4× faster with this budget than with half of it, which left it to the statistics pass).
inline constexpr int64_t kRowScoreBytes = int64_t(2) << 20;

inline constexpr CpuConfig kCpuConfigs[] = {
    {"k2048", 2048, 2048, 8, kScoreCacheBytes, kRowScoreBytes},  // the default: 2048 keys of D = 64 are 512 KiB
                                                                 // per K/V panel pair
    {"k512", 512, 512, 8, kScoreCacheBytes, kRowScoreBytes},     // panels that stay in a small L2
    {"k1024", 1024, 1024, 8, kScoreCacheBytes, kRowScoreBytes},
    {"k4096", 4096, 4096, 8, kScoreCacheBytes, kRowScoreBytes},  // fewer conversions of the queries in the backward
    {"c2", 2048, 2048, 2, kScoreCacheBytes, kRowScoreBytes},     // short chunks: better balance on few heads
    {"c16", 2048, 2048, 16, kScoreCacheBytes, kRowScoreBytes},   // long chunks: fewer re-conversions of K/V per head
    {"recompute", 2048, 2048, 8, 0, 0},  // a separate statistics pass, and the fused pass forms S^T again
};
inline constexpr int kCpuVariants = int(sizeof(kCpuConfigs) / sizeof(kCpuConfigs[0]));
inline constexpr int kCpuDefaultVariant = 0;
inline constexpr const char* kCpuConfigVariable = "FMHA_CPU_CONFIG";

constexpr bool valid(const CpuConfig& c) {
  return c.key_block > 0 && c.key_block % 64 == 0 && c.query_block > 0 && c.query_block % 64 == 0 &&
         c.max_chunk_tiles > 0 && c.score_cache_bytes >= 0 && c.row_score_bytes >= 0;
}
static_assert([] {
  for (const CpuConfig& c : kCpuConfigs)
    if (!valid(c)) return false;
  return true;
}());

}  // namespace fmha::cpu
