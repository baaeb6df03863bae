// The sm90 forward's work tiles of a packed (variable-length) call, found on the device: per
// sequence its query tiles times the heads, the sequences in table order, so that no work tile
// falls on padding and the host never reads the tables. Plain C++ (host and device), so that the
// CPU tests walk the same cursor as the kernel.
#pragma once

#include <cstdint>

#include "cuda/common/args.h"
#include "fmha/mask.h"

namespace fmha::cuda::sm90 {

struct WorkTile {
  int m_block;  // query tile index (inside its sequence for packed calls)
  int head;
  int batch;    // batch index, or sequence index for packed calls
};

// A walk over the work tiles of a packed call. Work tile t is in the sequence b whose tiles start
// at first(b) = Σ_{b' < b} m_blocks(b') · heads; inside a sequence the heads vary fastest (the
// blocks in flight share its K and V), and under masks the query tiles run from the last (the
// most keys) to the first. seek() only moves forward, which is how the producer asks (the tile
// counter and the static stride both hand out increasing indices): each block reads each
// sequence's table entry once. The lengths are read as AttentionArgs::sequence() reads them,
// clamped, so a broken table gives wrong tiles but never a row outside the tensors, and never more
// than batch · ceil(seqlen_q / tile_m) · heads tiles (the bound the launcher checks).
struct PackedTileCursor {
  int tile_m = 0;              // query rows per work tile
  int heads = 0;
  bool longest_first = false;
  int batch = -1;              // the sequence of the last seek (batch after the last sequence)
  int first = 0;               // index of that sequence's first work tile
  int tiles = 0;               // its work tiles: m_blocks · heads
  int m_blocks = 0;
  int64_t next_begin = 0;      // the table's raw entry batch + 1 (the next sequence's begin)

  PackedTileCursor() = default;
  // Reads nothing: a dense kernel may construct one and never seek.
  FMHA_HOST_DEVICE PackedTileCursor(const AttentionArgs& args, int rows_per_tile, bool reverse)
      : tile_m(rows_per_tile), heads(args.heads), longest_first(reverse) {}

  // Moves to the sequence that holds work tile t (t at least the last seek's); false when t is
  // past the last work tile.
  FMHA_HOST_DEVICE bool seek(const AttentionArgs& args, int t) {
    while (t - first >= tiles) {
      if (batch + 1 >= args.batch) {
        batch = args.batch;
        return false;
      }
      first += tiles;
      ++batch;
      // Clamped as sequence() clamps: begin to [0, total_q], end to [begin, total_q], the length
      // to seqlen_q (max_seqlen_q, at most total_q).
      const int64_t begin = clamp(batch == 0 ? args.packed.cu_seqlens_q[0] : next_begin, 0, args.packed.total_q);
      next_begin = args.packed.cu_seqlens_q[int64_t(batch + 1) * args.packed.stride_q];
      const int64_t end = clamp(next_begin, begin, args.packed.total_q);
      const int64_t length = end - begin < args.seqlen_q ? end - begin : args.seqlen_q;
      m_blocks = int((length + tile_m - 1) / tile_m);
      tiles = m_blocks * heads;
    }
    return true;
  }

  // Work tile t, after a seek(t) that returned true.
  FMHA_HOST_DEVICE WorkTile tile(int t) const {
    const int in_sequence = t - first;
    const int m = in_sequence / heads;
    WorkTile w;
    w.m_block = longest_first ? m_blocks - 1 - m : m;
    w.head = in_sequence - m * heads;
    w.batch = batch;
    return w;
  }

 private:
  FMHA_HOST_DEVICE static int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }
};

// The most work tiles a packed call can have whatever its tables hold (each sequence's length is
// clamped to seqlen_q, but broken tables may overlap sequences): what must fit the int32 tile
// indices.
inline int64_t packed_tile_bound(const AttentionArgs& args, int tile_m) {
  return (args.seqlen_q + tile_m - 1) / tile_m * args.batch * args.heads;
}

}  // namespace fmha::cuda::sm90
