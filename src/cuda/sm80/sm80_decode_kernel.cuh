// The sm80 decode kernel: a few query rows per sequence against a long KV cache, bound by reading
// K and V once. One CTA per (split, KV head · row tile, sequence):
//   - GQA packing: the query heads of one KV head are stacked in the M dimension of the tile
//     (packed row r = query i · group + head-in-group), so each K/V tile feeds every query head
//     that reads it, and the sequence's K/V bytes are read once (once per row tile beyond 16 rows);
//   - pages are gathered with cp.async through the block table (common/paged.h PagedCache, whose
//     clamps keep a broken device table inside the cache), kStages tiles in flight;
//   - the 4 warps take 16 keys each of every 64-key tile, each with its own online softmax over
//     its keys, and their partial results are merged through shared memory at the end with the
//     weights of fmha::merge (common/merge.h merge_weights);
//   - with splits > 1, CTA `split` covers its share of the sequence's visible key tiles and
//     writes an fp32 partial (O, LSE) that merge_splits (src/cuda/merge.cu) combines.
#pragma once

#include <type_traits>

#include "common/decode.h"
#include "common/merge.h"
#include "cuda/common/args.h"
#include "cuda/sm80/sm80_fwd_mainloop.cuh"
#include "cuda/tile/tma.cuh"

namespace fmha::cuda::sm80 {

// ~100 KB of K/V in flight per CTA at every head dim (two CTAs per SM on sm_90).
constexpr int decode_default_stages(int head_dim) { return head_dim <= 64 ? 4 : (head_dim <= 128 ? 3 : 2); }

// How a decode kernel copies K and V rows into shared memory: 16-byte cp.async chunks by every
// thread (as they are, or with the L2 prefetch-size hint asking the L2 for the 256-byte block
// around each), or (sm_90; cp.async elsewhere) whole rows as bulk copies (cp.async.bulk) that
// one warp issues and that complete on one mbarrier a stage.
enum class DecodeCopy { chunks, chunks_l2_prefetch, bulk_rows };

// A decode kernel's shape: keys per stage, stages, and its K/V copies.
template <int KEYS, int STAGES, DecodeCopy COPY = DecodeCopy::chunks>
struct DecodeShape {
  static constexpr int kKeys = KEYS;
  static constexpr int kStages = STAGES;
  static constexpr DecodeCopy kCopy = COPY;
};
template <int HD>
using DecodeDefaultShape = DecodeShape<decode::kTileKeys, decode_default_stages(HD)>;

template <class T, int HD, class Shape = DecodeDefaultShape<HD>>
struct DecodeTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = decode::kTileRows;           // packed query rows: one m16 block
  static constexpr int kKeys = Shape::kKeys;                // keys per stage
  static constexpr int kWarpKeys = kKeys / kWarps;          // keys per warp and stage: whole k16 steps of P·V
  static constexpr int kVec = 16 / int(sizeof(T));          // elements per 16-byte cp.async
  static constexpr int kChunksPerRow = HD / kVec;
  static constexpr int kHeadDim = HD;
  static constexpr int kStages = Shape::kStages;
  static constexpr bool kL2Prefetch = Shape::kCopy == DecodeCopy::chunks_l2_prefetch;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr bool kBulk = false;  // bulk copies are sm_90's: cp.async chunks here
#else
  static constexpr bool kBulk = Shape::kCopy == DecodeCopy::bulk_rows;
#endif
  static_assert(kWarpKeys % tile::warp::MmaOp<T>::kK == 0, "whole P·V k-steps per warp and tile");
  static_assert(kThreads % kChunksPerRow == 0, "each thread copies one column chunk of fixed rows");
  static constexpr int kPartPad = 4;  // fp32 words: rows of the merge buffer on distinct banks

  using QTile = tile::SmemTile<T, kRows, HD, SmemPads<T>::kQK>;     // [16, HD] packed queries
  using KTile = tile::SmemTile<T, kKeys, HD, SmemPads<T>::kQK>;     // [64, HD] keys
  using VTile = tile::SmemTile<T, kKeys, HD, SmemPads<T>::kV>;      // [64, HD] values
  using PartTile = tile::SmemTile<float, kRows, HD, kPartPad>;      // [16, HD] one warp's O, fp32
  struct Pipeline {
    tile::SmemArray<KTile> k[kStages];
    tile::SmemArray<VTile> v[kStages];
  };
  struct Combine {
    tile::SmemArray<PartTile> o[kWarps];
    float lse[kWarps][kRows];
  };
  struct NoBarriers {};
  struct StageBarriers {
    tile::MBarrier full[kStages];  // stage s's K and V rows landed (bulk copies)
  };
  struct SharedStorage {
    tile::SmemArray<QTile> q;
    union {
      Pipeline pipe;      // the mainloop
      Combine combine;    // the warps' merge, after the last tile
    };
    std::conditional_t<kBulk, StageBarriers, NoBarriers> bars;
  };
  using Scores = Acc16<kWarpKeys>;  // [16, kWarpKeys] a warp's scores, then P, fp32
  using Output = Acc16<HD>;         // [16, HD] a warp's unnormalised output, fp32
  using Softmax = tile::OnlineSoftmax<2, 4>;  // rows g and g + 8, each on a quad
};

// One 16-byte cp.async (`zero`: fill the destination with zeros, reading nothing), with the L2
// prefetch-size hint where `L2_PREFETCH`.
template <bool L2_PREFETCH>
__device__ __forceinline__ void copy16(void* to, const void* from, bool zero) {
  if constexpr (L2_PREFETCH) {
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(to));
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(from),
                 "r"(zero ? 0 : 16)
                 : "memory");
  } else {
    __pipeline_memcpy_async(to, from, 16, zero ? 16 : 0);
  }
}

// Rows [0, valid) of a [kKeys, HD] K and V tile from keys col0 ... of sequence b, KV head h:
// each thread copies one 16-byte column chunk of every kRowStep-th row. Rows past `valid` are zero.
// The row's place in the cache comes from one division per thread and tile (RowWalk: the thread's
// first row's page and row in it, then each later row kRowStep keys on, which crosses at most one
// page boundary, kRowStep <= kMinPageSize), and its addresses from the page's: the block table is
// read, and the row's addresses formed from the page entry, only where the page changes (once or
// twice a tile from pages of 64; a contiguous cache, one page a sequence, has no table to read);
// every other row's addresses are the previous row's plus kRowStep rows. A division and a table
// read for every row put a reciprocal, its corrections and a dependent load before each row's
// copies (~70 instructions a row in the SASS, 8 rows a tile at head dim 128), and with 8 warps an
// SM nothing hid them.
template <class T, class Tiles>
__device__ __forceinline__ void gather_kv(const DecodeArgs& args, typename Tiles::KTile k, typename Tiles::VTile v,
                                          int64_t b, int kv_head, int64_t col0, int valid) {
  constexpr int kRowStep = Tiles::kThreads / Tiles::kChunksPerRow;
  static_assert(kRowStep <= kMinPageSize, "a thread's next row is at most one page on");
  const int c = (int(threadIdx.x) % Tiles::kChunksPerRow) * Tiles::kVec;
  const T* k_base = static_cast<const T*>(args.k) + kv_head * args.k_head_stride + c;
  const T* v_base = static_cast<const T*>(args.v) + kv_head * args.v_head_stride + c;
  const bool k_col = c < args.head_dim, v_col = c < args.head_dim_v;
  const int64_t k_step = int64_t(kRowStep) * args.k_row_stride, v_step = int64_t(kRowStep) * args.v_row_stride;
  // Keys and page sizes fit 32 bits (check_decode bounds the capacity); the clamped entry comes
  // from PagedCache::page as everywhere.
  const int page_size = int(args.cache.page_size);
  const int first = int(threadIdx.x) / Tiles::kChunksPerRow;
  RowWalk at(int(col0) + first, page_size);
  int read = -1;  // the page whose rows k_from and v_from point into
  const T* k_from = k_base;
  const T* v_from = v_base;
#pragma unroll
  for (int r = first; r < Tiles::kKeys; r += kRowStep) {
    const bool row = r < valid;
    if (row && at.page != read) {
      const int64_t entry = args.cache.page(b, at.page);
      read = at.page;
      k_from = k_base + entry * args.k_page_stride + at.within * args.k_row_stride;
      v_from = v_base + entry * args.v_page_stride + at.within * args.v_row_stride;
    }
    // A zero-filled chunk reads nothing; its source is only a harmless address inside the cache.
    copy16<Tiles::kL2Prefetch>(&k(r, c), row && k_col ? k_from : k_base, !(row && k_col));
    copy16<Tiles::kL2Prefetch>(&v(r, c), row && v_col ? v_from : v_base, !(row && v_col));
    // The next row: kRowStep rows on in this page, or (entering the next) found again above.
    at.advance(kRowStep, page_size);
    k_from += k_step;
    v_from += v_step;
  }
}

// The bulk-copy form of gather_kv (Tiles::kBulk, sm_90), by one warp: each lane takes rows lane,
// lane + 32, ... of the tile, finds the row's page (one division and a table read a row) and
// issues one bulk copy for its K row and one for its V row (head_dim and head_dim_v elements,
// whole 16-byte chunks, as the chunked copies read them), all completing on `full`, whose expected
// bytes lane 0 announces first; rows past `valid` are zeroed with plain stores (ordered before
// the tile's readers by the __syncthreads between this call and their use). Columns past the
// head dim are zeroed once per kernel (zero_tail_columns) and never written by the copies.
template <class T, class Tiles>
__device__ __forceinline__ void gather_kv_bulk(const DecodeArgs& args, typename Tiles::KTile k, typename Tiles::VTile v,
                                               tile::MBarrier& full, int64_t b, int kv_head, int64_t col0, int valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kVec = Tiles::kVec;
  const int lane = lane_id();
  const uint32_t k_bytes = uint32_t((args.head_dim + kVec - 1) / kVec * 16);
  const uint32_t v_bytes = uint32_t((args.head_dim_v + kVec - 1) / kVec * 16);
  if (lane == 0) full.arrive_expect_tx(uint32_t(valid) * (k_bytes + v_bytes));
  __syncwarp();
  const T* k_head = static_cast<const T*>(args.k) + kv_head * args.k_head_stride;
  const T* v_head = static_cast<const T*>(args.v) + kv_head * args.v_head_stride;
  const int page_size = int(args.cache.page_size);
  for (int r = lane; r < Tiles::kKeys; r += 32) {
    if (r < valid) {
      const RowWalk at(int(col0) + r, page_size);
      const int64_t entry = args.cache.page(b, at.page);
      tile::tma::load_bytes(&k(r, 0), k_head + entry * args.k_page_stride + at.within * args.k_row_stride, k_bytes,
                            full);
      tile::tma::load_bytes(&v(r, 0), v_head + entry * args.v_page_stride + at.within * args.v_row_stride, v_bytes,
                            full);
    } else {
      for (int c = 0; c < Tiles::kHeadDim; c += kVec) {
        *reinterpret_cast<float4*>(&k(r, c)) = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(&v(r, c)) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  }
#endif
}

template <class T, int HD, class Shape>
__global__ void __launch_bounds__(DecodeTiles<T, HD, Shape>::kThreads) decode_kernel(const DecodeArgs args) {
  using Tiles = DecodeTiles<T, HD, Shape>;
  constexpr int kThreads = Tiles::kThreads, kRows = Tiles::kRows, kKeys = Tiles::kKeys;
  constexpr int kStages = Tiles::kStages, kWarpKeys = Tiles::kWarpKeys, kK = tile::warp::MmaOp<T>::kK;
  extern __shared__ float4 shared_raw[];
  auto& shared = *reinterpret_cast<typename Tiles::SharedStorage*>(shared_raw);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The split merge that follows (a programmatic dependent launch) may start its blocks now: they
  // wait for this grid's writes (cudaGridDependencySynchronize), so only their launch overlaps.
  if (args.splits > 1) cudaTriggerProgrammaticLaunchCompletion();
#endif
  const int split = int(blockIdx.x);
  const int kv_head = int(blockIdx.y) / args.row_tiles;
  const int row0 = (int(blockIdx.y) % args.row_tiles) * kRows;  // first packed row of the tile
  const int64_t b = blockIdx.z;
  const int rows_valid = args.rows - row0 < kRows ? args.rows - row0 : kRows;
  const int warp = int(threadIdx.x) / 32, g = lane_id() / 4, t = lane_id() % 4;

  // The sequence's mask with its own (clamped) length, and the keys this CTA's queries see.
  const int64_t seqlen_k = args.cache.length(b);
  const Mask mask = args.masks.sequence(args.seqlen_q, seqlen_k);
  const int query_begin = row0 / args.group, query_end = (row0 + rows_valid - 1) / args.group + 1;
  const Range visible = mask.keys(Range{query_begin, query_end});
  // This split's share: whole tiles of the visible keys.
  const int64_t tiles = (visible.size() + kKeys - 1) / kKeys;
  const int64_t per_split = (tiles + args.splits - 1) / args.splits;
  const int64_t first_tile = split * per_split;
  const int64_t end_tile = first_tile + per_split < tiles ? first_tile + per_split : tiles;
  const int num_tiles = first_tile < end_tile ? int(end_tile - first_tile) : 0;
  const int64_t key0 = visible.begin + first_tile * kKeys;
  const int64_t key_end = visible.end;

  // The packed query tile: row r is query r / group of head kv_head · group + r % group.
  auto query_of = [&](int r) { return (row0 + r) / args.group; };
  auto head_of = [&](int r) { return kv_head * args.group + (row0 + r) % args.group; };
  {
    const auto q = shared.q.tile();
    for (int chunk = threadIdx.x; chunk < kRows * Tiles::kChunksPerRow; chunk += kThreads) {
      const int r = chunk / Tiles::kChunksPerRow, c = (chunk % Tiles::kChunksPerRow) * Tiles::kVec;
      const bool valid = r < rows_valid && c < args.head_dim && num_tiles > 0;
      const T* from = valid ? args.q.at<const T>(b, query_of(r), head_of(r)) + c : static_cast<const T*>(args.q.data);
      __pipeline_memcpy_async(&q(r, c), from, 16, valid ? 0 : 16);
    }
    tile::block::commit();
  }

  if constexpr (Tiles::kBulk) {
    // The stages' barriers (one arrival: the expected bytes), and the columns past the head dims,
    // which the bulk copies never write, zeroed once in every stage.
    if (threadIdx.x == 0) {
      for (int i = 0; i < kStages; ++i) shared.bars.full[i].init(1);
      tile::fence_barrier_init();
    }
    const int k_cols = (args.head_dim + Tiles::kVec - 1) / Tiles::kVec * Tiles::kVec;
    const int v_cols = (args.head_dim_v + Tiles::kVec - 1) / Tiles::kVec * Tiles::kVec;
    if (k_cols < HD || v_cols < HD)
      for (int chunk = threadIdx.x; chunk < kStages * kKeys * Tiles::kChunksPerRow; chunk += kThreads) {
        const int stage = chunk / (kKeys * Tiles::kChunksPerRow), rest = chunk % (kKeys * Tiles::kChunksPerRow);
        const int r = rest / Tiles::kChunksPerRow, c = (rest % Tiles::kChunksPerRow) * Tiles::kVec;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c >= k_cols) *reinterpret_cast<float4*>(&shared.pipe.k[stage].tile()(r, c)) = zero;
        if (c >= v_cols) *reinterpret_cast<float4*>(&shared.pipe.v[stage].tile()(r, c)) = zero;
      }
    __syncthreads();
  }

  auto issue = [&](int tile_index) {
    if (tile_index < num_tiles) {
      const int64_t col0 = key0 + int64_t(tile_index) * kKeys;
      const int valid = int(key_end - col0 < kKeys ? key_end - col0 : kKeys);
      const int stage = tile_index % kStages;
      if constexpr (Tiles::kBulk) {
        if (warp == 0)
          gather_kv_bulk<T, Tiles>(args, shared.pipe.k[stage].tile(), shared.pipe.v[stage].tile(),
                                   shared.bars.full[stage], b, kv_head, col0, valid);
      } else {
        gather_kv<T, Tiles>(args, shared.pipe.k[stage].tile(), shared.pipe.v[stage].tile(), b, kv_head, col0, valid);
      }
    }
    if constexpr (!Tiles::kBulk) tile::block::commit();
  };

  typename Tiles::Output acc;  // [16, HD] this warp's unnormalised output over its keys, fp32
  acc.fill(0.f);
  typename Tiles::Softmax softmax;
  softmax.init();
  const Range query_rows{query_begin, query_end};
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  for (int tile_index = 0; tile_index < num_tiles; ++tile_index) {
    issue(tile_index + kStages - 1);
    const int stage = tile_index % kStages;
    if constexpr (Tiles::kBulk) {
      if (tile_index == 0) tile::block::wait<0>();  // the query tile's cp.async copies
      shared.bars.full[stage].wait(uint32_t(tile_index / kStages) & 1u);
    } else {
      tile::block::wait<kStages - 1>();
    }
    __syncthreads();
    const auto q = shared.q.tile();
    const auto k = shared.pipe.k[stage].tile();
    const auto v = shared.pipe.v[stage].tile();
    const int64_t col0 = key0 + int64_t(tile_index) * kKeys + warp * kWarpKeys;  // this warp's first key
    const Range cols{col0, col0 + kWarpKeys < key_end ? col0 + kWarpKeys : key_end};

    typename Tiles::Scores s;  // [16, kWarpKeys] S = Q·K^T of this warp's keys
    s.fill(0.f);
#pragma unroll
    for (int k0 = 0; k0 < HD; k0 += kK) {
      uint32_t a[4];
      load_a<T>(a, q, 0, k0);
#pragma unroll
      for (int n0 = 0; n0 < kWarpKeys; n0 += 16) {
        uint32_t bk[2][2];
        load_b_nk<T>(bk, k, warp * kWarpKeys + n0, k0);
        tile::warp::mma<T>(s.c[n0 / 8], a, bk[0]);
        tile::warp::mma<T>(s.c[n0 / 8 + 1], a, bk[1]);
      }
    }
    tile::thread::scale(s, args.scale_log2);
    if (!(cols.size() == kWarpKeys && mask.tile_is_full(query_rows, cols)))
      tile::thread::mask_scores(
          s, mask, [&](int i) { return int64_t(query_of(g + 8 * i)); },
          [&](int j) { return col0 + Tiles::Scores::col(j, t); });

    float rescale[2];
    softmax.template update<true>(s, rescale);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < Tiles::Output::kCols; ++j) acc(i, j) *= rescale[i];

#pragma unroll
    for (int kb = 0; kb < kWarpKeys / kK; ++kb) {
      uint32_t p[4];  // [16, 16] P's keys kb·16 ... as the A fragment of one k-step of P·V
      a_from_acc<T>(p, s, kb);
#pragma unroll
      for (int n0 = 0; n0 < HD; n0 += 16) {
        uint32_t bv[2][2];
        load_b_kn<T>(bv, v, warp * kWarpKeys + kb * kK, n0);
        tile::warp::mma<T>(acc.c[n0 / 8], p, bv[0]);
        tile::warp::mma<T>(acc.c[n0 / 8 + 1], p, bv[1]);
      }
    }
    __syncthreads();  // this stage is refilled kStages - 1 iterations from now
  }
  tile::block::wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the merge buffer

  // Each warp's normalised output and LSE over its keys (0 and -inf where it saw none).
  softmax.finish();
  {
    const auto part = shared.combine.o[warp].tile();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float inv = softmax.inv_sum(i);
#pragma unroll
      for (int j = 0; j < Tiles::Output::kCols; ++j) part(g + 8 * i, Tiles::Output::col(j, t)) = acc(i, j) * inv;
      if (t == 0) shared.combine.lse[warp][g + 8 * i] = softmax.lse(i);
    }
  }
  __syncthreads();

  // The warps' parts merged row by row with fmha::merge's weights: kThreads / kRows threads per
  // row, each over a stripe of its columns. Folding the parts in warp order gives each part's
  // final weight (the later merges scale what came before).
  constexpr int kThreadsPerRow = kThreads / kRows;
  const int r = int(threadIdx.x) / kThreadsPerRow;
  if (r >= rows_valid) return;
  float weight[Tiles::kWarps];
  float lse = tile::kNegInf;
#pragma unroll
  for (int w = 0; w < Tiles::kWarps; ++w) {
    const MergeWeights m = merge_weights(lse, shared.combine.lse[w][r]);
#pragma unroll
    for (int u = 0; u < w; ++u) weight[u] *= m.a;
    weight[w] = m.b;
    lse = m.lse;
  }
  const int64_t query = query_of(r);
  const int head = head_of(r);
  const bool direct = args.splits == 1;
  T* o = args.o.at<T>(b, query, head);
  float* part_o =
      direct ? nullptr
             : args.part_o + (((int64_t(split) * args.batch + b) * args.seqlen_q + query) * args.heads + head) *
                                 args.head_dim_v;
  for (int d = int(threadIdx.x) % kThreadsPerRow; d < args.head_dim_v; d += kThreadsPerRow) {
    float x = 0.f;
#pragma unroll
    for (int w = 0; w < Tiles::kWarps; ++w)
      if (weight[w] != 0.f) x += weight[w] * shared.combine.o[w].tile()(r, d);
    if (direct)
      o[d] = tile::from_float<T>(x);
    else
      part_o[d] = x;
  }
  if (int(threadIdx.x) % kThreadsPerRow != 0) return;
  if (direct) {
    if (args.lse != nullptr)
      args.lse[b * args.lse_batch_stride + head * args.lse_head_stride + query * args.lse_seq_stride] = lse;
  } else {
    args.part_lse[((int64_t(split) * args.batch + b) * args.heads + head) * args.seqlen_q + query] = lse;
  }
}

}  // namespace fmha::cuda::sm80
