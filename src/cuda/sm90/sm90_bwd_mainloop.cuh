// The sm90 backward's consumer mainloop: one warpgroup's 64 keys of the block's key tile against
// one query tile of R rows (BwdConfig::rows: 128 at 16-bit head dims up to 64, else 64), on
// wgmma. With the key tile's rows as the M side, every product whose result belongs to the keys
// keeps its accumulator in registers across the query tiles:
//   Sᵀ  = K·Qᵀ        [64 keys, R q]    SS (K and Q K-major in shared memory)
//   dPᵀ = V·dOᵀ       [64 keys, R q]    SS
//   Pᵀ  = 2^(Sᵀ·scale·log2 e − LSE)     (LSE, Δ per query column; masked only on cut tiles)
//   dSᵀ = Pᵀ ∘ (dPᵀ − Δ)
//   dV += Pᵀ·dO       [64 keys, D]      RS (Pᵀ converted in registers; dO MN-major)
//   dK += dSᵀ·Q       [64 keys, D]      RS
//   dQ  = dS·K        [R q, D / 2]      SS, one m64 wgmma per 64 rows: dSᵀ is stored transposed
//                                        (stmatrix.trans) so that both warpgroups' keys form
//                                        dS [R q, 128 keys] K-major; warpgroup w takes the
//                                        columns [w·D/2, (w+1)·D/2) of K
// dQ goes to the fp32 accumulator in global memory, converted afterwards by the shared convert
// kernel: each warpgroup writes its share of the query tile's dQ into shared memory and the
// producer warpgroup's dQ warp adds the tile with one bulk reduction (cp.reduce.async.bulk), so
// the consumers issue no atomics. dK is scaled once, in the epilogue. In the deterministic mode
// a dQ warp (two, taking alternate steps) adds a query tile's dQ when the tile's turn counter
// says that every key tile after its own has added, so the fp32 sums run in descending key-tile
// order every time (sm90_bwd_blocks.h), while the consumers go on with the next step.
//
// Head dims 192 and 256 (BwdConfig::split_head_dim, sm90_config.h) take 64 keys per block and
// split the work between the two warpgroups by query columns, then by head-dim columns:
//   Sᵀ, dPᵀ [64 keys, 32 q]      SS, warpgroup w's query rows [32 w, 32 w + 32) of the tile
//   Pᵀ, dSᵀ                      stored transposed (P, dS [32 q, 64 keys]) into shared memory,
//                                where the two halves form P and dS [64 q, 64 keys]
//   dV[:, cols] += Pᵀ·dO[:, cols]   SS, Pᵀ MN-major (transposed A), dO MN-major
//   dK[:, cols] += dSᵀ·Q[:, cols]   SS
//   dQ[:, cols]  = dS·K[:, cols]    SS, as above
// where cols are warpgroup w's whole 64-column chunks of the head dim (bwd_split_cols).
//
// fp32 storage (precision tf32, head dim 64; BwdConfig): tf32 wgmma reads shared-memory operands
// K-major only and register A operands in a permuted k order (wg::a_from_acc), so the products
// whose B operand TMA lands MN-major take transposes that the consumers make themselves:
//   Sᵀ  = K·Qᵀ        SS as above (Q and K truncated to tf32 by the tensor cores, as the forward
//                     multiplies them)
//   dPᵀ = V·dOᵀ       SS, V and dO rounded to tf32 in place first (Δ is formed from dO rounded
//                     so; where a row sees one key, dPᵀ − Δ then cancels to fp32 rounding)
//   dV += Pᵀ·dO       RS, B = dOᵀ [D, 64 q] (K-major, query rows permuted as Pᵀ's fragments)
//   dK += dSᵀ·Q       RS, B = Qᵀ likewise
//   dQ  = dS·K        SS, dS [64 q, 128 keys] stored transposed from the dSᵀ fragments and
//                     B = Kᵀ [D, 128 keys], both with the keys in order
// Kᵀ is made once per block; Qᵀ and dOᵀ per step, by both warpgroups between their Sᵀ and dPᵀ
// (the tensor cores run Sᵀ meanwhile). At head dims 96 and 128 (the wide tf32 backward) and with
// split tf32 at 64 (step_wide_tf32, step_split_tf32 below) no transposed copy is made: the
// operands that need one are register A fragments loaded transposed from the landed tiles.
#pragma once

#include <type_traits>

#include "cuda/common/args.h"
#include "cuda/common/own_softmax.cuh"
#include "cuda/sm90/sm90_bwd_blocks.h"
#include "cuda/sm90/sm90_config.h"
#include "cuda/tile/atomic.cuh"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"
#include "fmha/mask.h"

namespace fmha::cuda::sm90 {

namespace wg = tile::warpgroup;

// Shared memory of the backward. Tiles are HDP / 64 swizzled column chunks of [rows, 64].
// fp32 (tf32): the transposed operands, swizzled column chunks of [HDP, 32] (chunk bytes
// HDP · 128); nothing at 16 bits, whose shared memory keeps its size.
template <int HDP, int KEYS, bool TF32>
struct BwdTransposed {
  alignas(wg::kSwizzleAtomBytes) float kt[HDP * KEYS];         // Kᵀ [HDP, keys], keys in order
  alignas(wg::kSwizzleAtomBytes) float qt[HDP * kBwdRows];     // Qᵀ [HDP, 64 q], q permuted (tf32_position_of)
  alignas(wg::kSwizzleAtomBytes) float doutt[HDP * kBwdRows];  // dOᵀ [HDP, 64 q], likewise
};
template <int HDP, int KEYS>
struct BwdTransposed<HDP, KEYS, false> {};

// Split tf32 (precision tf32x3): the residuals tf32(x − tf32(x)) of K and V (split once a block,
// high parts in place) and of Q and dO (split per step); once both warpgroups have loaded their A
// fragments from those of Q and dO, their space takes dS [rows, keys] (high parts where Q's
// residuals were, residuals where dO's). And each row's 1/sum of its own softmax (LSE's place
// holds its own max: cuda/common/own_softmax.cuh).
template <int HDP, int KEYS, int STAGES, bool SPLIT>
struct BwdResiduals {
  alignas(wg::kSwizzleAtomBytes) float k[KEYS * HDP];
  alignas(wg::kSwizzleAtomBytes) float v[KEYS * HDP];
  alignas(wg::kSwizzleAtomBytes) float q[kBwdRows * HDP];
  alignas(wg::kSwizzleAtomBytes) float dout[kBwdRows * HDP];
  alignas(16) float inv_sum[STAGES][kBwdRows];  // row_inv_sum; 0 past seqlen_q
};
template <int HDP, int KEYS, int STAGES>
struct BwdResiduals<HDP, KEYS, STAGES, false> {};

template <class T, int HD>
struct BwdShared {
  static constexpr bool kTf32 = sizeof(T) == 4;
  static constexpr bool kSplitTf32 = is_split_tf32<T>;  // precision tf32x3
  static constexpr BwdConfig kConfig = bwd_config(HD, int(sizeof(T)), kSplitTf32);
  static constexpr int kKeys = kConfig.keys;  // keys per block
  static constexpr int kRows = kConfig.rows;  // query rows per step
  static constexpr int kStages = kConfig.stages;
  static constexpr int kHeadDimPadded = padded_head_dim(HD);
  static constexpr int kChunkCols = wg::kChunkCols<T>;  // columns per swizzled chunk: 64, fp32 32
  static constexpr int kChunks = kHeadDimPadded / kChunkCols;
  static constexpr int kTransposedChunkBytes = kHeadDimPadded * wg::kSwizzleBytes;  // one [HDP, 32] chunk
  static_assert(!kTf32 || padded_head_dim(HD) <= kTf32BwdMaxHeadDim, "the tf32 backward's tiles fit up to head dim 128");
  // The wide tf32 backward (head dims 96, 128): no transposed copies (load_transposed_a_tf32).
  static constexpr bool kWideTf32 = kTf32 && kConfig.split_head_dim && !kSplitTf32;
  static_assert(!kSplitTf32 || padded_head_dim(HD) <= kTf32x3BwdMaxHeadDim, "the split backward's tiles fit head dim 64");
  static_assert(!kTf32 || kRows == kBwdRows, "the tf32 backward's transposes are of 64 query rows");
  static constexpr int kKVChunkBytes = kKeys * wg::kSwizzleBytes;      // one [keys, 64] chunk
  static constexpr int kRowChunkBytes = kRows * wg::kSwizzleBytes;  // one [rows, 64] chunk
  static constexpr uint32_t kKVBytes = uint32_t(kKVChunkBytes) * kChunks;
  static constexpr uint32_t kRowBytes = uint32_t(kRowChunkBytes) * kChunks;
  static constexpr uint32_t kStatBytes = kRows * sizeof(float);  // one tile's LSE or Δ
  static_assert(kStatRowAlign % kRows == 0, "a tile's row statistics must not straddle a (batch, head)");

  alignas(wg::kSwizzleAtomBytes) T k[kKeys * kHeadDimPadded];               // [chunks][keys, 64]
  alignas(wg::kSwizzleAtomBytes) T v[kKeys * kHeadDimPadded];               // [chunks][keys, 64]
  alignas(wg::kSwizzleAtomBytes) T q[kStages][kRows * kHeadDimPadded];   // [chunks][rows, 64]
  alignas(wg::kSwizzleAtomBytes) T dout[kStages][kRows * kHeadDimPadded];
  [[no_unique_address]] BwdTransposed<kHeadDimPadded, kKeys, kTf32 && !kWideTf32 && !kSplitTf32> transposed;
  [[no_unique_address]] BwdResiduals<kHeadDimPadded, kKeys, kStages, kSplitTf32> residual;
  // [buffer][0]: dS [rows, keys]. Up to 128: chunk w from warpgroup w; two buffers, alternating
  // per query tile, so a warpgroup may store the next dS while the other still multiplies the
  // previous one. Split: one chunk, rows [32 w, 32 w + 32) from warpgroup w, and [buffer][1] P
  // stored the same way; one buffer (the ds_free barrier guards it). Wide tf32: [0] dS and [1] P
  // as [keys, rows] (query columns [32 w, 32 w + 32) from warpgroup w), [2] dS as [rows, keys].
  // Split tf32: [0] dS and [1] P as the wide tf32's, [2] and [3] their residuals (dS [rows, keys]
  // takes the residual tiles of Q and dO).
  static constexpr int kScoreTiles =
      kSplitTf32 ? 4 : kConfig.split_head_dim ? (kWideTf32 ? 3 : 2) : 1;  // dS, P (, dS transposed / residuals)
  static constexpr int kScoreTileBytes = kRows * kKeys * int(sizeof(T));
  alignas(wg::kSwizzleAtomBytes) T ds[kConfig.ds_buffers][kScoreTiles][kRows * kKeys];
  // dQ of one query tile [rows, kDqStride] fp32 on its way to the global accumulator, warpgroup w
  // writing the columns [w · kDqCols, (w + 1) · kDqCols) (split: its bwd_split_cols). The rows
  // are padded by kDqPad floats: a warp's stores of its accumulator fragment (8 rows × 4 column
  // pairs) then meet two wavefronts, the least 256 bytes can take. The accumulator's rows have the
  // same stride (the host lays it out so), so the tile's rows are one contiguous run there and
  // leave in one bulk reduction.
  static constexpr int kDqCols = kHeadDimPadded / kBwdConsumers;
  static constexpr int kDqPad = kBwdDqPad;
  static constexpr int kDqStride = kHeadDimPadded + kDqPad;
  alignas(128) float dq[kRows * kDqStride];
  alignas(16) float lse[kStages][kRows];    // LSE · log2 e of the tile's rows; +inf past seqlen_q
  alignas(16) float delta[kStages][kRows];  // Δ = rowsum(dO ∘ O); 0 past seqlen_q
  tile::MBarrier kv_full;
  tile::MBarrier full[kStages], empty[kStages];
  tile::MBarrier dq_empty;  // the dQ tile read (by the dQ warp of the step)
  // Packed calls: the block's sequence (first rows, mask of its lengths), read from the tables
  // once, before the roles split; every role reads its mask from here.
  Sequence sequence;
  // The dQ shares written (every consumer warp; step s on dq_full[s % dQ warps]).
  tile::MBarrier dq_full[kBwdMaxDqWarps];
};

// One consumer warpgroup's accumulators across the query tiles.
template <class T, int HD>
struct BwdTiles {
  static constexpr int kHeadDimPadded = padded_head_dim(HD);
  static constexpr int kRows = bwd_config(HD, int(sizeof(T))).rows;  // query rows per step
  static constexpr int kRowParts = kRows / kConsumerRows;            // m64 wgmmas of a [rows, N] product
  using Scores = wg::Accumulator<kRows>;                     // [64 keys, rows] Sᵀ, then Pᵀ; dPᵀ, then dSᵀ
  using KeyGrad = wg::Accumulator<kHeadDimPadded>;           // [64 keys, HDP] dK or dV, fp32
  // [rows, HDP / 2] dQ share: part r holds rows [64 r, 64 r + 64).
  using QueryGradPart = wg::Accumulator<kHeadDimPadded / kBwdConsumers>;
  using QueryGrad = QueryGradPart[kRowParts];
  using Fragments = uint32_t[kRows / wg::kStepK<T>][4];      // [64 keys, rows] as register-A (16-bit or tf32)
};

// One consumer warpgroup's accumulators under split_head_dim, owning COLS head-dim columns.
template <int COLS>
struct BwdSplitTiles {
  static constexpr int kQueries = kBwdRows / kBwdConsumers;  // query columns of Sᵀ per warpgroup
  using Scores = wg::Accumulator<kQueries>;    // [64 keys, 32 q] Sᵀ, then Pᵀ; dPᵀ, then dSᵀ
  using KeyGrad = wg::Accumulator<COLS>;       // [64 keys, COLS] dK or dV columns, fp32
  using QueryGrad = wg::Accumulator<COLS>[1];  // [64 q, COLS] dQ columns (one part of 64 rows)
  using Fragments = uint32_t[kQueries / 16][4];  // [64 keys, 32 q] as 16-bit fragments
};

// Sᵀ (a warpgroup's [64 keys, N q] scores: keys as rows from key0, query rows as columns from q0)
// with the elements that the mask hides set to -inf (where `scale` is given, to -inf once
// multiplied by it: tile::masked_before_scale), where the tile is cut by the mask or by the
// sequences' ends. (The split backward's main and statistics kernels mask with it, so that both
// hide the same scores.) With COL_OFFSETS, the thread's columns are taken as its first column plus
// the offsets that the fragment layout fixes (Scores::col(j, t) = Scores::col(0, t) +
// Scores::col(j, 0)): each key's visible rows are made relative to that first column once, and
// every element is compared against a constant, where otherwise the thread's column indices are
// formed once, kept in registers (one per column) for both of its keys.
template <bool COL_OFFSETS = false, int N>
__device__ __forceinline__ void mask_transposed_scores(wg::Accumulator<N>& s, const Mask& mask, int64_t key0,
                                                       int64_t q0, int thread, const float* scale = nullptr) {
  using Scores = wg::Accumulator<N>;
  const Range rows{q0, q0 + N < mask.seqlen_q ? q0 + N : mask.seqlen_q};
  const Range keys{key0, key0 + kConsumerRows};
  if (keys.end <= mask.seqlen_k && mask.tile_is_full(rows, keys)) return;
  const int64_t col0 = COL_OFFSETS ? q0 + Scores::col(0, thread) : q0;
  // Rows are keys here, columns query rows: key i is seen by the queries mask.queries(key).
  tile::thread::mask_outside(
      s,
      [&](int i) {
        const int64_t key = key0 + Scores::row(i, thread);
        return key < mask.seqlen_k ? mask.queries(key) : Range{0, 0};
      },
      col0, [&](int j) { return COL_OFFSETS ? Scores::col(j, 0) : Scores::col(j, thread); },
      scale ? tile::masked_before_scale(*scale) : tile::kNegInf);
}

// Split tf32: acc = A·Bᵀ over HD columns as three tf32 products, A the 64 rows from a_row0 of a
// key-side tile [keys, HDP] (chunks of a_chunk_bytes) and B the N rows from b_row0 of a query-side
// tile [rows, HDP], each given as its high parts (hi) and residuals (lo, split_to_tf32): A·B_lo,
// then A_lo·B, then A·B, each over the head dim in order (the small products first). Issued and
// committed, not waited for. The split backward's main and statistics kernels form their scores
// with it, from tiles split by the same function at the same places, so that their scores agree
// bit for bit.
template <int HD, int N>
__device__ __forceinline__ void issue_split_products(wg::Accumulator<N>& acc, const float* a_hi, const float* a_lo,
                                                     int a_row0, int a_chunk_bytes, const float* b_hi,
                                                     const float* b_lo, int b_row0, int b_chunk_bytes) {
  constexpr int kK = wg::Wgmma<float, N>::kK;
  const float* const as[3] = {a_hi, a_lo, a_hi};
  const float* const bs[3] = {b_lo, b_hi, b_hi};
  wg::fence();
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    const uint64_t a0 = wg::k_major_desc<float, kK>(as[p], a_row0, 0, a_chunk_bytes);
    const uint64_t b0 = wg::k_major_desc<float, kK>(bs[p], b_row0, 0, b_chunk_bytes);
#pragma unroll
    for (int k0 = 0; k0 < HD; k0 += kK)
      wg::Wgmma<float, N>::ss(acc.d, a0 + wg::k_major_step<float>(k0, a_chunk_bytes),
                              b0 + wg::k_major_step<float>(k0, b_chunk_bytes), p > 0 || k0 > 0 ? 1 : 0);
  }
  wg::commit();
}

// ORDERED_DQ: the deterministic mode (dQ added in descending key-tile order); a kernel of its
// own, so that the default one carries none of its registers. PACKED: a variable-length call,
// whose block's mask is its sequence's, in shared memory.
template <class T, int HD, bool ORDERED_DQ, bool PACKED>
struct BwdMainloop {
  using Shared = BwdShared<T, HD>;
  using Tiles = BwdTiles<T, HD>;
  static constexpr bool kTf32 = Shared::kTf32;
  static constexpr int kKeys = Shared::kKeys;
  static constexpr int kRows = Shared::kRows;  // query rows per step
  static constexpr bool kSplit = Shared::kConfig.split_head_dim;
  using Pipeline = tile::PipelineState<Shared::kStages>;
  static constexpr int kHeadDimPadded = Tiles::kHeadDimPadded;
  static constexpr bool kSplitTf32 = Shared::kSplitTf32;
  using Mma = std::conditional_t<kSplitTf32, float, T>;  // the tensor cores' operand type (split: tf32)
  static constexpr int kK = wg::Wgmma<Mma, kBwdRows>::kK;
  static constexpr int kConsumerWarps = wg::kThreads / 32;
  static constexpr int kDqCols = Shared::kDqCols;  // dQ columns per warpgroup
  static constexpr uint32_t kDqWriters = kBwdConsumers * kConsumerWarps;  // arrivals on dq_full
  static constexpr int kDqWarps = bwd_dq_warps(ORDERED_DQ);


  Shared& shared;
  const AttentionArgs& args;
  int warpgroup;  // consumer index: keys [64 · warpgroup, 64 · warpgroup + 64) of the key tile
                  // (split: query columns [32 w, 32 w + 32), its head-dim columns)
  int thread;     // index inside the warpgroup

  // Packed: the query rows that each of this thread's two keys sees ([0, 0) past seqlen_k), found
  // once per block (the keys are the block's for good), in 32 bits: the step then masks from
  // these four registers instead of loading the sequence's mask among its live accumulators.
  int visible_begin[2], visible_end[2];

  // The block's mask: the call's (dense, in the parameter block) or its sequence's (packed, in
  // shared memory, addressed from `shared` rather than by a pointer of its own kept live).
  __device__ __forceinline__ const Mask& mask() const {
    if constexpr (PACKED) return shared.sequence.mask;
    else return args.mask;
  }

  // Packed: visible_begin / visible_end of the block's key tile `keys`.
  __device__ __forceinline__ void find_visible(Range keys) {
    static_assert(Tiles::Scores::kRows == 2, "two keys per thread");
    const Mask& m = mask();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t first = keys.begin + (kSplit ? 0 : int64_t(warpgroup) * kConsumerRows);
      const int64_t key = first + Tiles::Scores::row(i, thread);
      const Range seen = key < m.seqlen_k ? m.queries(key) : Range{0, 0};
      visible_begin[i] = int(seen.begin);
      visible_end[i] = int(seen.end);
    }
  }

  // acc = A·Bᵀ for A = the 64 rows from key_row0 of a [keys, HDP] key-side tile and B the N rows
  // from query_row0 of a [64, HDP] query-side tile, both K-major; issued, committed, not waited.
  template <int N>
  __device__ __forceinline__ void issue_transposed_scores(wg::Accumulator<N>& acc, const T* key_side, int key_row0,
                                                          const T* query_side, int query_row0) {
    const uint64_t a0 = wg::k_major_desc<T, kK>(key_side, key_row0, 0, Shared::kKVChunkBytes);
    const uint64_t b0 = wg::k_major_desc<T, kK>(query_side, query_row0, 0, Shared::kRowChunkBytes);
    wg::fence();
#pragma unroll
    for (int k0 = 0; k0 < HD; k0 += kK)
      wg::Wgmma<T, N>::ss(acc.d, a0 + wg::k_major_step<T>(k0, Shared::kKVChunkBytes),
                          b0 + wg::k_major_step<T>(k0, Shared::kRowChunkBytes), k0 > 0 ? 1 : 0);
    wg::commit();
  }

  // acc += Aᵀ·B for Aᵀ given as register fragments [64 keys, rows] and B a [rows, HDP] tile
  // (MN-major: the head dim is contiguous; tf32: its transpose [HDP, 64 q], K-major with the query
  // rows permuted as the fragments' k order); issued, not committed.
  __device__ __forceinline__ void issue_key_grad(typename Tiles::KeyGrad& acc, const typename Tiles::Fragments& a,
                                                 const T* query_side) {
    if constexpr (kTf32) {
      const uint64_t b0 = wg::k_major_desc<T, kK>(query_side, 0, 0, Shared::kTransposedChunkBytes);
#pragma unroll
      for (int kb = 0; kb < kRows / kK; ++kb)
        wg::Wgmma<T, kHeadDimPadded>::template rs<0>(
            acc.d, a[kb], b0 + wg::k_major_step<T>(kb * kK, Shared::kTransposedChunkBytes), 1);
    } else {
      const uint64_t b0 = wg::mn_major_desc(query_side, 0, Shared::kRowChunkBytes);
#pragma unroll
      for (int kb = 0; kb < kRows / 16; ++kb)
        wg::Wgmma<T, kHeadDimPadded>::template rs<1>(acc.d, a[kb], b0 + wg::mn_major_step(kb * 16), 1);
    }
  }

  // dQ share = dS·K[:, N columns from col0], part r of acc taking dS's rows [64 r, 64 r + 64) (one
  // m64 wgmma chain each), dS from shared memory (K-major over the block's keys), K MN-major
  // (tf32: Kᵀ's rows from col0, K-major); issued and committed as one group.
  template <int N, int PARTS>
  __device__ __forceinline__ void issue_query_grad(wg::Accumulator<N> (&acc)[PARTS], const T* ds, int col0) {
    static_assert(PARTS * kConsumerRows == kRows, "one part per 64 rows of the step");
    constexpr int kDsChunkBytes = kRows * wg::kSwizzleBytes;
#pragma unroll
    for (int r = 0; r < PARTS; ++r) {
      const uint64_t a0 = wg::k_major_desc<T, kK>(ds, r * kConsumerRows, 0, kDsChunkBytes);
      if constexpr (kTf32) {
        const uint64_t b0 = wg::k_major_desc<T, kK>(shared.transposed.kt, col0, 0, Shared::kTransposedChunkBytes);
#pragma unroll
        for (int k0 = 0; k0 < kKeys; k0 += kK)
          wg::Wgmma<T, N>::ss(acc[r].d, a0 + wg::k_major_step<T>(k0, kDsChunkBytes),
                              b0 + wg::k_major_step<T>(k0, Shared::kTransposedChunkBytes), k0 > 0 ? 1 : 0);
      } else {
        // Column c of K lies in chunk c / 64 at element c % 64 of its rows.
        const T* k_cols = shared.k + (col0 / kChunkCols) * (kKeys * kChunkCols) + col0 % kChunkCols;
        const uint64_t b0 = wg::mn_major_desc(k_cols, 0, Shared::kKVChunkBytes);
#pragma unroll
        for (int k0 = 0; k0 < kKeys; k0 += kK)
          wg::Wgmma<T, N>::template ss<0, 1>(acc[r].d, a0 + wg::k_major_step<T>(k0, kDsChunkBytes),
                                             b0 + wg::mn_major_step(k0), k0 > 0 ? 1 : 0);
      }
    }
    wg::commit();
  }

  // Split: acc += Aᵀ·B[:, N columns from col0] for A a [64 q, 64 keys] tile of shared memory (P
  // or dS; keys contiguous, so Aᵀ is an MN-major A operand) and B a [64 q, HDP] stage (Q or dO,
  // MN-major; col0 a whole chunk); issued, not committed.
  template <int N>
  __device__ __forceinline__ void issue_split_key_grad(wg::Accumulator<N>& acc, const T* a, const T* query_side,
                                                       int col0) {
    static_assert(kKeys == kChunkCols, "Aᵀ's 64 keys are one swizzled chunk (M of the wgmma)");
    const uint64_t a0 = wg::mn_major_desc(a, 0, Shared::kScoreTileBytes);
    const uint64_t b0 = wg::mn_major_desc(query_side + (col0 / kChunkCols) * (kRows * kChunkCols), 0,
                                          Shared::kRowChunkBytes);
#pragma unroll
    for (int k0 = 0; k0 < kRows; k0 += kK)
      wg::Wgmma<T, N>::template ss<1, 1>(acc.d, a0 + wg::mn_major_step(k0), b0 + wg::mn_major_step(k0), 1);
  }

  // Sᵀ (keys as rows, from key0; query rows as columns, from q0) masked where the tile is cut (in
  // the dense kernels, to -inf once multiplied by *scale where given: mask_transposed_scores; the
  // packed ones mask to -inf, and their callers mask exponents, not scores, where a scale follows).
  template <int N>
  __device__ __forceinline__ void mask_scores(wg::Accumulator<N>& s, int64_t key0, int64_t q0,
                                              const float* scale = nullptr) {
    using Scores = wg::Accumulator<N>;
    if constexpr (PACKED) {
      // Masked where one of this thread's keys misses a row of the tile (rows past the sequence's
      // end included: its visible rows stop at seqlen_q). Per thread: masking what is visible
      // changes nothing, so the threads need not agree.
      bool cut = false;
#pragma unroll
      for (int i = 0; i < 2; ++i) cut |= !(visible_begin[i] <= q0 && visible_end[i] >= q0 + N);
      if (cut)
        tile::thread::mask_outside(
            s, [&](int i) { return Range{visible_begin[i], visible_end[i]}; }, q0,
            [&](int j) { return Scores::col(j, thread); });
    } else {
      mask_transposed_scores<kMaskColOffsets>(s, mask(), key0, q0, thread, scale);
    }
  }
  // The dense deterministic kernel at 128 rows a step masks its 32 columns a thread as constant
  // offsets from its first (mask_transposed_scores): with the 32 column indices kept in
  // registers, its mask path spilled the end of one key's visible rows (-Xptxas -v, head dim 64,
  // fp16 and bf16: 16 bytes of spill stores → 0; SASS 5,056 → 4,920 instructions). The default
  // kernel spills nothing either way; there this form shortened the SASS (3,296 → 3,256) but
  // rescheduled the whole kernel, which no run has timed, so it keeps the indices, as do the
  // kernels of 64 rows a step (16 columns a thread, no spills).
  static constexpr bool kMaskColOffsets = ORDERED_DQ && !PACKED && kRows > kBwdRows;

  // Sᵀ (keys as rows from key0, query rows as columns from q0) becomes Pᵀ = 2^(Sᵀ·scale − LSE),
  // the LSEs of the stage's rows from column lse_col0, masked where the tile is cut. Masked scores
  // give P = 0 under either sign of the scale: the dense kernels mask the score, to
  // tile::masked_before_scale (+inf under a negative scale), before the exponent is formed
  // (masking the exponent cost the dense tf32 D128 backward 3 %: docs/PERF.md runs 87 and 91); the
  // packed ones mask the exponent (-inf), since their mask_scores takes no scale (the score-first
  // form put 48 bytes of spill stores into the bf16 D64 packed kernels, -Xptxas -v).
  template <int N>
  __device__ __forceinline__ void probabilities(wg::Accumulator<N>& s, int stage, int64_t key0, int64_t q0,
                                                int lse_col0) {
    using Scores = wg::Accumulator<N>;
    if constexpr (PACKED) {
#pragma unroll
      for (int j = 0; j < Scores::kCols; ++j) {
        const float lse = shared.lse[stage][lse_col0 + Scores::col(j, thread)];
#pragma unroll
        for (int i = 0; i < Scores::kRows; ++i) s(i, j) = s(i, j) * args.scale_log2 - lse;
      }
      mask_scores(s, key0, q0);
#pragma unroll
      for (int r = 0; r < Scores::kRegs; ++r) s.d[r] = tile::exp2_fast(s.d[r]);
    } else {
      mask_scores(s, key0, q0, &args.scale_log2);
#pragma unroll
      for (int j = 0; j < Scores::kCols; ++j) {
        const float lse = shared.lse[stage][lse_col0 + Scores::col(j, thread)];
#pragma unroll
        for (int i = 0; i < Scores::kRows; ++i) s(i, j) = tile::exp2_fast(s(i, j) * args.scale_log2 - lse);
      }
    }
  }

  // The stage may be refilled once every consumer is done with it: one arrival per consumer
  // thread, each after its own reads of the stage (tf32 releases it right after the row
  // statistics are read, 16-bit once the step's products that read Q and dO are complete). An
  // arrival per warp after a named barrier of all consumer threads orders the reads as well, but
  // compute-sanitizer's racecheck does not follow that chain and reported the next tile's bulk
  // copy of the statistics racing with them (docs/PERF.md run 53); with one arrival per thread
  // it reports none, and the backward runs at the same speed (run 55).
  static constexpr uint32_t kEmptyArrivals = kBwdConsumers * wg::kThreads;
  __device__ __forceinline__ void release(tile::MBarrier& empty) { empty.arrive(); }

  // The thread's index (and, in the dense deterministic kernel, the warpgroup's) made opaque to the
  // compiler at each step (tile::opaque): the shared-memory addresses a step derives from them (swizzled
  // fragment stores, the dQ staging, the statistics' columns) are then recomputed every step
  // instead of hoisted out of the query-tile loop and kept in registers beside the step's
  // accumulators. -Xptxas -v, bf16 at head dim 64 (bytes of spill stores): default 44 → 0,
  // deterministic 76 → 0, packed and packed deterministic 88 → 48 (with the warpgroup's index
  // opaque as well, the default kernel spilled 12 and the packed ones 44: hence only there).
  // 16-bit storage only: the tf32 kernel at head dim 64 spills nothing without it.
  __device__ __forceinline__ void opaque_indices() {
    if constexpr (kTf32) return;
    else if constexpr (ORDERED_DQ && !PACKED) tile::opaque(thread, warpgroup);
    else tile::opaque(thread);
  }

  // One query tile m (rows [R m, R m + R) of one head of the group, R = kRows) against this warpgroup's keys.
  // `keys` is the block's key tile (clamped to seqlen_k); dq_buffer alternates per step (the dS
  // buffer, and the parity of the step's dQ hand-off).
  __device__ void step(const Pipeline& at, int m, Range keys, int dq_buffer,
                       typename Tiles::KeyGrad& dk, typename Tiles::KeyGrad& dv) {
    typename Tiles::QueryGrad dq;
    opaque_indices();
    step_products(at, m, keys, dq_buffer, dk, dv, dq);
    stage_dq(dq, dq_buffer);
  }

  // tf32: the block's Kᵀ (keys in order) and V rounded to tf32 in place, by both warpgroups, once
  // the K/V tiles have landed.
  static constexpr int kConsumerThreads = kBwdConsumers * wg::kThreads;
  __device__ __forceinline__ void prepare_keys() {
    static_assert(kTf32, "the 16-bit backward reads K and V as they land");
    const int index = warpgroup * wg::kThreads + thread;
    wg::transpose_k_major<kKeys, kHeadDimPadded, kConsumerThreads / 32, false>(shared.k, shared.transposed.kt,
                                                                              index / 32, index % 32);
    wg::round_to_tf32<kKeys * kHeadDimPadded, kConsumerThreads>(shared.v, index);
    tile::fence_async_shared();  // wgmma reads them through the async proxy
    tile::named_sync(int(NamedBarrier::operands_ready), kConsumerThreads);
  }

  // tf32: between the step's Sᵀ and dPᵀ (the tensor cores run Sᵀ meanwhile), both warpgroups make
  // the operands tf32 wgmma cannot read as they land: dOᵀ (dO rounded to tf32 in place on the way)
  // and Qᵀ. One set of transposes and one dS buffer: both warpgroups first pass ds_free, which they
  // reach once the previous step's GEMMs (their readers) are complete.
  __device__ __forceinline__ void transpose_query_side(int stage) {
    static_assert(kTf32 && Shared::kConfig.ds_buffers == 1 && Shared::kStages == 1, "tf32: one stage, one dS buffer");
    tile::named_sync(int(NamedBarrier::ds_free), kConsumerThreads);
    const int index = warpgroup * wg::kThreads + thread;
    constexpr int kWarps = kConsumerThreads / 32;
    wg::transpose_k_major<kRows, kHeadDimPadded, kWarps, true, true>(shared.dout[stage], shared.transposed.doutt,
                                                                     index / 32, index % 32);
    wg::transpose_k_major<kRows, kHeadDimPadded, kWarps>(shared.q[stage], shared.transposed.qt, index / 32,
                                                         index % 32);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::operands_ready), kConsumerThreads);
  }

  // dV += Pᵀ·dO and dK += dSᵀ·Q (B operands dout_side and q_side), in flight while dS goes to
  // ds_tile ([rows, keys], this warpgroup's keys from its dSᵀ fragments); then dQ = dS·K queued
  // behind them, so that the tensor cores go from one to the next; all waited for.
  __device__ __forceinline__ void key_and_query_grads(typename Tiles::Fragments& p, typename Tiles::Fragments& ds,
                                                      const T* dout_side, const T* q_side, T* ds_tile,
                                                      typename Tiles::KeyGrad& dk, typename Tiles::KeyGrad& dv,
                                                      typename Tiles::QueryGrad& dq) {
    wg::fence_operand(dv.d);
    wg::fence_operand(dk.d);
    wg::fence();
    issue_key_grad(dv, p, dout_side);
    issue_key_grad(dk, ds, q_side);
    wg::commit();
    if constexpr (kTf32)
      wg::store_transposed_tf32<kRows>(ds, static_cast<uint32_t>(__cvta_generic_to_shared(ds_tile)),
                                       warpgroup * kConsumerRows, thread);
    else
      wg::store_transposed_swizzled<T, kRows>(
          ds, static_cast<uint32_t>(__cvta_generic_to_shared(ds_tile + warpgroup * kRows * kChunkCols)), thread);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::ds_ready), kConsumerThreads);
    wg::fence_operand(dq);
    wg::fence();
    issue_query_grad(dq, ds_tile, warpgroup * kDqCols);
    wg::wait<0>();
    wg::fence_operand(dv.d);
    wg::fence_operand(dk.d);
    wg::fence_operand(p);
    wg::fence_operand(ds);
    wg::fence_operand(dq);
  }

  // Pᵀ = 2^(Sᵀ · scale · log2 e − LSE), masked where the tile is cut, and dSᵀ = Pᵀ ∘ (dPᵀ − Δ),
  // from the issued Sᵀ and dPᵀ (in that order, the last two wgmma groups), as register-A fragments.
  // Pᵀ's fragments are made before dPᵀ is waited for, except at 128 rows a step: there Sᵀ and dPᵀ
  // take 64 registers each, and both sets of fragments are made once dSᵀ is formed, so that Pᵀ's
  // 32 are not live beside them while dPᵀ is awaited. (-Xptxas -v at head dim 64 shows the same
  // 44 bytes of spill stores either way, values fixed for the block, reloaded twice a step and
  // more on masked steps (docs/PERF.md runs 53 and 56); this is the form run 53 measured.)
  static constexpr bool kLateFragments = kRows > kBwdRows;
  __device__ __forceinline__ void probabilities_and_score_grads(typename Tiles::Scores& s, typename Tiles::Scores& dp,
                                                                typename Tiles::Fragments& p,
                                                                typename Tiles::Fragments& ds, int stage, Range keys,
                                                                int64_t row0) {
    using Scores = typename Tiles::Scores;
    wg::wait<1>();
    wg::fence_operand(s.d);
    probabilities(s, stage, keys.begin + int64_t(warpgroup) * kConsumerRows, row0, 0);
    if constexpr (!kLateFragments) wg::a_from_acc<T>(p, s);
    wg::wait<0>();
    wg::fence_operand(dp.d);
#pragma unroll
    for (int j = 0; j < Scores::kCols; ++j) {
      const float delta = shared.delta[stage][Scores::col(j, thread)];
#pragma unroll
      for (int i = 0; i < Scores::kRows; ++i) dp(i, j) = s(i, j) * (dp(i, j) - delta);
    }
    if constexpr (kLateFragments) wg::a_from_acc<T>(p, s);
    wg::a_from_acc<T>(ds, dp);
  }

  // The step without its dQ hand-off: its dQ share is left, complete, in `dq`. (At 64 rows a step
  // and head dim 64, handing it off under the next step's scores gained 1-3 % on an H100, run 44;
  // at 128 rows its 32 registers do not fit beside Sᵀ and dPᵀ.)
  __device__ __forceinline__ void step_products(const Pipeline& at, int m, Range keys, int dq_buffer,
                                                typename Tiles::KeyGrad& dk, typename Tiles::KeyGrad& dv,
                                                typename Tiles::QueryGrad& dq) {
    const int64_t row0 = int64_t(m) * kRows;
    using Scores = typename Tiles::Scores;
    const int stage = at.index;
    shared.full[stage].wait(at.phase);
    Scores s, dp;
    issue_transposed_scores(s, shared.k, warpgroup * kConsumerRows, shared.q[stage], 0);
    if constexpr (kTf32) transpose_query_side(stage);
    issue_transposed_scores(dp, shared.v, warpgroup * kConsumerRows, shared.dout[stage], 0);

    typename Tiles::Fragments p, ds;
    probabilities_and_score_grads(s, dp, p, ds, stage, keys, row0);
    if constexpr (kTf32) {
      // Q, dO and the row statistics of the stage are read (the transposes before operands_ready,
      // Sᵀ and dPᵀ waited for): the producer may load the next query tile under dV, dK and dQ,
      // which read the transposes.
      release(shared.empty[stage]);
      key_and_query_grads(p, ds, shared.transposed.doutt, shared.transposed.qt, shared.ds[0][0], dk, dv, dq);
    } else {
      key_and_query_grads(p, ds, shared.dout[stage], shared.q[stage], shared.ds[dq_buffer][0], dk, dv, dq);
      release(shared.empty[stage]);
    }
  }

  // This warpgroup's dQ share of a step.
  __device__ __forceinline__ void stage_dq(const typename Tiles::QueryGrad& dq, int dq_buffer) {
    stage_dq(dq, dq_buffer, warpgroup * kDqCols);
  }

  // Split (head dims 192, 256): one query tile m against the block's 64 keys, this warpgroup
  // taking query columns [32 w, 32 w + 32) of Sᵀ and dPᵀ, then its COLS head-dim columns from
  // col0 of dK, dV and dQ. dq_parity alternates per step (the dQ hand-off).
  // Split and wide tf32 steps: Pᵀ = 2^(Sᵀ · scale · log2 e − LSE) of a warpgroup's query columns
  // from q_col0 of the step's rows (from row0), masked where the tile is cut, once the issued Sᵀ
  // is complete (dPᵀ, issued after it, may still run).
  template <int N>
  __device__ __forceinline__ void column_probabilities(wg::Accumulator<N>& s, int stage, Range keys, int64_t row0,
                                                       int q_col0) {
    using Scores = wg::Accumulator<N>;
    wg::wait<1>();
    wg::fence_operand(s.d);
    probabilities(s, stage, keys.begin, row0 + q_col0, q_col0);
  }
  // Then dSᵀ = Pᵀ ∘ (dPᵀ − Δ) into dp, once dPᵀ is complete.
  template <int N>
  __device__ __forceinline__ void column_score_grads(const wg::Accumulator<N>& p, wg::Accumulator<N>& dp, int stage,
                                                     int q_col0) {
    using Scores = wg::Accumulator<N>;
    wg::wait<0>();
    wg::fence_operand(dp.d);
#pragma unroll
    for (int j = 0; j < Scores::kCols; ++j) {
      const float delta = shared.delta[stage][q_col0 + Scores::col(j, thread)];
#pragma unroll
      for (int i = 0; i < Scores::kRows; ++i) dp(i, j) = p(i, j) * (dp(i, j) - delta);
    }
  }

  template <int COLS>
  __device__ void step_split(const Pipeline& at, int m, Range keys, int dq_parity, int col0,
                             wg::Accumulator<COLS>& dk, wg::Accumulator<COLS>& dv) {
    using SplitTiles = BwdSplitTiles<COLS>;
    using Scores = typename SplitTiles::Scores;
    constexpr int kQueries = SplitTiles::kQueries;
    static_assert(Shared::kConfig.ds_buffers == 1, "one P/dS buffer, guarded by ds_free");
    const int64_t row0 = int64_t(m) * kRows;
    const int q_col0 = warpgroup * kQueries;  // this warpgroup's query rows within the tile
    const int stage = at.index;
    shared.full[stage].wait(at.phase);
    Scores s, dp;
    issue_transposed_scores(s, shared.k, 0, shared.q[stage], q_col0);
    issue_transposed_scores(dp, shared.v, 0, shared.dout[stage], q_col0);

    column_probabilities(s, stage, keys, row0, q_col0);  // Pᵀ
    typename SplitTiles::Fragments p, ds;
    wg::a_from_acc<T>(p, s);
    column_score_grads(s, dp, stage, q_col0);  // dSᵀ
    wg::a_from_acc<T>(ds, dp);

    // P and dS [64 q, 64 keys] into shared memory, this warpgroup's rows, once both warpgroups
    // are done reading the previous step's (their GEMMs complete before they arrive).
    T* ds_tile = shared.ds[0][0];
    T* p_tile = shared.ds[0][1];
    tile::named_sync(int(NamedBarrier::ds_free), kBwdConsumers * wg::kThreads);
    const int rows_offset = q_col0 * kChunkCols;  // 32 rows of 128 bytes: whole swizzle atoms
    wg::store_transposed_swizzled<T, kQueries>(
        ds, static_cast<uint32_t>(__cvta_generic_to_shared(ds_tile + rows_offset)), thread);
    wg::store_transposed_swizzled<T, kQueries>(
        p, static_cast<uint32_t>(__cvta_generic_to_shared(p_tile + rows_offset)), thread);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::ds_ready), kBwdConsumers * wg::kThreads);

    // dV[:, cols] += Pᵀ·dO[:, cols] and dK[:, cols] += dSᵀ·Q[:, cols].
    wg::fence_operand(dv.d);
    wg::fence_operand(dk.d);
    wg::fence();
    issue_split_key_grad(dv, p_tile, shared.dout[stage], col0);
    issue_split_key_grad(dk, ds_tile, shared.q[stage], col0);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(dv.d);
    wg::fence_operand(dk.d);
    release(shared.empty[stage]);  // Q and dO are read: the producer may load the next tile

    typename SplitTiles::QueryGrad dq;
    wg::fence();
    issue_query_grad(dq, ds_tile, col0);
    wg::wait<0>();
    wg::fence_operand(dq);
    stage_dq(dq, dq_parity, col0);
  }

  // ---- The wide tf32 backward (fp32 storage, head dims 96 and 128; sm90_config.h) ----
  // Per step, warpgroup w: Sᵀ and dPᵀ of query columns [32 w, 32 w + 32) (SS, as the split above),
  // then the head-dim rows [64 w, 64 w + 64) of dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS and dQᵀ = Kᵀ·dSᵀ, each
  // A from registers loaded transposed from the landed tile (load_transposed_a_tf32), each B a
  // tile the consumers store: P and dS as [keys, rows] (Pᵀ's and dSᵀ's fragments where they are),
  // dS as [rows, keys] (dSᵀ's transposed). Every k order is the natural one.
  static constexpr bool kWideTf32 = Shared::kWideTf32;
  static constexpr int kKeySteps = kKeys / kK;  // k steps over the block's keys
  static constexpr int kRowSteps = kRows / kK;  // k steps over a step's query rows
  using KeyFragments = uint32_t[kKeySteps][4];  // Kᵀ [this warpgroup's 64 head-dim rows, keys], register A
  using WideGrad = wg::Accumulator<kKeys>;       // dKᵀ or dVᵀ [64 head-dim rows, keys], fp32
  using WideQueryGrad = wg::Accumulator<kRows>;  // dQᵀ [64 head-dim rows, rows]
  static constexpr int kScoreChunkBytes = kKeys * wg::kSwizzleBytes;  // a [keys, 32] chunk of P or dS
  static constexpr int kScoreTChunkBytes = kRows * wg::kSwizzleBytes;  // a [rows, 32] chunk of dS transposed

  __device__ __forceinline__ static uint32_t smem(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
  }

  // Once K and V have landed: V rounded to tf32 in place by both warpgroups (dPᵀ reads it as the
  // other tf32 tiers round it).
  __device__ __forceinline__ void prepare_wide_tf32() {
    static_assert(kWideTf32, "the wide tf32 backward's");
    const int index = warpgroup * wg::kThreads + thread;
    wg::round_to_tf32<kKeys * kHeadDimPadded, kConsumerThreads>(shared.v, index);
    tile::fence_async_shared();  // wgmma reads V through the async proxy
    tile::named_sync(int(NamedBarrier::operands_ready), kConsumerThreads);
  }

  // The thread's index as the compiler cannot see through (tile::opaque): the shared-memory
  // addresses of the step's fragment loads and stores are functions of it (the swizzle makes them
  // 4 to 8 distinct bases an operand), and, hoisted out of the query-tile loop, they took the
  // registers of the gradients (-Xptxas -v at head dim 128: 204 bytes of spills); recomputed a
  // step, they cost a few integer instructions.
  __device__ __forceinline__ int step_thread() const {
    int t = thread;
    tile::opaque(t);
    return t;
  }

  // One query tile m (rows [64 m, 64 m + 64) of one head of the group) against the block's keys.
  // dq_parity alternates per step (the dQ hand-off).
  __device__ void step_wide_tf32(const Pipeline& at, int m, Range keys, int dq_parity, WideGrad& dk, WideGrad& dv) {
    constexpr int kQueries = kRows / kBwdConsumers;  // query columns of Sᵀ and dPᵀ per warpgroup
    using Scores = wg::Accumulator<kQueries>;        // [64 keys, 32 q]
    static_assert(kWideTf32 && Shared::kConfig.ds_buffers == 1 && Shared::kStages == 1, "one stage, one P/dS buffer");
    static_assert(kQueries == Shared::kChunkCols, "a warpgroup's query columns are one chunk of P and dS");
    const int64_t row0 = int64_t(m) * kRows;
    const int q_col0 = warpgroup * kQueries;
    const int stage = at.index;
    shared.full[stage].wait(at.phase);
    Scores s, dp;
    issue_transposed_scores(s, shared.k, 0, shared.q[stage], q_col0);
    // This warpgroup's dO rows rounded to tf32 in place under Sᵀ (Δ was formed from dO rounded so,
    // and dPᵀ reads them as they are): rows [32 w, 32 w + 32) of each chunk, 4 KiB apiece.
#pragma unroll
    for (int c = 0; c < Shared::kChunks; ++c)
      wg::round_to_tf32<kQueries * Shared::kChunkCols, wg::kThreads>(
          shared.dout[stage] + c * (kRows * Shared::kChunkCols) + q_col0 * Shared::kChunkCols, thread);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);  // unused by the backward otherwise
    issue_transposed_scores(dp, shared.v, 0, shared.dout[stage], q_col0);

    column_probabilities(s, stage, keys, row0, q_col0);  // Pᵀ
    column_score_grads(s, dp, stage, q_col0);            // dSᵀ

    // P and dS [keys, rows] (chunk w: this warpgroup's query columns) and dS [rows, keys] (rows
    // [32 w, 32 w + 32)), rounded to tf32, once both warpgroups are done with the previous step's.
    T* ds_tile = shared.ds[0][0];
    T* p_tile = shared.ds[0][1];
    T* ds_rows = shared.ds[0][2];
    tile::named_sync(int(NamedBarrier::ds_free), kConsumerThreads);
    const int t = step_thread();
    const float one[2] = {1.f, 1.f};
    wg::store_swizzled<T, kQueries, true>(s, one, smem(p_tile) + warpgroup * kScoreChunkBytes, kScoreChunkBytes, t);
    wg::store_swizzled<T, kQueries, true>(dp, one, smem(ds_tile) + warpgroup * kScoreChunkBytes, kScoreChunkBytes, t);
    wg::store_transposed_acc_tf32(dp, smem(ds_rows), q_col0, kScoreTChunkBytes, t);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::ds_ready), kConsumerThreads);

    // dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS (this warpgroup's head-dim rows), A from the stage's tiles, and
    // dQᵀ = Kᵀ·dSᵀ queued behind them; every A fragment is loaded before the wgmma fence (which
    // orders the registers' writes before the wgmmas' reads), and the stage is free once they are
    // (Q, dO, LSE and Δ read).
    uint32_t a_dout[kRowSteps][4], a_q[kRowSteps][4];
    const int d0 = warpgroup * kConsumerRows;
    wg::load_transposed_a_tf32(a_dout, smem(shared.dout[stage]), d0, Shared::kRowChunkBytes, t);
    wg::load_transposed_a_tf32(a_q, smem(shared.q[stage]), d0, Shared::kRowChunkBytes, t);
    KeyFragments kt;  // Kᵀ, this warpgroup's head-dim rows: loaded each step (kept across steps, it crowded the registers)
    wg::load_transposed_a_tf32(kt, smem(shared.k), d0, Shared::kKVChunkBytes, t);
    release(shared.empty[stage]);
    WideQueryGrad dq;
    wg::fence_operand(dv.d);
    wg::fence_operand(dk.d);
    wg::fence();
    const uint64_t b_p = wg::k_major_desc<T, kK>(p_tile, 0, 0, kScoreChunkBytes);
    const uint64_t b_ds = wg::k_major_desc<T, kK>(ds_tile, 0, 0, kScoreChunkBytes);
    issue_rs_tf32(dv, a_dout, b_p, kScoreChunkBytes, true);
    issue_rs_tf32(dk, a_q, b_ds, kScoreChunkBytes, true);
    const uint64_t b_dst = wg::k_major_desc<T, kK>(ds_rows, 0, 0, kScoreTChunkBytes);
    issue_rs_tf32(dq, kt, b_dst, kScoreTChunkBytes, false);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(dv.d);
    wg::fence_operand(dk.d);
    wg::fence_operand(dq.d);
    wg::fence_operand(a_dout);
    wg::fence_operand(a_q);
    wg::fence_operand(kt);
    stage_wide_dq(dq, dq_parity, t);
  }

  // dQᵀ [this warpgroup's head-dim rows, rows] into the dQ tile [rows, kDqStride] transposed, for
  // the step's dQ warp (as stage_dq).
  __device__ __forceinline__ void stage_wide_dq(const WideQueryGrad& dq, int parity, int t) {
    stage_transposed_dq(dq, parity, warpgroup * kConsumerRows, 0, t);
  }
  // dQᵀ [64 head-dim rows from d0, N rows of the step from q0] into the dQ tile, transposed.
  template <int N>
  __device__ __forceinline__ void stage_transposed_dq(const wg::Accumulator<N>& dq, int parity, int d0, int q0,
                                                      int t) {
    using Q = wg::Accumulator<N>;
    shared.dq_empty.wait(parity ^ 1);
#pragma unroll
    for (int i = 0; i < Q::kRows; ++i)
#pragma unroll
      for (int j = 0; j < Q::kCols; ++j)
        shared.dq[(q0 + Q::col(j, t)) * Shared::kDqStride + d0 + Q::row(i, t)] = dq(i, j);
    tile::fence_async_shared();  // the bulk reductions read through the async proxy
    __syncwarp();
    if (thread % 32 == 0) shared.dq_full[kDqWarps == 2 ? parity : 0].arrive();
  }

  // ---- The split-tf32 backward (precision tf32x3, head dim 64; sm90_config.h) ----
  // Per step, warpgroup w: Sᵀ and dPᵀ of query columns [32 w, 32 w + 32) (issue_split_products),
  // Pᵀ from the rows' own statistics, dSᵀ; then warpgroup 0 dVᵀ += dOᵀ·P and warpgroup 1 dKᵀ +=
  // Qᵀ·dS (the step's part formed from zero, added in fp32), and each dQᵀ = Kᵀ·dSᵀ of its query
  // columns; every A from registers loaded transposed from a landed tile and its residual tile,
  // every B a tile the consumers store split.
  using SplitQueryGrad = wg::Accumulator<kRows / kBwdConsumers>;  // dQᵀ [64 head-dim rows, 32 q]
  static constexpr int kRowFloats = kRows * kHeadDimPadded;

  __device__ __forceinline__ static float* floats(T* p) { return reinterpret_cast<float*>(p); }

  // Once K and V have landed: both split (high parts in place, residuals beside) by both
  // warpgroups, as the statistics kernel splits K.
  __device__ __forceinline__ void prepare_split_tf32() {
    static_assert(kSplitTf32, "the split backward's");
    const int index = warpgroup * wg::kThreads + thread;
    wg::split_to_tf32<kKeys * kHeadDimPadded, kConsumerThreads>(floats(shared.k), shared.residual.k, index);
    wg::split_to_tf32<kKeys * kHeadDimPadded, kConsumerThreads>(floats(shared.v), shared.residual.v, index);
    tile::fence_async_shared();  // wgmma reads them through the async proxy
    tile::named_sync(int(NamedBarrier::operands_ready), kConsumerThreads);
  }

  // Split: Pᵀ = 2^((x − row_max)·|scale_log2|)·row_inv_sum of a warpgroup's query columns from
  // q_col0, x = sign(scale)·Sᵀ with the masked scores -inf (as the statistics kernel forms its x),
  // once the issued Sᵀ is complete (dPᵀ, issued after it, may still run).
  template <int N>
  __device__ __forceinline__ void own_column_probabilities(wg::Accumulator<N>& s, int stage, Range keys,
                                                           int64_t row0, int q_col0) {
    using Scores = wg::Accumulator<N>;
    wg::wait<1>();
    wg::fence_operand(s.d);
    const float abs_scale_log2 = fabsf(args.scale_log2);
    apply_score_sign(args, s.d);
    mask_scores(s, keys.begin, row0 + q_col0);
#pragma unroll
    for (int j = 0; j < Scores::kCols; ++j) {
      const int col = q_col0 + Scores::col(j, thread);
      const float row_max = shared.lse[stage][col], inv_sum = shared.residual.inv_sum[stage][col];
#pragma unroll
      for (int i = 0; i < Scores::kRows; ++i)
        s(i, j) = own_probability<kSplitOwnFtz>(s(i, j), row_max, inv_sum, abs_scale_log2);
    }
  }

  // One query tile m (rows [64 m, 64 m + 64) of one head of the group) against the block's keys;
  // grad is this warpgroup's gradient (0: dVᵀ, 1: dKᵀ; [64 head-dim rows, 64 keys]). dq_parity
  // alternates per step (the dQ hand-off).
  __device__ void step_split_tf32(const Pipeline& at, int m, Range keys, int dq_parity, WideGrad& grad) {
    constexpr int kQueries = kRows / kBwdConsumers;  // query columns of Sᵀ and dPᵀ per warpgroup
    using Scores = wg::Accumulator<kQueries>;        // [64 keys, 32 q]
    static_assert(kSplitTf32 && Shared::kConfig.ds_buffers == 1 && Shared::kStages == 1, "one stage, one P/dS buffer");
    static_assert(kQueries == Shared::kChunkCols, "a warpgroup's query columns are one chunk of P and dS");
    static_assert(kKeys == kHeadDimPadded && kRows == kKeys, "dS [rows, keys] fits the residual tiles of Q and dO");
    // The packed and deterministic kernels: the indices opaque each step (tile::opaque), so that
    // what derives from them is recomputed rather than kept beside the accumulators (-Xptxas -v,
    // bytes of spill stores: packed 8 → 0, deterministic 68 → 0, both 8 → 0; the default kernel
    // spills nothing either way, its SASS unchanged by this).
    if constexpr (ORDERED_DQ || PACKED) tile::opaque(thread, warpgroup);
    const int64_t row0 = int64_t(m) * kRows;
    const int q_col0 = warpgroup * kQueries;
    const int stage = at.index;
    float* const q = floats(shared.q[stage]);
    float* const dout = floats(shared.dout[stage]);
    float* const q_lo = shared.residual.q;
    float* const dout_lo = shared.residual.dout;
    shared.full[stage].wait(at.phase);
    // Both warpgroups are done with the previous step's products (which read the residual tiles
    // as dS [rows, keys], and P and dS): this warpgroup's query rows of Q and dO split.
    tile::named_sync(int(NamedBarrier::ds_free), kConsumerThreads);
#pragma unroll
    for (int c = 0; c < Shared::kChunks; ++c) {
      const int at_rows = c * (kRows * Shared::kChunkCols) + q_col0 * Shared::kChunkCols;
      wg::split_to_tf32<kQueries * Shared::kChunkCols, wg::kThreads>(q + at_rows, q_lo + at_rows, thread);
      wg::split_to_tf32<kQueries * Shared::kChunkCols, wg::kThreads>(dout + at_rows, dout_lo + at_rows, thread);
    }
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);  // unused by the backward otherwise
    Scores s, dp;
    issue_split_products<HD>(s, floats(shared.k), shared.residual.k, 0, Shared::kKVChunkBytes, q, q_lo, q_col0,
                             Shared::kRowChunkBytes);
    issue_split_products<HD>(dp, floats(shared.v), shared.residual.v, 0, Shared::kKVChunkBytes, dout, dout_lo, q_col0,
                             Shared::kRowChunkBytes);
    own_column_probabilities(s, stage, keys, row0, q_col0);  // Pᵀ
    column_score_grads(s, dp, stage, q_col0);                // dSᵀ

    // P and dS [keys, rows] split (chunk w: this warpgroup's query columns), for both warpgroups.
    float* const ds_tile = floats(shared.ds[0][0]);
    float* const p_tile = floats(shared.ds[0][1]);
    float* const ds_lo = floats(shared.ds[0][2]);
    float* const p_lo = floats(shared.ds[0][3]);
    const int t = step_thread();
    const uint32_t chunk = uint32_t(warpgroup * kScoreChunkBytes);
    wg::store_swizzled_split(s, smem(p_tile) + chunk, smem(p_lo) + chunk, kScoreChunkBytes, t);
    wg::store_swizzled_split(dp, smem(ds_tile) + chunk, smem(ds_lo) + chunk, kScoreChunkBytes, t);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::ds_ready), kConsumerThreads);

    // A of this warpgroup's gradient: dOᵀ (0) or Qᵀ (1) over the step's rows, high parts and
    // residuals. Once both warpgroups have theirs, the residual tiles take dS [rows, keys] (this
    // warpgroup's rows, which its dQᵀ alone reads).
    uint32_t a_hi[kRowSteps][4], a_lo[kRowSteps][4];
    const float* const a_tile = warpgroup == 0 ? dout : q;
    const float* const a_tile_lo = warpgroup == 0 ? dout_lo : q_lo;
    // (Split tiles hold tf32 values: loaded without rounding. Kᵀ's loads below keep theirs:
    // without it the default kernel spilled 16 bytes, -Xptxas -v.)
    wg::load_transposed_a_tf32<kRowSteps, false>(a_hi, smem(a_tile), 0, Shared::kRowChunkBytes, t);
    wg::load_transposed_a_tf32<kRowSteps, false>(a_lo, smem(a_tile_lo), 0, Shared::kRowChunkBytes, t);
    tile::named_sync(int(NamedBarrier::residuals_read), kConsumerThreads);
    float* const ds_rows = q_lo;        // dS [rows, keys], high parts
    float* const ds_rows_lo = dout_lo;  // and residuals
    wg::store_transposed_acc_split(dp, smem(ds_rows), smem(ds_rows_lo), q_col0, kScoreTChunkBytes, t);
    tile::fence_async_shared();
    tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);
    KeyFragments kt;  // Kᵀ [64 head-dim rows, keys]: its high parts, then its residuals
    wg::load_transposed_a_tf32(kt, smem(shared.k), 0, Shared::kKVChunkBytes, t);

    // The step's part of the gradient (B: P for dVᵀ, dS for dKᵀ) as A·B_lo + A_lo·B + A·B, and dQᵀ
    // (B: dS [rows, keys], this warpgroup's rows) as Kᵀ·dS_lo + Kᵀ·dS, then + Kᵀ_lo·dS once the
    // gradient's A fragments are free (all of them live at once crowded the registers: -Xptxas -v).
    WideGrad part;
    SplitQueryGrad dq;
    const uint64_t b_hi = wg::k_major_desc<float, kK>(warpgroup == 0 ? p_tile : ds_tile, 0, 0, kScoreChunkBytes);
    const uint64_t b_lo = wg::k_major_desc<float, kK>(warpgroup == 0 ? p_lo : ds_lo, 0, 0, kScoreChunkBytes);
    const uint64_t rows_hi = wg::k_major_desc<float, kK>(ds_rows, q_col0, 0, kScoreTChunkBytes);
    const uint64_t rows_lo = wg::k_major_desc<float, kK>(ds_rows_lo, q_col0, 0, kScoreTChunkBytes);
    wg::fence();
    issue_rs_tf32(part, a_hi, b_lo, kScoreChunkBytes, false);
    issue_rs_tf32(part, a_lo, b_hi, kScoreChunkBytes, true);
    issue_rs_tf32(part, a_hi, b_hi, kScoreChunkBytes, true);
    issue_rs_tf32(dq, kt, rows_lo, kScoreTChunkBytes, false);
    issue_rs_tf32(dq, kt, rows_hi, kScoreTChunkBytes, true);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(part.d);
    wg::fence_operand(dq.d);
    wg::fence_operand(a_hi);
    wg::fence_operand(a_lo);
    wg::fence_operand(kt);
#pragma unroll
    for (int r = 0; r < WideGrad::kRegs; ++r) grad.d[r] += part.d[r];
    wg::load_transposed_a_tf32(kt, smem(shared.residual.k), 0, Shared::kKVChunkBytes, t);
    release(shared.empty[stage]);  // Q, dO and the row statistics are read
    wg::fence();
    issue_rs_tf32(dq, kt, rows_hi, kScoreTChunkBytes, true);
    wg::commit();
    wg::wait<0>();
    wg::fence_operand(dq.d);
    wg::fence_operand(kt);
    stage_transposed_dq(dq, dq_parity, 0, q_col0, t);
  }

  // acc (+)= A·B over STEPS k steps of 8 on tf32 wgmma, A register fragments in the natural k
  // order, B K-major from the descriptor b0 (chunks of chunk_bytes); from zero unless
  // `accumulate`. Issued, not committed.
  template <int N, int STEPS>
  __device__ __forceinline__ static void issue_rs_tf32(wg::Accumulator<N>& acc, const uint32_t (&a)[STEPS][4],
                                                       uint64_t b0, int chunk_bytes, bool accumulate) {
#pragma unroll
    for (int kb = 0; kb < STEPS; ++kb)
      wg::Wgmma<float, N>::template rs<0>(acc.d, a[kb], b0 + wg::k_major_step<float>(kb * kK, chunk_bytes),
                                          accumulate || kb > 0 ? 1 : 0);
  }

  // A step's dQ share into shared memory for the step's dQ warp, once the previous step's has been
  // read; parity alternates per step (with two dQ warps, it is also the step's warp). col0: the
  // first column of this warpgroup's share. (Deterministic: the dQ warp finds the tile's turn.)
  template <int N, int PARTS>
  __device__ __forceinline__ void stage_dq(const wg::Accumulator<N> (&dq)[PARTS], int parity, int col0) {
    static_assert(kDqWarps <= 2, "the steps' parity names their dQ warp");
    using Q = wg::Accumulator<N>;
    shared.dq_empty.wait(parity ^ 1);
    // One base address per thread (its first element); every other element sits at a constant
    // offset from it, so no per-element addresses stay live across the steps.
    float* first = shared.dq + col0 + Q::row(0, thread) * Shared::kDqStride + Q::col(0, thread);
#pragma unroll
    for (int r = 0; r < PARTS; ++r)
#pragma unroll
      for (int i = 0; i < Q::kRows; ++i)
#pragma unroll
        for (int j = 0; j < Q::kCols; j += 2)
          *reinterpret_cast<float2*>(first + (r * kConsumerRows + Q::row(i, 0) - Q::row(0, 0)) * Shared::kDqStride +
                                     (Q::col(j, 0) - Q::col(0, 0))) = make_float2(dq[r](i, j), dq[r](i, j + 1));
    tile::fence_async_shared();  // the bulk reductions read through the async proxy
    __syncwarp();
    if (thread % 32 == 0) shared.dq_full[kDqWarps == 2 ? parity : 0].arrive();
  }
};

}  // namespace fmha::cuda::sm90
