// The sm90 tier's tile configurations, chosen in one place from (storage dtype, head dim,
// variant). Hopper offers 227 KiB of shared memory per block; every shape here fits it.
//
// A block is one producer warpgroup (one warp issues the TMA copies; its registers are given
// back) and `consumers` warpgroups of 64 query rows each, so a query tile is consumers · 64 rows.
// Tiles are stored in shared memory as 128-byte swizzled column chunks of 64 16-bit elements
// (32 fp32 ones): head dims are padded to a multiple of 64 there (96 → 128; the padding is
// zero-filled by TMA).
//
// fp32 storage runs with precision tf32: in the forward, Q·Kᵀ on tf32 wgmma straight from the
// TMA tiles (the tensor cores read the top 19 bits of each fp32 operand: Q and K are truncated to
// tf32), P rounded to tf32 in registers, and V transposed into Vᵀ (keys contiguous: tf32 wgmma
// takes K-major operands only) and rounded to tf32 by the producer warpgroup's three idle warps;
// the backward (head dim 64) transposes Q, dO and K in its consumers (BwdConfig below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/sm90/sm90_bwd_blocks.h"
#include "cuda/tile/split_tf32.h"

namespace fmha::cuda::sm90 {

using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using fp32_t = float;
using tf32x3_t = tile::tf32x3;  // fp32 storage, split-tf32 products (Precision::tf32x3)
// Whether storage type T runs split tf32 (the kernels' residual tiles, the backward's own statistics).
template <class T>
inline constexpr bool is_split_tf32 = std::is_same_v<T, tf32x3_t>;

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kConsumerRows = 64;  // query rows per consumer warpgroup (wgmma M)
inline constexpr int kChunkCols = 64;     // 16-bit columns per 128-byte swizzled chunk
// Columns per 128-byte swizzled chunk of an element size (host side; tile::warpgroup::kChunkCols<T>
// on the device): 64 of 16 bits, 32 of fp32.
constexpr int chunk_cols(size_t element_bytes) { return 128 / int(element_bytes); }
// Head dims rounded up to whole swizzled chunks.
constexpr int padded_head_dim(int head_dim) { return (head_dim + kChunkCols - 1) / kChunkCols * kChunkCols; }

// Register budgets after setmaxnreg: the producer keeps few, the consumers take the rest of the
// block's pool, which is what __launch_bounds__(threads, 1) gives each thread at launch (the
// 64K-register file over the threads, in steps of 8) times the threads: setmaxnreg.inc waits
// until the pool has the registers, so a split above it never starts (register_pool).
// 128 · 24 + 256 · 240 = 64,512 = 168 · 384 with two consumer warpgroups,
// 128 · 32 + 384 · 160 = 65,536 = 128 · 512 with three.
// A packed (variable-length) call's producer also walks the sequence table and publishes each
// work tile's sequence: it gets 40 registers and the consumers 232 (64,512) or 152 (63,488), at
// every head dim, where neither side then spills (-Xptxas -v, every variant at 64 and 128, and
// pingpong and spec at 192 and 256). At 24 the producer spilled its work tile's sequence and plan
// (25 local-memory instructions at 192, 42 at 256; spec's consumers at 240 spilled 8 more); at 232
// the consumers of 192 and 256 then spilled 48 bytes (2026-12-04), which they no longer do.
// fp32 storage (tf32 and split tf32): the producer's other three warps also transpose V, and in
// split tf32 split every K tile and write two Vᵀ tiles a V tile (sm90_fwd_kernel.cuh). With 24
// registers the splitting warps spilled 12 bytes (-Xptxas -v, dense), and the tf32 kernel's
// producer thread 4 (a value kept across its work tiles); with 40 neither spills, nor do the
// consumers at 232 (head dims 64, 96, 128). `transposing`: the kernel stores fp32.
constexpr bool producer_raised(bool packed, bool transposing = false) { return transposing || packed; }
constexpr int producer_registers(int consumers, bool packed = false, bool transposing = false) {
  if (producer_raised(packed, transposing)) return 40;
  return consumers == 2 ? 24 : 32;
}
// The registers a block of `threads` threads holds under __launch_bounds__(threads, 1): its
// per-thread cap (the 64K-register file over the threads, rounded down to a multiple of 8) for
// every thread. The producer's and consumers' setmaxnreg budgets must fit it.
constexpr int register_pool(int threads) { return 65536 / threads / 8 * 8 * threads; }
constexpr int consumer_registers(int consumers, bool packed = false, bool transposing = false) {
  if (!producer_raised(packed, transposing)) return consumers == 2 ? 240 : 160;
  return consumers == 2 ? 232 : 152;
}
inline constexpr size_t kSharedLimit = 227 * 1024;


// The forward's configurations. FMHA_SM90_FWD_CONFIG=<name> picks one at the tuned head dims
// (64 and 128 by default; the others compile the default only):
//   pingpong  overlap, and the consumer warpgroups take turns issuing their matrix work (named
//             barriers), so one warpgroup's softmax runs while the other's GEMMs hold the tensor
//             cores; the turns carry on from one work tile into the next (a warpgroup starts the
//             next tile's first Q·Kᵀ while the other still finishes its last P·V and epilogue);
//             lazy rescaling (a row's exponent base moves only when its max grows by more than
//             2^8, so most key tiles skip multiplying the output rows) (the default)
//   overlap   intra-warpgroup overlap only: tile j+1's S = Q·Kᵀ is issued before tile j's
//             O += P·V, so the softmax of one tile runs under the other's matrix work
//   serial    each tile's S, softmax, then P·V, one after the other (the baseline the overlap is
//             measured against)
//   eager     pingpong rescaling the output rows on every key tile (the baseline lazy rescaling
//             is measured against)
//   poly8     pingpong with one exponential in 8 on the FMA pipe (tile::exp2_poly), the rest on
//             the MUFU unit
//   n144      pingpong on 144-key tiles (head dims up to 128): an eighth more keys share each
//             tile's fixed costs (turn hand-over, waits, row-max shuffles, descriptor set-up);
//             160 keys spilled 112 bytes inside the loop at head dim 128 (ptxas), 144 spill
//             24 bytes, outside it
//   spec      pingpong whose exponentials start on each row's current base before the key
//             tile's row max is known (OnlineSoftmax::update_speculative): one vote afterwards
//             confirms that every exponential stayed within the lazy bound (each lane's share of
//             each row's sum at most 2^8), else the rows take the exact path from the kept
//             exponents; the row max leaves the path from a tile's Q·Kᵀ to its P·V
// Measured on an H200 (docs/PERF.md, 2026-12-04): lazy rescaling +3-9 % at head dim 128 from 4k
// keys, level at 1k and at head dim 64 (not measured at 192/256); a third K/V stage (O staged
// over Q) lost 1-7 % at 128; carrying the turns across work tiles +3-7 % at head dim 128 from 2k
// keys, level at 512/1k; hinting the next work tile's Q and first K into L2 gained nothing.
struct FwdConfig {
  int consumers;  // consumer warpgroups
  int tile_n;     // keys per tile
  int stages;     // K/V tiles in flight
  bool overlap;   // intra-warpgroup overlap of softmax and matrix work
  bool pingpong;  // consumer warpgroups issue their GEMMs in turn (needs overlap)
  // The softmax scale folded into the exponent (one FMA per score) rather than a multiply first.
  // Measured on an H200 (docs/PERF.md): +18 % at head dim 64; at 128 it once lost 10-15 %, but
  // with P converted at the top of the next key tile it measured level (2026-12-04), and it keeps
  // the softmax between the two wgmma waits in the SASS (the multiply-first form let the compiler
  // hoist the P·V wait above it): on at every head dim.
  bool fold_scale;
  // Lazy rescaling (OnlineSoftmax::update_scaled<FAST, true>); needs fold_scale.
  bool lazy_rescale;
  // Pingpong turns carried from one work tile into the next (opened once per block).
  bool chain_turns;
  // Every poly_every-th exponential of a row on the FMA pipe (0: all on the MUFU unit).
  int poly_every = 0;
  // Exponentials on the current base before the row max (OnlineSoftmax::update_speculative); needs
  // lazy_rescale, overlap and poly_every 0.
  bool speculate = false;
  constexpr int tile_m() const { return consumers * kConsumerRows; }
  constexpr int threads() const { return (consumers + 1) * kWarpgroupThreads; }
};

inline constexpr int kFwdVariants = 7;
inline constexpr const char* kFwdVariantNames[kFwdVariants] = {"pingpong", "overlap", "serial", "eager",
                                                               "poly8",    "n144",    "spec"};
inline constexpr int kFwdDefault = 0;

// The variant a call runs when FMHA_SM90_FWD_CONFIG names none: spec for dense calls at head dims
// 64, 128 and 256, at every length and mask (on an H200 against pingpong: +5-8 % at 128 from 4k
// keys, -2 % at 1k causal; +4-15 % at 64, where it also passed c3 (retired) and poly8, the earlier
// defaults there: docs/PERF.md, run 25; at 256 on an H100, once the vote on the row sum left it
// without spills: +5.9-14.5 % from 2k keys, causal +1.8-9.4 %, level at 512: run 98); pingpong for
// packed calls (spec's packed kernel has no local memory at 64, 128 and 256 since 2026-12-07,
// -Xptxas -v; its speed on packed calls is not measured yet) and at 96 and 192 (not measured). spec
// is compiled at these three head dims in every build (cmake/cuda.cmake, FMHA_SM90_SPEC_HEAD_DIMS),
// every variant at the tuned ones.
// Two variants measured here were retired (docs/PERF.md, "sm90 forward: c3 and restart retired"):
// c3, pingpong over three consumer warpgroups (192-row query tiles), which lost to spec and poly8
// at 64 (run 25), spilled at 64 and 128 and could not compile above 192; and restart, pingpong
// whose turns restart at every work tile, the baseline the carried turns were measured against
// (+3-7 % at 128 from 2k keys).
inline constexpr int kFwdOverlap = 1;
inline constexpr int kFwdSerial = 2;
inline constexpr int kFwdEager = 3;
inline constexpr int kFwdPoly8 = 4;
inline constexpr int kFwdN144 = 5;
inline constexpr int kFwdSpeculate = 6;
inline constexpr int kWideKeys = 144;  // keys per tile of n144
constexpr int default_fwd_variant(int head_dim, bool packed) {
  return !packed && (head_dim == 64 || head_dim == 128 || head_dim == 256) ? kFwdSpeculate : kFwdDefault;
}
// Whether a build compiles `variant` (fp16, bf16) at a head dim: every variant where the head dim
// is tuned (FMHA_TUNED_HEAD_DIMS), else the default, and spec where
// `spec_built` (FMHA_SM90_SPEC_HEAD_DIMS). A request for one it does not compile is ignored there.
constexpr bool fwd_variant_built(int variant, bool tuned, bool spec_built) {
  return tuned || variant == kFwdDefault || (spec_built && variant == kFwdSpeculate);
}

// The head dims the tf32 forward (fp32 storage) takes: padded to at most 128 (64, 96, 128), where
// a query tile, two K and two Vᵀ stages and the V landing buffer of fp32 fit shared memory.
inline constexpr int kTf32MaxHeadDim = 128;
constexpr bool tf32_head_dim(int head_dim) { return head_dim >= 64 && padded_head_dim(head_dim) <= kTf32MaxHeadDim; }

// The tf32 forward's configuration: the default schedule (pingpong, carried turns, lazy
// rescaling, folded scale) alone; fp32 tiles take twice the bytes and V has a landing buffer next
// to its Vᵀ ring: 96 keys at head dim 64 (Q 32 KiB + 2 × 24 K + 24 V + 2 × 24 Vᵀ = 152 KiB, O
// staged apart), 64 keys at 96 and 128 (64 + 2 × 32 + 32 + 2 × 32 = 224 KiB; O staged over Q).
// P as tf32 takes a register per element (twice the 16-bit fragments): with 128 keys at head
// dim 64 the consumers spilled at 240 registers (-Xptxas -v: 20 bytes), with 96 none do. Key
// tiles are whole 32-key chunks of Vᵀ.
inline constexpr int kTf32KeysSmall = 96;  // keys per tile at head dim 64
inline constexpr int kTf32KeysLarge = 64;  // at 96 and 128
constexpr FwdConfig tf32_fwd_config(int head_dim) {
  return FwdConfig{2, padded_head_dim(head_dim) <= 64 ? kTf32KeysSmall : kTf32KeysLarge, 2, true, true, true, true,
                   true};
}

// The split-tf32 forward (fp32 storage, Precision::tf32x3): every product of Q·Kᵀ and P·V as
// three tf32 ones, hi·hi + hi·lo + lo·hi, each operand x split into hi = tf32(x) and the residual
// lo = tf32(x − hi). Beside the tf32 forward's tiles it keeps the residuals of Q, of each K stage
// and of each Vᵀ stage: at head dim 64 with 64 keys, Q 32 KiB twice, K 2 × 16 twice, the V landing
// buffer 16 and Vᵀ 2 × 16 twice = 208 KiB (O staged over Q); head dim 64 only. P's residual
// fragments double its registers; each key tile's P·V is formed in an accumulator of its own and
// added to O in fp32 (the tensor cores' additions along a whole sequence would lose more than
// fp32 does: docs/perf/split_tf32_accumulation_model.py).
inline constexpr int kTf32x3MaxHeadDim = 64;
inline constexpr int kTf32x3Keys = 64;
constexpr bool tf32x3_head_dim(int head_dim) {
  return head_dim >= 64 && padded_head_dim(head_dim) <= kTf32x3MaxHeadDim;
}
constexpr FwdConfig tf32x3_fwd_config() {
  return FwdConfig{2, kTf32x3Keys, 2, true, true, true, true, true};
}

// The forward's query buffers (FwdShared::kQBuffers, one or two) and work-tile slots (two per
// buffer): the block's n-th work tile, as producer and consumers both count them, takes query
// buffer n % buffers, whose barriers are then in phase (n / buffers) % 2 (a PipelineState of
// `buffers` stages advanced n times), and slot n % (2 · buffers) for its index and plan. The
// producer rewrites tile n's slot after tile n − buffers has released its queries, so the slot
// must differ from those of the tiles the consumers may still read: n − 1 ... n − buffers.
constexpr int fwd_query_buffer(unsigned n, int buffers) { return int(n % unsigned(buffers)); }
constexpr uint32_t fwd_query_phase(unsigned n, int buffers) { return (n / unsigned(buffers)) % 2; }
constexpr int fwd_work_slot(unsigned n, int buffers) { return int(n % unsigned(2 * buffers)); }

// Keys per tile and stages for a head dim: the largest score tile whose K/V ring still fits
// shared memory next to the query tile (Q 128 × D, K and V stages of tile_n × D each).
// element_bytes 4 (fp32 storage, tf32): tf32_fwd_config, whatever the variant (only the default
// is compiled).
constexpr FwdConfig fwd_config(int head_dim, int variant, int element_bytes = 2) {
  if (element_bytes == 4) return tf32_fwd_config(head_dim);
  const int d = padded_head_dim(head_dim);
  // Lazy rescaling and turns carried across work tiles: the default and the variants built on it.
  const bool on_default = variant == kFwdDefault || variant == kFwdPoly8 || variant == kFwdN144 ||
                          variant == kFwdSpeculate;
  FwdConfig c{2, 128, 2, true, true, true, on_default, on_default};
  if (variant == kFwdPoly8) c.poly_every = 8;
  if (variant == kFwdSpeculate) c.speculate = true;
  if (variant == kFwdN144 && d <= 128) c.tile_n = kWideKeys;
  if (d <= 64) c.stages = 3;
  if (d == 192) c.tile_n = 96;
  if (d == 256) c.tile_n = 64;
  if (variant == kFwdOverlap) c.pingpong = false;
  if (variant == kFwdSerial) c.overlap = c.pingpong = false;
  return c;
}

// The backward's configurations. A block owns one tile of keys of one (batch, KV head) and walks
// the query tiles of every head of the GQA group that sees them, BwdConfig::rows query rows at a time,
// through a ring of (Q, dO, LSE, Δ) stages; two consumer warpgroups.
//
// Head dims up to 128 (by_keys): 128 keys per block, one consumer warpgroup per 64 keys; dK and
// dV stay in registers ([64, HD] fp32 each per warpgroup: 128 registers per thread at 128).
//
// Head dims 192 and 256 (split_head_dim): [64, 256] fp32 twice would be 256 registers per thread,
// so a block owns 64 keys and the two warpgroups split the work two ways:
//   Sᵀ, dPᵀ [64 keys, 64 q] by query columns: warpgroup w computes [64 keys, 32 q] of each (one
//     m64n32 wgmma chain over the head dim, no work done twice), and stores its Pᵀ and dSᵀ
//     columns into shared memory, where both warpgroups read all 64 query rows of them;
//   dK, dV [64 keys, D] and dQ [64 q, D] by head-dim columns: warpgroup w owns whole 64-column
//     chunks (256: 128 and 128; 192: 128 and 64; an MN-major wgmma operand cannot start inside a
//     128-byte swizzled chunk), so dK + dV are at most 2 · 64 = 128 registers per thread and the
//     dQ share 64.
// Shared memory (bytes, 16-bit storage; D = 256 | 192):
//   K, V     64 × D × 2 each                        65,536 | 49,152
//   Q, dO    64 × D × 2 each per stage, stages 1 | 2  65,536 | 98,304
//   P, dS    [64 q, 64 keys] one buffer each          16,384 | 16,384
//   dQ       64 × (D + 8) × 4 fp32 staging             67,584 | 51,200
//   LSE, Δ   64 × 4 each per stage                        512 |  1,024
//   210.5 KiB | 211.0 KiB of the 227 KiB (plus barriers and the 1 KiB alignment slack). A second
//   Q/dO stage at 256 (+64 KiB) or a second P/dS buffer (+16 KiB, which would save a barrier per
//   step) does not fit next to the dQ staging tile.
// Registers (240 per consumer thread): dK + dV 128, dQ share 64, Sᵀ and dPᵀ 16 each (dead before
// dQ is issued), their 16-bit fragments 8 each.
//
// fp32 storage (precision tf32), head dim 64: tf32 wgmma reads both operands K-major, so
// besides the tiles TMA brings, dK += dSᵀ·Q and dV += Pᵀ·dO need Qᵀ and dOᵀ ([HDP, 64 q], query
// rows contiguous, permuted as the register fragments of Pᵀ and dSᵀ are) and dQ = dS·K needs Kᵀ
// ([HDP, keys]); the consumers transpose them in shared memory (sm90_bwd_mainloop.cuh). Shared
// memory (bytes, D = 64): K, V, Kᵀ 32,768 each; Q, dO, Qᵀ, dOᵀ 16,384 each (one stage); dS [64 q,
// 128 keys] 32,768 (one buffer); dQ 18,432: 210.5 KiB. A second Q/dO stage (+32 KiB) does not
// fit; at head dim 128 neither does one (K, V and Kᵀ alone take 192 KiB at 128 keys).
// fp32 storage at head dims 96 and 128 (the wide tf32 backward): 64 keys a block and the split
// above — warpgroup w takes query columns [32 w, 32 w + 32) of Sᵀ and dPᵀ (SS, K/V and Q/dO as they
// land, dO rounded to tf32 in place first), then head-dim rows [64 w, 64 w + 64) of the
// transposed gradients, each from a register A operand loaded transposed from a landed tile
// (load_transposed_a_tf32), so that no transposed copy of Q, dO or K is kept:
//   dVᵀ += dOᵀ·P   B = P [keys, q]  (Pᵀ's fragments stored as they are, rounded to tf32)
//   dKᵀ += Qᵀ·dS   B = dS [keys, q] likewise
//   dQᵀ  = Kᵀ·dSᵀ  B = dS [q, keys] (dSᵀ stored transposed); Kᵀ's fragments loaded once a block
// dQᵀ is staged transposed into the dQ tile; dK and dV are written transposed from registers.
// Shared memory (bytes, D = 128): K, V 32,768 each; Q, dO 32,768 each (one stage); P, dS, dS
// transposed 16,384 each; dQ 64 × 136 × 4 = 34,816; LSE, Δ 512: 210.5 KiB. Registers per consumer
// thread: dKᵀ, dVᵀ 32 each; Kᵀ's fragments 32; Sᵀ, dPᵀ 16 each (dead before the gradients); two
// sets of A fragments 64; dQᵀ 32.
//
// Split tf32 (precision tf32x3, fp32 storage) at head dim 64 (the split backward): the wide tf32
// backward's shape — 64 keys a block, 64 query rows a step, warpgroup w taking query columns
// [32 w, 32 w + 32) of Sᵀ and dPᵀ — with every product formed as three tf32 ones (A·B_lo + A_lo·B +
// A·B, the small products first, from tiles split into high parts in place and residuals beside,
// split_to_tf32) and its P from the rows' own statistics (cuda/common/own_softmax.cuh; the
// statistics kernel forms its scores with the same products). At head dim 64 a warpgroup's M of
// 64 head-dim rows is the whole head dim, so the gradients split by product instead: warpgroup 0
// keeps dVᵀ += dOᵀ·P, warpgroup 1 dKᵀ += Qᵀ·dS (each step's part formed from zero and added in
// fp32: the tensor cores' own additions along the query tiles would lose more), and each
// warpgroup forms dQᵀ = Kᵀ·dSᵀ of its 32 query columns. Shared memory (bytes): K, V, Q, dO and
// their residuals 16,384 each; P and dS [keys, q], high parts and residuals, 16,384 each; dS [q,
// keys] takes the residual tiles of Q and dO once both warpgroups have loaded their A fragments
// from them; dQ 64 × 72 × 4 = 18,432; LSE (the rows' own max), Δ and the rows' 1/sum 768: 210.8
// KiB. Registers per consumer thread: the gradient 32 and the step's part 32; A fragments 128
// (dOᵀ or Qᵀ and Kᵀ, high parts and residuals); dQᵀ 16.
//
// 16-bit storage at head dims up to 64 takes kBwdWideRows (128) query rows a step instead of 64:
// a step's fixed costs (its full/empty barriers, the dS barrier, one dQ hand-off and bulk
// reduction, the LSE and Δ reads) then meet twice the products, whose shapes there are the
// smallest (Sᵀ and dPᵀ m64n128k64, dV and dK m64n64k128, dQ two m64n32k128). Registers per
// consumer thread: Sᵀ and dPᵀ 64 each, dK and dV 32 each, the dQ share 32 (its two halves);
// shared memory: K, V 16 KiB each; Q, dO 16 KiB each per stage, two stages; dS [128 q, 128 keys]
// 32 KiB per buffer, two; dQ 128 × 72 × 4 = 36 KiB: 198 KiB.
struct BwdConfig {
  int keys;             // keys per block
  int stages;           // (Q, dO, LSE, Δ) stages in flight
  bool split_head_dim;  // the 192/256 scheme above (else one warpgroup per 64 keys)
  int ds_buffers;       // dS (and, split, Pᵀ) buffers, alternating per step
  int rows;             // query rows per step (a query tile): kBwdRows or kBwdWideRows
};
inline constexpr int kBwdConsumers = 2;
inline constexpr int kBwdSplitMinHeadDim = 192;
inline constexpr int kTf32BwdMaxHeadDim = 128;
inline constexpr int kTf32BwdTransposingMaxHeadDim = 64;  // the transposing tf32 backward; above, the wide one
inline constexpr int kBwdWideRowsMaxHeadDim = 64;  // 16-bit head dims that take kBwdWideRows a step
// The head dims the tf32 backward (fp32 storage) takes: padded to 64 (the transposing kernel)
// or to 128 (the wide one).
constexpr bool tf32_backward_head_dim(int head_dim) {
  return head_dim >= 64 && padded_head_dim(head_dim) <= kTf32BwdMaxHeadDim;
}
// The split-tf32 backward's head dims (padded to 64).
inline constexpr int kTf32x3BwdMaxHeadDim = 64;
constexpr bool tf32x3_backward_head_dim(int head_dim) {
  return head_dim >= 64 && padded_head_dim(head_dim) <= kTf32x3BwdMaxHeadDim;
}
// split_tf32: precision tf32x3 (fp32 storage).
constexpr BwdConfig bwd_config(int head_dim, int element_bytes = 2, bool split_tf32 = false) {
  const int d = padded_head_dim(head_dim);
  if (split_tf32) return BwdConfig{kConsumerRows, 1, true, 1, kBwdRows};
  if (element_bytes == 4)
    return d <= kTf32BwdTransposingMaxHeadDim ? BwdConfig{kBwdConsumers * kConsumerRows, 1, false, 1, kBwdRows}
                                               : BwdConfig{kConsumerRows, 1, true, 1, kBwdRows};
  if (d < kBwdSplitMinHeadDim)
    return BwdConfig{kBwdConsumers * kConsumerRows, 2, false, 2, d <= kBwdWideRowsMaxHeadDim ? kBwdWideRows : kBwdRows};
  return BwdConfig{kConsumerRows, d <= 192 ? 2 : 1, true, 1, kBwdRows};
}
// The head-dim columns of dK, dV and dQ that consumer warpgroup w owns (split_head_dim): whole
// chunks, the first warpgroup taking the larger share.
constexpr int bwd_split_cols(int head_dim, int w) {
  const int chunks = padded_head_dim(head_dim) / kChunkCols;
  const int first = (chunks + 1) / 2;
  return (w == 0 ? first : chunks - first) * kChunkCols;
}
// The split-tf32 backward's own softmax (statistics and main kernels) takes its exponentials as
// ex2.approx.ftz (own_exp2<true>): exp2f's bits on every normal result, one MUFU instruction
// without exp2f's denormal range reduction around it.
inline constexpr bool kSplitOwnFtz = true;
inline constexpr int kBwdDqPad = 8;  // floats padding each row of the dQ tile and accumulator
// Deterministic: one turn counter per query tile (the dQ warp adds the tile whole).
inline constexpr int kBwdTurnParts = 1;
// The producer warpgroup's warps that add the dQ tiles into the accumulator: one, taking every
// step; two in the deterministic mode, taking alternate steps, so that while one waits for its
// addition to land in global memory before passing the tile's turn on, the other adds the next.
constexpr int bwd_dq_warps(bool ordered) { return ordered ? 2 : 1; }
inline constexpr int kBwdMaxDqWarps = 2;
inline constexpr int kBwdMaxHeadDim = 256;
inline constexpr int kBwdProducerRegisters = 24;
inline constexpr int kBwdConsumerRegisters = 240;
// A packed call's producer is a whole warp that also loads the row statistics, and the
// deterministic kernel's producer warpgroup holds two dQ warps that decode the block index: they
// get 40 registers and the consumers 232 (-Xptxas -v, head dim 128: packed 44 bytes of spill
// stores against 112 with 24 / 240; deterministic dense 4 against 48).
inline constexpr int kBwdWideProducerRegisters = 40;
inline constexpr int kBwdWideConsumerRegisters = 232;
constexpr int bwd_producer_registers(bool wide) { return wide ? kBwdWideProducerRegisters : kBwdProducerRegisters; }
constexpr int bwd_consumer_registers(bool wide) { return wide ? kBwdWideConsumerRegisters : kBwdConsumerRegisters; }

// Named barriers (0 is __syncthreads), per consumer warpgroup w: its epilogue's (split tf32: also
// its query rows' split, FwdMainloop::split_queries), and the one it waits on for its turn to
// issue matrix work under pingpong.
// The backward uses ds_ready: both consumer warpgroups have stored their share of dS; and, with
// one P/dS buffer (split_head_dim, tf32), ds_free: both have finished reading the previous step's;
// tf32: operands_ready, both have written their share of the transposed operands; split tf32:
// residuals_read, both have loaded their A fragments from the residual tiles of Q and dO.
// The forward's epilogue and turn barriers (one per consumer), the backward's dS barriers.
enum class NamedBarrier : int {
  epilogue_first = 1,
  ds_ready = 4,
  turn_first = 5,
  ds_free = 8,
  operands_ready = 9,
  residuals_read = 10
};
inline constexpr int kMaxConsumers = 3;
static_assert(int(NamedBarrier::epilogue_first) + kMaxConsumers <= int(NamedBarrier::ds_ready) &&
                  int(NamedBarrier::turn_first) + kMaxConsumers <= int(NamedBarrier::ds_free) &&
                  int(NamedBarrier::ds_free) < int(NamedBarrier::operands_ready) &&
                  int(NamedBarrier::operands_ready) < int(NamedBarrier::residuals_read) &&
                  int(NamedBarrier::residuals_read) < 16,
              "a block has 16 named barriers");

}  // namespace fmha::cuda::sm90
