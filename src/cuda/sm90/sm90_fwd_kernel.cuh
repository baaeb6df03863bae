// The sm90 forward kernel: persistent, warp-specialised. Warpgroup 0 is the producer: one thread
// takes the block's work tiles from the tile scheduler (a global counter when the call brings its
// workspace, so that blocks that finish early take more; a fixed stride otherwise), issues every
// TMA copy (each work tile's first K tile, its Q, then its other K and V tiles through a
// STAGES-deep ring), and the warpgroup gives its registers back. Warpgroups 1.. are consumers,
// each owning 64 query rows of the work tile, with the registers raised: the mainloop on wgmma,
// then the epilogue. The producer hands each work tile's index and (query tile, head, batch) to
// the consumers with its query tile (an index past the last tile ends the kernel); both then
// walk the same ring positions, so they agree on every buffer and phase without talking beyond
// the mbarriers. Where two query buffers fit (16-bit, head dim 64: fwd_query_buffers), the next
// work tile's queries land while this one's last key tiles run.
//
// fp32 storage (tf32): V lands in a buffer of its own and the producer warpgroup's warps 1-3,
// idle at 16 bits, transpose each V tile into the Vᵀ ring the consumers read (tf32 wgmma takes
// K-major B only; see transpose_k_major in wgmma.cuh for the bank-conflict argument). They follow
// the landing buffer's ring alone: the producer ends them with a flag and a last arrival.
// Split tf32 (T = tf32x3): those warps also split each K tile once it has landed, a tile ahead of
// the V tiles (its high parts in place, its residuals beside, published on the stage's k_split
// barrier; the producer ends that walk with a flag too) and write each V tile
// as the high parts and the residuals of Vᵀ; each consumer warpgroup splits its rows of the query
// tile itself.
//
// PACKED: a variable-length call, a kernel of its own so that the dense one carries nothing of
// it. The producer walks the sequence table (PackedTileCursor), so work tiles are enumerated per
// sequence with none on padding; it publishes each work tile with its sequence (first rows, mask
// of its own lengths) in the query tile's slot. Loads address the packed tensors as [1, total, H,
// D] at the sequence's first row plus the tile's: query rows past the sequence's end compute on
// the next sequence's queries and are never stored (the epilogue bounds them), keys past it are
// cut by the sequence's mask.
#pragma once

#include <climits>

#include "cuda/sm90/sm90_fwd_epilogue.cuh"
#include "cuda/sm90/sm90_fwd_mainloop.cuh"
#include "cuda/sm90/sm90_fwd_params.h"

namespace fmha::cuda::sm90 {

template <class T, int HD, int VARIANT, bool PACKED>
struct FwdKernel {
  static constexpr bool kSplit = is_split_tf32<T>;
  static constexpr FwdConfig kConfig = kSplit ? tf32x3_fwd_config() : fwd_config(HD, VARIANT, int(sizeof(T)));
  static constexpr bool kTransposeV = sizeof(T) == 4;
  static constexpr int kTransposeWarps = wg::kThreads / 32 - 1;  // the producer warpgroup's warps 1..3
  static constexpr int BM = kConfig.tile_m(), BN = kConfig.tile_n, STAGES = kConfig.stages;
  static constexpr int kConsumers = kConfig.consumers;
  static constexpr int kThreads = kConfig.threads();
  static constexpr int kProducerRegisters = producer_registers(kConsumers, PACKED, kTransposeV);
  static constexpr int kConsumerRegisters = consumer_registers(kConsumers, PACKED, kTransposeV);
  static_assert(kProducerRegisters * kWarpgroupThreads + kConsumerRegisters * kConsumers * kWarpgroupThreads <=
                    register_pool(kThreads),
                "the register split exceeds the block's pool: setmaxnreg.inc would wait forever");
  // The output gets a staging buffer of its own wherever it fits next to Q and the K/V ring.
  static constexpr bool kSeparateO =
      sizeof(FwdShared<T, HD, BM, BN, STAGES, true>) + wg::kSwizzleAtomBytes <= kSharedLimit;
  using Mainloop =
      FwdMainloop<T, HD, BM, BN, STAGES, kConfig.overlap, kConfig.pingpong, kConfig.fold_scale, kConfig.lazy_rescale,
                  kSeparateO, kConfig.chain_turns, kConfig.poly_every, kConfig.speculate>;
  using Epilogue = FwdEpilogue<Mainloop>;
  using Shared = typename Mainloop::Shared;
  using Tiles = typename Mainloop::Tiles;
  static constexpr int kLandingStages = Shared::kLoadStages > 0 ? Shared::kLoadStages : 1;  // V's landing ring (fp32)
  // Dynamic shared memory: the storage plus slack to align its start to the swizzle atom.
  static constexpr size_t kSharedBytes = sizeof(Shared) + wg::kSwizzleAtomBytes;
  static_assert(kSharedBytes <= kSharedLimit, "the tile shapes exceed Hopper's shared memory");
  static_assert(BM <= 256 && BN <= 256, "a TMA box has at most 256 rows");

  // The slot value that ends the consumers' loop of a packed call (a dense one's is any index
  // past the last tile).
  static constexpr int kNoWork = INT_MAX;

  // A work tile as producer and consumers both see it: the query tile's rows (clamped to the
  // sequence's seqlen_q, counted from its first row), the keys any of them sees, and how many key
  // tiles cover those.
  struct Plan {
    WorkTile work;
    Range rows;
    Range keys;
    int key_tiles;
  };
  __device__ __forceinline__ static Plan plan(WorkTile work, const Mask& mask) {
    Plan p;
    p.work = work;
    const int64_t row0 = int64_t(p.work.m_block) * BM;
    p.rows = {row0, row0 + BM < mask.seqlen_q ? row0 + BM : mask.seqlen_q};
    p.keys = mask.keys(p.rows);
    p.key_tiles = int((p.keys.size() + BN - 1) / BN);
    return p;
  }
  // Dense: work tile t of the scheduler under the call's mask.
  __device__ __forceinline__ static Plan plan(const FwdParams& params, int t) {
    return plan(params.scheduler.get(t), params.args.mask);
  }
  // The work tile published in query slot `slot`: its mask, its sequence's first rows (dense:
  // the batch index), its plan.
  __device__ __forceinline__ static const Mask& slot_mask(const FwdParams& params, const Shared& shared, int slot) {
    if constexpr (PACKED) return shared.sequence[slot].mask;
    else return params.args.mask;
  }
  __device__ __forceinline__ static SequenceStart slot_start(const Shared& shared, const Plan& plan_t, int slot) {
    if constexpr (PACKED) return shared.sequence[slot].start;
    else return {plan_t.work.batch, plan_t.work.batch};
  }
  // Dense: read by lane 0 and shared with the warp (warp_read below), as the slot's index is.
  // Packed calls' every lane reads it, as it reads the slot's mask (the shuffles put 2 local-memory
  // instructions into the packed kernels at head dims 96 and 128, cuobjdump -sass).
  __device__ __forceinline__ static Plan slot_plan(const FwdParams& params, const Shared& shared, int slot, int lane) {
    const WorkTile& w = shared.work[slot];
    if constexpr (PACKED) return plan(w, slot_mask(params, shared, slot));
    const WorkTile work{warp_read(w.m_block, lane), warp_read(w.head, lane), warp_read(w.batch, lane)};
    return plan(work, slot_mask(params, shared, slot));
  }

  __device__ static void produce(const FwdParams& params, Shared& shared) {
    const AttentionArgs& args = params.args;
    tile::tma::prefetch(&params.q);
    tile::tma::prefetch(&params.k);
    tile::tma::prefetch(&params.v);
    tile::tma::prefetch(&params.o);
    tile::PipelineState<STAGES> pipe;
    tile::PipelineState<kLandingStages> landing;  // fp32: V's landing ring
    unsigned n = 0;  // the block's work tiles so far (Shared::query_buffer, query_phase, slot)
    const int total = params.scheduler.total;
    // Packed calls only: the walk over the sequence table, in shared memory (few registers here).
    PackedTileCursor& cursor = shared.cursor;
    if constexpr (PACKED) cursor = PackedTileCursor(args, BM, params.scheduler.longest_first);
    for (int t = blockIdx.x;; ++n) {
      const bool done = PACKED ? !cursor.seek(args, t) : t >= total;
      if (done) {  // no work left: the consumers see an index past the last tile and stop
        shared.q_empty[Shared::query_buffer(n)].wait(Shared::query_phase(n) ^ 1);
        shared.work_tile[Shared::slot(n)] = PACKED ? kNoWork : t;
        shared.q_full[Shared::query_buffer(n)].arrive();
        if constexpr (kSplit) {  // the splitting warps stop at the next K stage
          shared.k_empty[pipe.index].wait(pipe.phase ^ 1);
          shared.residual.k_done[pipe.index][pipe.phase] = 1;
          shared.k_full[pipe.index].arrive();
        }
        if constexpr (kTransposeV) {  // and the transposing warps at the next landing slot
          shared.landing.empty[landing.index].wait(landing.phase ^ 1);
          shared.landing.done[landing.index][landing.phase] = 1;
          shared.landing.full[landing.index].arrive();
        }
        break;
      }
      // The tile after this one, asked for now so that the counter's answer is back by then.
      const int next = params.tile_counter != nullptr ? int(gridDim.x) + atomicAdd(params.tile_counter, 1)
                                                      : t + int(gridDim.x);
      // The work tile's TMA rows of its first query and key, and its key tiles, in 32 bits from
      // here on (the producer has few registers). Packed: its sequence goes to shared memory, and
      // rows count from the sequence's first in the [1, total, H, D] maps; dense: from row 0 of
      // batch w.batch.
      WorkTile w;
      int q_row, k_row, key_tiles;
      {
        Plan plan_t;
        if constexpr (PACKED) {
          plan_t.work = cursor.tile(t);
          shared.next_sequence = args.sequence(plan_t.work.batch);
          plan_t = plan(plan_t.work, shared.next_sequence.mask);
        } else {
          plan_t = plan(params, t);
        }
        w = plan_t.work;
        q_row = (PACKED ? int(shared.next_sequence.start.q) : 0) + int(plan_t.rows.begin);
        k_row = (PACKED ? int(shared.next_sequence.start.k) : 0) + int(plan_t.keys.begin);
        key_tiles = plan_t.key_tiles;
      }
      const int kv_head = w.head / args.group;
      const int batch = PACKED ? 0 : w.batch;
      // One tile of `rows` rows into `dst` (its column chunks), completing on `full`.
      auto load_tile = [&](auto* dst, const CUtensorMap* map, int rows, int row0, int head, tile::MBarrier& full,
                           uint32_t bytes) {
        full.arrive_expect_tx(bytes);
#pragma unroll
        for (int c = 0; c < Shared::kChunks; ++c)
          tile::tma::load(dst + c * rows * Shared::kChunkCols, map, c * Shared::kChunkCols, row0, head, batch, full);
      };
      auto load_keys = [&](int j) {
        shared.k_empty[pipe.index].wait(pipe.phase ^ 1);
        load_tile(shared.k[pipe.index], &params.k, BN, k_row + j * BN, kv_head, shared.k_full[pipe.index],
                  Shared::kKVBytes);
      };
      // The first key tile goes first: its ring slot is free while the consumers may still hold
      // the query tile (the previous work tile's epilogue, when O is staged over Q; with two query
      // buffers the queries' wait is for the work tile before the previous one, long done).
      if (key_tiles > 0) load_keys(0);
      shared.q_empty[Shared::query_buffer(n)].wait(Shared::query_phase(n) ^ 1);
      const int slot = Shared::slot(n);
      shared.work_tile[slot] = t;  // published by the query tile's barrier (release)
      shared.work[slot] = w;
      if constexpr (PACKED) shared.sequence[slot] = shared.next_sequence;
      load_tile(shared.q[Shared::query_buffer(n)], &params.q, BM, q_row, w.head, shared.q_full[Shared::query_buffer(n)],
                Shared::kQBytes);
      for (int j = 0; j < key_tiles; ++j) {
        const int col0 = k_row + j * BN;
        if (j > 0) load_keys(j);
        if constexpr (kTransposeV) {
          shared.landing.empty[landing.index].wait(landing.phase ^ 1);
          load_tile(shared.v_load[landing.index], &params.v, BN, col0, kv_head, shared.landing.full[landing.index],
                    Shared::kKVBytes);
          landing.advance();
        } else {
          shared.v_empty[pipe.index].wait(pipe.phase ^ 1);
          load_tile(shared.v[pipe.index], &params.v, BN, col0, kv_head, shared.v_full[pipe.index], Shared::kKVBytes);
        }
        pipe.advance();
      }
      t = next;
    }
  }

  // A value the producer publishes in shared memory (an end flag, a work tile's index, query tile,
  // head and batch), read by lane 0 alone and given to the warp. Lane 0 makes the warp's
  // arrivals, so its read is ordered before the arrival that lets the producer rewrite the value
  // by its own program order; a read by every lane is ordered so too (through __syncwarp), but
  // compute-sanitizer's racecheck does not follow that and reports the producer's next write
  // (docs/PERF.md runs 100-102). Packed calls' sequence (its mask, read all through the
  // mainloop) is still read by every lane: racecheck reports it on many work tiles a block.
  __device__ __forceinline__ static int warp_read(const int& value, int lane) {
    return __shfl_sync(0xffffffffu, lane == 0 ? value : 0, 0);
  }
  __device__ __forceinline__ static bool warp_flag(const int& flag, int lane) { return warp_read(flag, lane) != 0; }
  // fp32: warps 1..3 of the producer warpgroup, `warp` 0..2 among them. Each V tile that lands
  // is transposed into the next Vᵀ stage once the consumers have released it; the landing slot
  // is released, and the Vᵀ stage published, by one arrival per warp after its stores are made
  // visible to the async proxy (wgmma reads them).
  // Split tf32: each K tile is split in its stage (published on k_split) and V becomes Vᵀ's high
  // parts and residuals. The consumers need K_{j+1} before V_j (tile j + 1's Q·Kᵀ is issued before
  // tile j's P·V), so before waiting for V_j the warps split K_j and K_{j+1} where they have landed
  // (a test, not a wait: the producer may issue K_{j+1} only once the consumers are done with a
  // query tile that needs V_j — before a work tile without keys, and at the end), and before
  // transposing V_j they split K_j if they have not yet (a wait: the producer issued K_j before
  // V_j). The producer ends the K walk with a flag on the next K stage (`k_done`), as it ends the
  // V walk.
  __device__ static void transpose_values(Shared& shared, int warp, int lane) {
    tile::PipelineState<STAGES> pipe;
    tile::PipelineState<kLandingStages> landing;
    [[maybe_unused]] tile::PipelineState<STAGES> keys;  // split tf32: the next K tile to split
    // Split tf32: K tiles split beyond the V tiles transposed (0 to 2), kNoMoreKeys once the end
    // flag is seen (one register: the producer warpgroup has 40).
    constexpr int kNoMoreKeys = 1 << 20;
    [[maybe_unused]] int ahead = 0;
    // Split tf32: the next K tile, landed (its stage's full barrier acquired): split it and
    // publish it, or see the end flag.
    [[maybe_unused]] auto split_keys = [&]() {
      if constexpr (kSplit) {
        if (warp_flag(shared.residual.k_done[keys.index][keys.phase], lane)) {  // written before the arrival acquired
          ahead = kNoMoreKeys;
          return;
        }
        wg::split_to_tf32<BN * Shared::kHeadDimPadded, kTransposeWarps * 32>(
            reinterpret_cast<float*>(shared.k[keys.index]), reinterpret_cast<float*>(shared.residual.k[keys.index]),
            warp * 32 + lane);
        tile::fence_async_shared();
        __syncwarp();
        if (lane == 0) shared.residual.k_split[keys.index].arrive();
        keys.advance();
        ++ahead;
      }
    };
    for (;;) {
      if constexpr (kSplit)  // K_j and K_{j+1}, those that have landed (the warp decides as one)
        while (ahead <= 1 && __all_sync(0xffffffffu, shared.k_full[keys.index].test(keys.phase))) split_keys();
      shared.landing.full[landing.index].wait(landing.phase);
      // The end flag, written before the arrival the wait acquired (re-read: the wait clobbers memory).
      if (warp_flag(shared.landing.done[landing.index][landing.phase], lane)) break;
      if constexpr (kSplit)
        while (ahead <= 0) {  // K_j before V_j
          shared.k_full[keys.index].wait(keys.phase);
          split_keys();
        }
      shared.v_empty[pipe.index].wait(pipe.phase ^ 1);
      if constexpr (kSplit)
        wg::transpose_k_major_split<BN, Shared::kHeadDimPadded, kTransposeWarps>(
            reinterpret_cast<float*>(shared.v_load[landing.index]), reinterpret_cast<float*>(shared.v[pipe.index]),
            reinterpret_cast<float*>(shared.residual.v[pipe.index]), warp, lane);
      else
        wg::transpose_k_major<BN, Shared::kHeadDimPadded, kTransposeWarps>(shared.v_load[landing.index],
                                                                            shared.v[pipe.index], warp, lane);
      tile::fence_async_shared();
      __syncwarp();
      if (lane == 0) {
        shared.landing.empty[landing.index].arrive();
        shared.v_full[pipe.index].arrive();
      }
      landing.advance();
      pipe.advance();
      if constexpr (kSplit) --ahead;  // V_j is out: K_{j+1} is now the one V_{j+1} needs
    }
  }

  __device__ static void consume(const FwdParams& params, Shared& shared, int warpgroup, int thread) {
    Mainloop mainloop{shared, params.args, warpgroup, thread};
    tile::PipelineState<STAGES> pipe;
    mainloop.begin_block();
    // The block's work tiles in turn, counted as the producer counts them (mainloop.work_count,
    // one register across the mainloop): Shared::query_buffer, query_phase and slot.
    for (;; ++mainloop.work_count) {
      const int slot = Shared::slot(mainloop.work_count);
      shared.q_full[mainloop.query_buffer()].wait(Shared::query_phase(mainloop.work_count));
      // The producer rewrites the slot once every warp's lane 0 has released a later query tile.
      const int index = warp_read(shared.work_tile[slot], thread % 32);
      if (PACKED ? index == kNoWork : index >= params.scheduler.total) break;
      mainloop.split_queries();  // split tf32: this warpgroup's query rows (nothing otherwise)
      // Packed n144: the thread's index, the consumer's and the mainloop's copy, made opaque to
      // the compiler at each work tile (tile::opaque), so that what the mainloop and the epilogue
      // derive from it (the epilogue's swizzled staging addresses among them) is computed again
      // in each work tile rather than kept in registers across it: at 232 registers, with
      // 144-key score tiles, those and the index itself spilled (-Xptxas -v, head dim 128: 16
      // local-memory instructions; none this way). The other packed kernels have none without
      // it, and it only lengthened them (8 to 88 SASS instructions).
      if constexpr (PACKED && BN == kWideKeys) tile::opaque(thread, mainloop.thread);
      typename Tiles::Output o;  // [64, HDP] fp32
      o.fill(0.f);
      typename Tiles::Softmax softmax;
      softmax.init();
      {
        const Plan plan_t = slot_plan(params, shared, slot, thread % 32);
        const int64_t my_row0 = plan_t.rows.begin + int64_t(warpgroup) * kConsumerRows;
        mainloop.run(pipe, Range{my_row0, my_row0 + kConsumerRows}, plan_t.keys, plan_t.key_tiles,
                     slot_mask(params, shared, slot), o, softmax);
      }
      // The plan again, from the slot (not kept in registers through the mainloop).
      const Plan plan_t = slot_plan(params, shared, slot, thread % 32);
      const int64_t my_row0 = plan_t.rows.begin + int64_t(warpgroup) * kConsumerRows;
      const int64_t my_end = my_row0 + kConsumerRows < plan_t.rows.end ? my_row0 + kConsumerRows : plan_t.rows.end;
      const Range my_rows{my_row0, my_end};
      Epilogue::template run<PACKED>(params, shared, warpgroup, thread, plan_t.work,
                                     slot_start(shared, plan_t, slot),
                                     my_rows.empty() ? Range{my_row0, my_row0} : my_rows, o, softmax);
    }
    mainloop.end_block();
    if (thread == 0) tile::tma::store_wait();
  }
};

template <class T, int HD, int VARIANT, bool PACKED>
__global__ void __launch_bounds__(FwdKernel<T, HD, VARIANT, PACKED>::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using K = FwdKernel<T, HD, VARIANT, PACKED>;
  extern __shared__ char shared_raw[];
  auto& shared = wg::shared_storage<typename K::Shared>(shared_raw);
  const int warpgroup = wg::uniform_index();
  const int thread = int(threadIdx.x) % wg::kThreads;
  if (threadIdx.x == 0) {
    for (int b = 0; b < K::Shared::kQBuffers; ++b) {
      shared.q_full[b].init(1);
      shared.q_empty[b].init(K::Shared::q_releases(K::kConsumers));
    }
    for (int s = 0; s < K::STAGES; ++s) {
      shared.k_full[s].init(1);
      shared.v_full[s].init(K::kTransposeV ? K::kTransposeWarps : 1);
      shared.k_empty[s].init(K::kConsumers * K::Mainloop::kConsumerWarps);
      shared.v_empty[s].init(K::kConsumers * K::Mainloop::kConsumerWarps);
    }
    if constexpr (K::kSplit)
      for (int s = 0; s < K::STAGES; ++s) {
        shared.residual.k_split[s].init(K::kTransposeWarps);
        shared.residual.k_done[s][0] = shared.residual.k_done[s][1] = 0;
      }
    if constexpr (K::kTransposeV) {
      for (int s = 0; s < K::Shared::kLoadStages; ++s) {
        shared.landing.full[s].init(1);
        shared.landing.empty[s].init(K::kTransposeWarps);
        shared.landing.done[s][0] = shared.landing.done[s][1] = 0;
      }
    }
    tile::fence_barrier_init();
  }
  __syncthreads();
  if (warpgroup == 0) {
    tile::registers_decrease<K::kProducerRegisters>();
    if (thread == 0) K::produce(params, shared);
    if constexpr (K::kTransposeV)
      if (thread >= 32) K::transpose_values(shared, thread / 32 - 1, thread % 32);
  } else {
    tile::registers_increase<K::kConsumerRegisters>();
    K::consume(params, shared, warpgroup - 1, thread);
  }
#endif
}

}  // namespace fmha::cuda::sm90
