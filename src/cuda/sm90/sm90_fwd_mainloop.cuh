// The sm90 forward's consumer mainloop: one warpgroup's 64 query rows against the key tiles of a
// work tile, on wgmma. Per key tile: S = Q·Kᵀ (both operands in shared memory), scale, mask
// (only tiles the mask cuts), row max, exp2, row sum, rescale, O += P·V with P converted in
// registers (never through shared memory). K and V arrive through the producer's STAGES-deep TMA
// ring; each is released as soon as its wgmma has read it.
//
// With OVERLAP, tile j+1's Q·Kᵀ is issued before tile j's P·V, and the softmax of tile j+1 runs
// while P·V of tile j is in flight: the tensor cores are fed while the warpgroup does its
// exponentials. With PINGPONG as well, the consumer warpgroups issue those GEMM pairs in turn
// (warpgroup w waits on its turn barrier, issues, then hands the turn to w + 1), so their softmax
// phases alternate instead of coinciding and the tensor cores always have one warpgroup's work.
#pragma once

#include <type_traits>

#include "cuda/common/args.h"
#include "cuda/sm90/sm90_config.h"
#include "cuda/sm90/sm90_packed_tiles.h"
#include "cuda/tile/reduce.cuh"
#include "cuda/tile/tma.cuh"
#include "cuda/tile/wgmma.cuh"
#include "fmha/mask.h"

namespace fmha::cuda::sm90 {

namespace wg = tile::warpgroup;

// Shared memory of the forward. Every tile is HDP / C swizzled column chunks of [rows, C], C the
// columns of T in 128 bytes (64 of 16 bits, 32 of fp32).
//
// fp32 (tf32): tf32 wgmma reads both operands K-major, so P·V needs Vᵀ ([Dv, keys], keys
// contiguous). TMA lands each V tile in v_load (a ring of its own: fwd_landing_stages), the producer
// warpgroup's transposing warps write it as Vᵀ into the v ring ([keys / 32] chunks of [HDP, 32]),
// and the consumers read the v ring as they read V at 16 bits.
// With SEPARATE_O the output is staged in a buffer of its own, so the query tile is released as
// soon as the last Q·Kᵀ of a work tile has read it: the next work tile's Q loads while this one
// finishes its softmax, P·V and epilogue. Where that buffer does not fit (head dims above 128,
// whose K/V ring takes the room), the query tile doubles as the staging buffer: a consumer
// warpgroup writes its O rows over its own Q rows, and Q is released once the store has read them.
// The V landing buffer's barriers (fp32): TMA fills a stage (full), the transposing warps
// release it (empty); `done` is the producer's flag that no V tile follows, set before its last
// arrival on full, one per stage and barrier phase (as the published work tile index): the flag
// the last arrival publishes is not the one the previous round of readers read. Empty without
// landing stages.
template <int STAGES>
struct LandingBarriers {
  tile::MBarrier full[STAGES], empty[STAGES];
  int done[STAGES][2];
};
template <>
struct LandingBarriers<0> {};
// The V landing buffer itself (fp32): STAGES tiles of ELEMENTS, swizzle-atom aligned for TMA.
template <class T, int STAGES, int ELEMENTS>
struct LandingBuffer {
  alignas(wg::kSwizzleAtomBytes) T tile[STAGES][ELEMENTS];
  __device__ __forceinline__ T* operator[](int stage) { return tile[stage]; }
};
template <class T, int ELEMENTS>
struct LandingBuffer<T, 0, ELEMENTS> {};

// Split tf32 (T = tf32x3): the residuals tf32(x − tf32(x)) of the query tile, of each K stage and
// of each Vᵀ stage, in the layouts of the tiles themselves (whose elements hold tf32(x)), and the
// barriers on which the producer warpgroup's splitting warps publish each K stage's split. Nothing
// otherwise.
// `k_done` is the producer's flag that no K tile follows, set before a last plain arrival on the
// next K stage's full barrier, per stage and barrier phase (as the landing buffer's `done`): the
// splitting warps take K tiles as they land, ahead of the V tiles, and stop there.
template <class T, int Q_ELEMENTS, int KV_ELEMENTS, int STAGES, bool SPLIT>
struct SplitResiduals {
  alignas(wg::kSwizzleAtomBytes) T q[Q_ELEMENTS];
  alignas(wg::kSwizzleAtomBytes) T k[STAGES][KV_ELEMENTS];
  alignas(wg::kSwizzleAtomBytes) T v[STAGES][KV_ELEMENTS];
  tile::MBarrier k_split[STAGES];
  int k_done[STAGES][2];
};
template <class T, int Q_ELEMENTS, int KV_ELEMENTS, int STAGES>
struct SplitResiduals<T, Q_ELEMENTS, KV_ELEMENTS, STAGES, false> {};

// LOAD_STAGES: V's landing buffers (fp32); -1 picks two where they fit beside the rest (a second
// lets TMA land the next V tile while the transposing warps still read this one), else one. (At
// 24 registers the tf32 kernel's producer warpgroup spilled 20 bytes in its transposing loop with
// two, -Xptxas -v at head dim 64; at 40, none.)
// Q_BUFFERS: query tiles (16-bit with O staged apart); -1 picks two where they fit beside the
// rest, else one. With two, the producer loads the next work tile's queries as soon as it has
// issued this one's key and value tiles, rather than once the consumers are past this one's last
// Q·Kᵀ: short sequences, whose work tiles have few key tiles, otherwise open each work tile
// waiting for its queries.
template <class T, int HD, int BM, int BN, int STAGES, bool SEPARATE_O, int LOAD_STAGES = -1, int Q_BUFFERS = -1>
struct FwdShared;
template <class T, int HD, int BM, int BN, int STAGES, bool SEPARATE_O, int LOAD_STAGES>
constexpr int fwd_landing_stages() {
  if constexpr (LOAD_STAGES >= 0) return LOAD_STAGES;
  else if constexpr (sizeof(T) != 4) return 0;
  else
    return sizeof(FwdShared<T, HD, BM, BN, STAGES, SEPARATE_O, 2, 1>) + wg::kSwizzleAtomBytes <= kSharedLimit ? 2 : 1;
}
inline constexpr int kMaxQueryBuffers = 2;
template <class T, int HD, int BM, int BN, int STAGES, bool SEPARATE_O, int Q_BUFFERS>
constexpr int fwd_query_buffers() {
  if constexpr (Q_BUFFERS >= 1) return Q_BUFFERS;
  else if constexpr (sizeof(T) != 2 || !SEPARATE_O) return 1;  // fp32 tiles fill shared memory
  else
    return sizeof(FwdShared<T, HD, BM, BN, STAGES, SEPARATE_O, 0, kMaxQueryBuffers>) + wg::kSwizzleAtomBytes <=
                   kSharedLimit
               ? kMaxQueryBuffers
               : 1;
}

template <class T, int HD, int BM, int BN, int STAGES, bool SEPARATE_O, int LOAD_STAGES, int Q_BUFFERS>
struct FwdShared {
  static constexpr int kHeadDimPadded = padded_head_dim(HD);
  static constexpr int kChunkCols = wg::kChunkCols<T>;  // columns per swizzled chunk
  static constexpr int kChunks = kHeadDimPadded / kChunkCols;
  static constexpr int kQChunkBytes = BM * wg::kSwizzleBytes;   // one [BM, C] chunk
  static constexpr int kKVChunkBytes = BN * wg::kSwizzleBytes;  // one [BN, C] chunk
  static constexpr uint32_t kQBytes = uint32_t(kQChunkBytes) * kChunks;
  static constexpr uint32_t kKVBytes = uint32_t(kKVChunkBytes) * kChunks;
  // fp32: V goes through a landing buffer and is transposed (see above).
  static constexpr bool kTransposeV = sizeof(T) == 4;
  static constexpr int kLoadStages = fwd_landing_stages<T, HD, BM, BN, STAGES, SEPARATE_O, LOAD_STAGES>();
  static constexpr int kVtChunkBytes = kHeadDimPadded * wg::kSwizzleBytes;  // one [HDP, 32] Vᵀ chunk
  static_assert(!kTransposeV || BN % kChunkCols == 0, "Vᵀ is whole chunks of 32 keys");
  static constexpr bool kSplit = is_split_tf32<T>;  // split tf32: the residual tiles

  static constexpr int kQBuffers = fwd_query_buffers<T, HD, BM, BN, STAGES, SEPARATE_O, Q_BUFFERS>();
  static_assert(kQBuffers == 1 || SEPARATE_O, "O staged over Q takes the one query tile");
  // Work-tile slots: two per query buffer (see work_tile and fwd_work_slot).
  static constexpr int kSlots = 2 * kQBuffers;
  // The block's n-th work tile (producer and consumers count them alike): its query buffer, the
  // phase of that buffer's barriers, its slot (sm90_config.h, fwd_query_buffer and the like).
  __device__ __forceinline__ static int query_buffer(unsigned n) { return fwd_query_buffer(n, kQBuffers); }
  __device__ __forceinline__ static uint32_t query_phase(unsigned n) { return fwd_query_phase(n, kQBuffers); }
  __device__ __forceinline__ static int slot(unsigned n) { return fwd_work_slot(n, kQBuffers); }

  alignas(wg::kSwizzleAtomBytes) T q[kQBuffers][BM * kHeadDimPadded];  // [chunks][BM, 64] queries (one buffer: then O)
  alignas(wg::kSwizzleAtomBytes) T k[STAGES][BN * kHeadDimPadded];  // [chunks][BN, 64] keys
  alignas(wg::kSwizzleAtomBytes) T v[STAGES][BN * kHeadDimPadded];  // [chunks][BN, C] values (fp32: Vᵀ)
  // fp32: [stages][chunks][BN, 32] values as TMA writes them (LandingBuffer; nothing at 16 bits)
  [[no_unique_address]] LandingBuffer<T, kLoadStages, BN * kHeadDimPadded> v_load;
  // [chunks][BM, 64] output staging (a token element when O is staged over Q)
  alignas(wg::kSwizzleAtomBytes) T o[SEPARATE_O ? BM * kHeadDimPadded : 1];
  tile::MBarrier q_full[kQBuffers], q_empty[kQBuffers];
  // The scheduler's index of the work tile the query tile belongs to, one slot per query buffer
  // and phase of its barriers: the producer rewrites a slot only once the consumers have released
  // the query tile of the work tile kQBuffers after it, so they may read their slot until the end
  // of the work tile.
  int work_tile[kSlots];
  // The work tile (query tile, head, batch or sequence), per slot as above: the producer finds it
  // once (the dense scheduler's divisions), the consumers read it at the work tile's start and in
  // its epilogue.
  WorkTile work[kSlots];
  // Packed calls: the work tile's sequence (where its rows start, its mask), per slot as above,
  // so that the consumers read the mask from here rather than keep it in registers.
  Sequence sequence[kSlots];
  // The producer's own state for packed calls, kept here rather than in its few registers: its
  // walk over the sequence table, and the sequence of the work tile it is loading (copied into
  // the slot once the slot is free).
  PackedTileCursor cursor;
  Sequence next_sequence;

  __device__ __forceinline__ T* output() { return SEPARATE_O ? o : q[0]; }
  // Arrivals that release the query tile: each consumer warp once its last Q·Kᵀ is done, or each
  // consumer warpgroup's storing thread once its O rows (staged over Q) have been read.
  static constexpr uint32_t q_releases(int consumers) {
    return SEPARATE_O ? consumers * (wg::kThreads / 32) : consumers;
  }
  tile::MBarrier k_full[STAGES], k_empty[STAGES];
  tile::MBarrier v_full[STAGES], v_empty[STAGES];
  // fp32: the landing buffer's barriers and flag (LandingBarriers); nothing at 16 bits, whose
  // shared memory keeps its size.
  [[no_unique_address]] LandingBarriers<kLoadStages> landing;
  // Split tf32: the residual tiles and the K stages' split barriers (SplitResiduals).
  [[no_unique_address]] SplitResiduals<T, BM * kHeadDimPadded, BN * kHeadDimPadded, STAGES, kSplit> residual;
};

// One consumer warpgroup's state across the key tiles of a work tile.
template <class T, int HD, int BN>
struct ConsumerTiles {
  static constexpr int kHeadDimPadded = padded_head_dim(HD);
  static constexpr bool kSplit = is_split_tf32<T>;
  using Scores = wg::Accumulator<BN>;              // [64, BN] S, then P, fp32
  using Output = wg::Accumulator<kHeadDimPadded>;  // [64, HDP] unnormalised O, fp32
  using Softmax = tile::OnlineSoftmax<Scores::kRows, 4>;
  // [64, BN] P as register-A fragments (16-bit or tf32; split tf32: high parts, then residuals)
  using PFragments =
      std::conditional_t<kSplit, uint32_t[2][BN / 8][4], uint32_t[BN / wg::kStepK<T>][4]>;
};

template <class T, int HD, int BM, int BN, int STAGES, bool OVERLAP, bool PINGPONG, bool FOLD_SCALE, bool LAZY,
          bool SEPARATE_O, bool CHAIN = false, int POLY = 0, bool SPECULATE = false>
struct FwdMainloop {
  using Element = T;
  static constexpr bool kSeparateO = SEPARATE_O;
  using Shared = FwdShared<T, HD, BM, BN, STAGES, SEPARATE_O>;
  using Tiles = ConsumerTiles<T, HD, BN>;
  using Pipeline = tile::PipelineState<STAGES>;
  static constexpr int kHeadDimPadded = Tiles::kHeadDimPadded;
  // Split tf32 (T = tf32x3, Shared::kSplit): each product as three tf32 ones (issue_scores,
  // issue_pv); the tensor cores take its operands as tf32 (Mma).
  static constexpr bool kSplit = Shared::kSplit;
  // tf32 scales its scores first, each product rounded (thread::scale_rounded), and runs the
  // folded update with scale 1: a row's largest score x then gives 2^(x − x) = exactly 1, where the
  // folded FMA gives 2^ε, ε the rounding of scale·x. tf32's P·V rounds P to tf32, which hides 2^ε
  // from O but not from the row sum, so O was tf32(V)/(1 + ε) on a row that sees one key and the
  // backward's Δ = rowsum(dO∘O) missed its dP (GPU tile test
  // TileOps.ScoresScaledFirstGiveTheRowMaxPExactlyOne). The 16-bit types round P further still
  // and are tested to their own bound; split tf32's backward forms its own softmax.
  static constexpr bool kScaleFirst = std::is_same_v<T, float>;
  using Mma = std::conditional_t<kSplit, float, T>;
  static constexpr int kK = wg::Wgmma<Mma, BN>::kK;
  static constexpr int kConsumerWarps = wg::kThreads / 32;
  static constexpr int kConsumers = BM / kConsumerRows;
  static_assert(!PINGPONG || (OVERLAP && kConsumers > 1), "pingpong alternates overlapped GEMM pairs of warpgroups");
  static_assert(kConsumers <= kMaxConsumers, "one epilogue and one turn barrier per consumer warpgroup");
  static_assert(!LAZY || FOLD_SCALE, "lazy rescaling is an option of the folded-scale update");
  static_assert(!SPECULATE || (LAZY && OVERLAP && POLY == 0), "speculative exponentials are a form of the lazy overlapped update");
  static_assert(!kSplit || !SPECULATE, "split tf32 runs the default schedule");

  Shared& shared;
  const AttentionArgs& args;
  int warpgroup;  // consumer index: rows [64 · warpgroup, 64 · warpgroup + 64) of the query tile
  int thread;     // index inside the warpgroup
  // Split tf32: a key tile's P·V, formed from zero (issue_pv) and added to O (add_part).
  struct NoPart {};
  [[no_unique_address]] std::conditional_t<kSplit, typename Tiles::Output, NoPart> o_part;
  unsigned work_count = 0;  // the block's work tiles before this one (its query buffer and slot)

  __device__ __forceinline__ int query_buffer() const { return Shared::query_buffer(work_count); }
  __device__ __forceinline__ T* queries() { return shared.q[query_buffer()]; }

  // S = Q·Kᵀ for this warpgroup's rows and the key tile in stage `stage`; issued, not waited.
  // Split tf32: Q_lo·K + Q·K_lo + Q·K (the tiles hold the high parts), the small products first.
  __device__ __forceinline__ void issue_scores(typename Tiles::Scores& s, int stage) {
    wg::fence();
    if constexpr (kSplit) {
      issue_scores_from(s, shared.residual.q, shared.k[stage], false);
      issue_scores_from(s, queries(), shared.residual.k[stage], true);
      issue_scores_from(s, queries(), shared.k[stage], true);
    } else {
      issue_scores_from(s, queries(), shared.k[stage], false);
    }
    wg::commit();
  }
  // s (+)= q·kᵀ over the head dim, this warpgroup's rows of the query-side tile q.
  __device__ __forceinline__ void issue_scores_from(typename Tiles::Scores& s, const T* q, const T* k,
                                                    bool accumulate) {
    // Descriptors of the first k step; later steps add their byte offset (in 16-byte units) to
    // the start-address field, which cannot carry out of it inside shared memory.
    const uint64_t a0 = wg::k_major_desc<T, kK>(q, warpgroup * kConsumerRows, 0, Shared::kQChunkBytes);
    const uint64_t b0 = wg::k_major_desc<T, kK>(k, 0, 0, Shared::kKVChunkBytes);
#pragma unroll
    for (int k0 = 0; k0 < HD; k0 += kK) {
      wg::Wgmma<Mma, BN>::ss(s.d, a0 + wg::k_major_step<T>(k0, Shared::kQChunkBytes),
                             b0 + wg::k_major_step<T>(k0, Shared::kKVChunkBytes), accumulate || k0 > 0 ? 1 : 0);
    }
  }

  // O += P·V for the value tile in stage `stage`; issued, not waited. Split tf32: the tile's
  // P·V = P_lo·V + P·V_lo + P·V into o_part, from zero (add_part then adds it to O in fp32).
  __device__ __forceinline__ void issue_pv(typename Tiles::Output& o, typename Tiles::PFragments& p, int stage) {
    if constexpr (kSplit) {
      wg::fence_operand(o_part.d);
      wg::fence();
      issue_pv_transposed(o_part, p[1], shared.v[stage], false);
      issue_pv_transposed(o_part, p[0], shared.residual.v[stage], true);
      issue_pv_transposed(o_part, p[0], shared.v[stage], true);
      wg::commit();
    } else if constexpr (Shared::kTransposeV) {
      wg::fence();
      issue_pv_transposed(o, p, shared.v[stage], true);
      wg::commit();
    } else {
      const uint64_t b0 = wg::mn_major_desc(shared.v[stage], 0, Shared::kKVChunkBytes);
      wg::fence();
#pragma unroll
      for (int kb = 0; kb < BN / 16; ++kb)
        wg::Wgmma<T, kHeadDimPadded>::template rs<1>(o.d, p[kb], b0 + wg::mn_major_step(kb * 16), 1);
      wg::commit();
    }
  }
  // tf32: o (+)= P·V with Vᵀ [HDP, BN] K-major (keys contiguous, permuted as P's fragments are).
  __device__ __forceinline__ void issue_pv_transposed(typename Tiles::Output& o,
                                                      const uint32_t (&p)[BN / 8][4], const T* vt,
                                                      bool accumulate) {
    const uint64_t b0 = wg::k_major_desc<T, kK>(vt, 0, 0, Shared::kVtChunkBytes);
#pragma unroll
    for (int kb = 0; kb < BN / kK; ++kb)
      wg::Wgmma<Mma, kHeadDimPadded>::template rs<0>(
          o.d, p[kb], b0 + wg::k_major_step<T>(kb * kK, Shared::kVtChunkBytes), accumulate || kb > 0 ? 1 : 0);
  }
  // Split tf32: the waited-for P·V of a key tile into O (nothing otherwise).
  __device__ __forceinline__ void add_part(typename Tiles::Output& o) {
    if constexpr (kSplit) {
      wg::fence_operand(o_part.d);
#pragma unroll
      for (int i = 0; i < Tiles::Output::kRegs; ++i) o.d[i] += o_part.d[i];
    }
  }
  // Split tf32: this warpgroup's rows of the query tile split in place (high parts) and into the
  // residual tile, once the tile has landed; the warpgroup's own rows only (its wgmmas read no
  // others), published to the async proxy and the warpgroup's other warps.
  __device__ __forceinline__ void split_queries() {
    if constexpr (kSplit) {
      constexpr int kRowFloats = kConsumerRows * wg::kChunkCols<T>;  // a warpgroup's rows of one chunk
#pragma unroll
      for (int c = 0; c < Shared::kChunks; ++c) {
        const int at = c * (Shared::kQChunkBytes / int(sizeof(T))) + warpgroup * kRowFloats;
        wg::split_to_tf32<kRowFloats, wg::kThreads>(reinterpret_cast<float*>(queries() + at),
                                                    reinterpret_cast<float*>(shared.residual.q + at), thread);
      }
      tile::fence_async_shared();
      tile::named_sync(int(NamedBarrier::epilogue_first) + warpgroup, wg::kThreads);
    }
  }
  // Split tf32: the key tile at `at` is split (high parts in place, residuals beside), which the
  // splitting warps publish once it has landed; else its landing alone.
  __device__ __forceinline__ void wait_keys(const Pipeline& at) {
    if constexpr (kSplit) shared.residual.k_split[at.index].wait(at.phase);
    else shared.k_full[at.index].wait(at.phase);
  }

  // O += P·V on the value tile at `at`, waited for; the stage is released afterwards.
  __device__ __forceinline__ void pv_step(typename Tiles::Output& o, typename Tiles::PFragments& p, const Pipeline& at,
                                          bool last_turn = false) {
    shared.v_full[at.index].wait(at.phase);
    wg::fence_operand(o.d);
    take_turn();
    issue_pv(o, p, at.index);
    pass_turn(last_turn);
    wg::wait<0>();
    wg::fence_operand(o.d);
    wg::fence_operand(p);
    add_part(o);
    release(shared.v_empty[at.index]);
  }

  // Pingpong turns, one barrier per warpgroup: warpgroup w syncs on its own (128 threads) and
  // warpgroup w - 1 arrives on it (128 more). Per work tile every warpgroup takes the same number
  // of turns. Without CHAIN the last warpgroup opens the first turn of every work tile
  // (start_turns) and does not pass its last one, so the barriers are balanced at the end of
  // every tile. With CHAIN it opens the first turn once per block (begin_block) and passes every
  // turn, so the first warpgroup starts the next work tile while the others finish this one; the
  // first warpgroup takes the one turn left over when the block ends (end_block).
  static constexpr int kTurnThreads = 2 * wg::kThreads;
  __device__ __forceinline__ void open_first_turn() {
    if constexpr (PINGPONG)
      if (warpgroup == kConsumers - 1) tile::named_arrive(int(NamedBarrier::turn_first), kTurnThreads);
  }
  __device__ __forceinline__ void start_turns() {
    if constexpr (!CHAIN) open_first_turn();
  }
  __device__ __forceinline__ void begin_block() {
    if constexpr (CHAIN) open_first_turn();
  }
  __device__ __forceinline__ void end_block() {
    if constexpr (CHAIN && PINGPONG)
      if (warpgroup == 0) take_turn();
  }
  // With two warpgroups the barrier ids are immediates, one branch per warpgroup (uniform): no
  // register holds them through the loop (-Xptxas -v: the carried turns spilled 40-48 bytes at
  // head dim 128 with the ids in registers). Three keep them in registers, which spills less there.
  template <class F>
  __device__ __forceinline__ static void with_turn_barrier(int consumer, F&& f) {
    constexpr int first = int(NamedBarrier::turn_first);
    if (consumer == 0) f(std::integral_constant<int, first>{});
    else f(std::integral_constant<int, first + 1>{});
  }
  __device__ __forceinline__ void take_turn() {
    if constexpr (PINGPONG && kConsumers == 2)
      with_turn_barrier(warpgroup, [](auto id) { tile::named_sync<id(), kTurnThreads>(); });
    else if constexpr (PINGPONG)
      tile::named_sync(int(NamedBarrier::turn_first) + warpgroup, kTurnThreads);
  }
  __device__ __forceinline__ void pass_turn(bool last) {
    if constexpr (PINGPONG && kConsumers == 2) {
      if (CHAIN || !(last && warpgroup == 1))
        with_turn_barrier(1 - warpgroup, [](auto id) { tile::named_arrive<id(), kTurnThreads>(); });
    } else if constexpr (PINGPONG) {
      if (CHAIN || !(last && warpgroup == kConsumers - 1))
        tile::named_arrive(int(NamedBarrier::turn_first) + (warpgroup + 1) % kConsumers, kTurnThreads);
    }
  }

  // One arrival per consumer warp: the stage's buffer may be refilled once every warp is done.
  __device__ __forceinline__ void release(tile::MBarrier& empty) {
    if (thread % 32 == 0) empty.arrive();
  }
  // After the work tile's last Q·Kᵀ has completed: the query tile is free for the next work tile
  // (when O is staged over Q, the epilogue releases it instead).
  // Every lane's reads of the work tile's slot come before the warp's arrival.
  __device__ __forceinline__ void release_queries() {
    if constexpr (SEPARATE_O) {
      __syncwarp();
      release(shared.q_empty[query_buffer()]);
    }
  }

  // The key tiles j in [begin, end) of a work tile that every row of the warpgroup sees whole:
  // they skip the mask. Found once per work tile (the mask's visible keys are bands, so these
  // tiles are contiguous), which leaves one compare per tile in the loop.
  struct FullTiles {
    int begin, end;
    __device__ __forceinline__ FullTiles(const Mask& mask, Range rows, Range keys, int num_tiles) {
      const Range full = mask.full_keys(rows);
      const int64_t lo = full.begin - keys.begin;
      const int64_t hi = (full.end < keys.end ? full.end : keys.end) - keys.begin;
      begin = lo <= 0 ? 0 : int((lo + BN - 1) / BN);
      end = hi <= 0 ? 0 : int(hi / BN < num_tiles ? hi / BN : num_tiles);
    }
    __device__ __forceinline__ bool need_mask(int j) const { return j < begin || j >= end; }
  };

  // Mask where the tile needs it, then the online-softmax update: s becomes P, rescale[i] is what
  // row i's output accumulated so far must be multiplied by. With FOLD_SCALE the scale is folded
  // into the exponent (one FMA a score) where it is positive; tf32 (kScaleFirst) and scales of 0 or
  // below multiply first (a rounded product a score) and run the same folded update with factor
  // 1 — the row max of the scaled scores is right for either sign, and the update's state is in the
  // scaled domain either way. Scores scaled first are masked after their multiply: a negative scale
  // would turn -inf into +inf. (A second, unfolded update for non-positive scales was 1,456 of the
  // bf16 D64 `spec` kernel's 6,832 SASS instructions; a larger kernel measured slower, docs/PERF.md
  // run 89.)
  // With SPECULATE, P also goes into `next` as register-A fragments, and where `speculate` is set
  // (every key tile but a work tile's first, whose rows have no base yet) the exponentials start
  // on the rows' current bases before the row max is known (OnlineSoftmax::update_speculative):
  // s then holds the exponents, not P, and `next` is what P·V reads.
  __device__ __forceinline__ void softmax_step(typename Tiles::Scores& s, typename Tiles::Softmax& softmax,
                                               float (&rescale)[Tiles::Scores::kRows], const Mask& mask, Range rows,
                                               int64_t col0, bool need_mask, typename Tiles::PFragments& next,
                                               bool speculate) {
    const float scale = args.scale_log2;
    const bool scale_first = !FOLD_SCALE || kScaleFirst || !(scale > 0.f);
    if (scale_first) tile::thread::scale_rounded(s, scale);
    if (need_mask)
      tile::thread::mask_outside(
          s, [&](int i) { return mask.keys(rows.begin + Tiles::Scores::row(i, thread)); }, col0,
          [&](int j) { return Tiles::Scores::col(j, thread); });
    if constexpr (FOLD_SCALE) {
      const float factor = scale_first ? 1.f : scale;  // > 0 either way
      if constexpr (SPECULATE) {
        if (speculate) {
          softmax.update_speculative(s, factor, rescale,
                                     [&](const typename Tiles::Scores& p) { wg::a_from_acc<T>(next, p); });
          return;
        }
      }
      softmax.template update_scaled<true, LAZY, POLY>(s, factor, rescale);
    } else {
      softmax.template update<true>(s, rescale);
    }
    if constexpr (SPECULATE) wg::a_from_acc<T>(next, s);
  }

  // With LAZY most tiles leave every factor at 1: a warp whose rows all keep their base skips
  // the multiplies (the branch is warp-uniform).
  __device__ __forceinline__ static void apply_rescale(typename Tiles::Output& o,
                                                       const float (&rescale)[Tiles::Scores::kRows]) {
    if constexpr (LAZY) {
      bool any = false;
#pragma unroll
      for (int i = 0; i < Tiles::Output::kRows; ++i) any |= rescale[i] != 1.f;
      if (!__any_sync(0xffffffffu, any)) return;
    }
#pragma unroll
    for (int i = 0; i < Tiles::Output::kRows; ++i)
#pragma unroll
      for (int j = 0; j < Tiles::Output::kCols; ++j) o(i, j) *= rescale[i];
  }

  // The key tiles [keys.begin + j·BN) for j < num_tiles, for this warpgroup's query rows `rows`
  // under `mask` (rows and keys counted from the sequence's first; rows past seqlen_q compute on
  // zero-filled queries, or a packed call's next sequence, and are never stored). The mask is the
  // call's (dense) or the work tile's sequence's in shared memory (packed).
  __device__ void run(Pipeline& pipe, Range rows, Range keys, int num_tiles, const Mask& mask,
                      typename Tiles::Output& o, typename Tiles::Softmax& softmax) {
    typename Tiles::Scores s;  // [64, BN] scores of the tile in flight
    typename Tiles::PFragments p;  // [64, BN] P of the previous tile, register-A fragments
    typename Tiles::PFragments next;  // SPECULATE: P's other buffer (the two alternate by key tile)
    float rescale[Tiles::Scores::kRows];
    if (num_tiles == 0) {
      release_queries();
      return;
    }
    const FullTiles full(mask, rows, keys, num_tiles);
    if constexpr (!OVERLAP) {
      for (int j = 0; j < num_tiles; ++j) {
        wait_keys(pipe);
        issue_scores(s, pipe.index);
        wg::wait<0>();
        wg::fence_operand(s.d);
        release(shared.k_empty[pipe.index]);
        if (j == num_tiles - 1) release_queries();
        softmax_step(s, softmax, rescale, mask, rows, keys.begin + int64_t(j) * BN, full.need_mask(j), next, false);
        apply_rescale(o, rescale);
        wg::a_from_acc<T>(p, s);
        pv_step(o, p, pipe);
        pipe.advance();
      }
    } else {
      // Tile 0: scores and softmax alone.
      start_turns();
      wait_keys(pipe);
      take_turn();
      issue_scores(s, pipe.index);
      pass_turn(false);
      wg::wait<0>();
      wg::fence_operand(s.d);
      release(shared.k_empty[pipe.index]);
      if (num_tiles == 1) release_queries();
      softmax_step(s, softmax, rescale, mask, rows, keys.begin, full.need_mask(0), p, false);
      Pipeline previous = pipe;
      pipe.advance();
      // Key tile j > 0: P(j-1) in `cur`; with SPECULATE the softmax forms P(j) in `nxt`.
      auto step = [&](int j, typename Tiles::PFragments& cur, typename Tiles::PFragments& nxt) {
        // P(j-1) is converted here and O rescaled just before the P·V that adds to it, not after
        // the previous iteration's final wait: nothing then touches the registers that P·V reads or
        // writes until the iteration ends, so ptxas keeps that wait below the softmax, which runs
        // while P·V is in flight (with the conversion after the wait, the SASS showed the wait
        // hoisted above the whole softmax).
        if constexpr (!SPECULATE) wg::a_from_acc<T>(cur, s);
        // S(j) = Q·K(j)ᵀ and O += P(j-1)·V(j-1) in flight together.
        wait_keys(pipe);
        take_turn();
        issue_scores(s, pipe.index);
        apply_rescale(o, rescale);  // to tile j-1's row max, while S(j) runs
        shared.v_full[previous.index].wait(previous.phase);
        wg::fence_operand(o.d);
        issue_pv(o, cur, previous.index);
        pass_turn(false);
        wg::wait<1>();  // S(j) is done; P·V may still run
        wg::fence_operand(s.d);
        release(shared.k_empty[pipe.index]);
        softmax_step(s, softmax, rescale, mask, rows, keys.begin + int64_t(j) * BN, full.need_mask(j), nxt, true);
        wg::wait<0>();
        wg::fence_operand(o.d);
        wg::fence_operand(cur);
        add_part(o);
        release(shared.v_empty[previous.index]);
        previous = pipe;
        pipe.advance();
      };
      auto last_pv = [&](typename Tiles::PFragments& last) {
        if (num_tiles > 1) release_queries();  // the last Q·Kᵀ completed in the loop
        if constexpr (!SPECULATE) wg::a_from_acc<T>(last, s);
        apply_rescale(o, rescale);
        pv_step(o, last, previous, true);
      };
      if constexpr (SPECULATE) {
        // P·V of one tile reads its fragments while the softmax of the next writes the other
        // buffer: the two alternate (two tiles per turn of the loop), so no copy from one to the
        // other sits between them (a copy that ptxas folds away makes the softmax write
        // registers that an in-flight wgmma reads, and it then serialises the wgmma).
        // Each buffer's step is written once (an odd last tile leaves the loop between them): a
        // third copy of the step, for that tile, was 1,416 of the same kernel's instructions.
        for (int j = 1; j < num_tiles; j += 2) {
          step(j, p, next);
          if (j + 1 == num_tiles) {
            last_pv(next);
            return;
          }
          step(j + 1, next, p);
        }
        last_pv(p);
      } else {
        for (int j = 1; j < num_tiles; ++j) step(j, p, p);
        last_pv(p);
      }
    }
  }
};

}  // namespace fmha::cuda::sm90
