// Fragment loads of the sm80 tier: shared-memory tiles and probability registers into the mma
// operand layouts of tile/mma.cuh. 16-bit types use ldmatrix; fp32 (tf32, and split tf32, whose
// fragments hold a high and a residual half: convert.cuh set_operand) uses 64-bit shared loads
// with a k-permutation: logical k = t and t + 4 of an m16n8k8 step stand for the adjacent
// columns 2t and 2t + 1. A dot product does not care about the order of its k terms, and with
// that order a lane's A and B operands are adjacent pairs, and the P tile's accumulator registers
// are already A fragments.
#pragma once

#include "cuda/tile/convert.cuh"
#include "cuda/tile/mma.cuh"
#include "cuda/tile/reduce.cuh"

namespace fmha::cuda::sm80 {

// A warp's [16, N] fp32 accumulator in the Acc16 layout of tile/mma.cuh: c[n/8] is one m16n8 C
// fragment; element (i, j) = row g + 8i, column (j/2)·8 + 2t + j%2.
template <int N>
struct Acc16 {
  static_assert(N % 16 == 0, "accumulators cover pairs of n8 tiles");
  static constexpr int kRows = 2, kCols = N / 4, kTiles = N / 8;
  float c[kTiles][4];
  __device__ __forceinline__ float& operator()(int i, int j) { return c[j / 2][2 * i + (j & 1)]; }
  __device__ __forceinline__ const float& operator()(int i, int j) const { return c[j / 2][2 * i + (j & 1)]; }
  __device__ __forceinline__ void fill(float x) {
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[n][e] = x;
  }
  // Column of element j within the tile, for lane t.
  __device__ __forceinline__ static int col(int j, int t) { return (j / 2) * 8 + 2 * t + (j & 1); }
};

__device__ __forceinline__ int lane_id() { return int(threadIdx.x) % 32; }

// A fragment of rows [row0, row0+16), columns [k0, k0 + kK) of a row-major tile.
template <class T>
using FragA = uint32_t[tile::warp::MmaOp<T>::kA];  // one A operand fragment of storage T
template <class T>
using FragB = uint32_t[tile::warp::MmaOp<T>::kB];  // one B operand fragment

template <class T, class Tile>
__device__ __forceinline__ void load_a(FragA<T>& a, Tile tile, int row0, int k0) {
  const int lane = lane_id();
  if constexpr (sizeof(T) == 2) {
    tile::warp::ldmatrix_x4(a, &tile(row0 + lane % 8 + ((lane / 8) % 2) * 8, k0 + (lane / 16) * 8));
  } else {
    const int g = lane / 4, t = lane % 4;
    const float2 top = *reinterpret_cast<const float2*>(&tile(row0 + g, k0 + 2 * t));
    const float2 bottom = *reinterpret_cast<const float2*>(&tile(row0 + g + 8, k0 + 2 * t));
    tile::set_operand<T>(a, 0, top.x);
    tile::set_operand<T>(a, 2, top.y);
    tile::set_operand<T>(a, 1, bottom.x);
    tile::set_operand<T>(a, 3, bottom.y);
  }
}

// B fragments of two n8 tiles (n0, n0 + 8) from a tile stored [n][k] (keys: S = Q·K^T).
template <class T, class Tile>
__device__ __forceinline__ void load_b_nk(FragB<T> (&b)[2], Tile tile, int n0, int k0) {
  const int lane = lane_id();
  if constexpr (sizeof(T) == 2) {
    const int m = lane / 8;
    uint32_t r[4];
    tile::warp::ldmatrix_x4(r, &tile(n0 + (m / 2) * 8 + lane % 8, k0 + (m % 2) * 8));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
  } else {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const float2 pair = *reinterpret_cast<const float2*>(&tile(n0 + 8 * x + g, k0 + 2 * t));
      tile::set_operand<T>(b[x], 0, pair.x);
      tile::set_operand<T>(b[x], 1, pair.y);
    }
  }
}

// B fragments of two n8 tiles (n0, n0 + 8) from a tile stored [k][n] (values: O += P·V).
template <class T, class Tile>
__device__ __forceinline__ void load_b_kn(FragB<T> (&b)[2], Tile tile, int k0, int n0) {
  const int lane = lane_id();
  if constexpr (sizeof(T) == 2) {
    const int m = lane / 8;
    uint32_t r[4];
    tile::warp::ldmatrix_x4_trans(r, &tile(k0 + (m % 2) * 8 + lane % 8, n0 + (m / 2) * 8));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
  } else {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      tile::set_operand<T>(b[x], 0, tile::to_float(tile(k0 + 2 * t, n0 + 8 * x + g)));
      tile::set_operand<T>(b[x], 1, tile::to_float(tile(k0 + 2 * t + 1, n0 + 8 * x + g)));
    }
  }
}

// The A fragment of k-step kb of P·V, straight from P's accumulator registers (no shared-memory
// round trip): a k16 step spans two n8 tiles of P, a k8 (tf32) step one.
template <class T, class Acc>
__device__ __forceinline__ void a_from_acc(FragA<T>& a, const Acc& p, int kb) {
  if constexpr (sizeof(T) == 2) {
    a[0] = tile::pack2<T>(p(0, 4 * kb), p(0, 4 * kb + 1));
    a[1] = tile::pack2<T>(p(1, 4 * kb), p(1, 4 * kb + 1));
    a[2] = tile::pack2<T>(p(0, 4 * kb + 2), p(0, 4 * kb + 3));
    a[3] = tile::pack2<T>(p(1, 4 * kb + 2), p(1, 4 * kb + 3));
  } else {
    tile::set_operand<T>(a, 0, p(0, 2 * kb));
    tile::set_operand<T>(a, 1, p(1, 2 * kb));
    tile::set_operand<T>(a, 2, p(0, 2 * kb + 1));
    tile::set_operand<T>(a, 3, p(1, 2 * kb + 1));
  }
}

}  // namespace fmha::cuda::sm80
