// Small host-side helpers for tests that drive the C++ API directly: owned fp32/fp16/bf16
// tensors with random contents, and a forward/backward Params over them.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "fmha/fmha.h"

namespace fmha::testing {

struct HostTensor {
  std::vector<uint32_t> storage;  // 4-byte words: aligned for every dtype
  Tensor view;

  HostTensor() = default;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    storage.assign(size_t((n * int64_t(dtype_size(dtype)) + 3) / 4 + 1), 0u);
    view = make_tensor(storage.data(), dtype, shape);
  }
  int64_t numel() const { return view.numel(); }
  float at(int64_t i) const { return load_element(view.data, view.dtype, i); }
  void set(int64_t i, float x) { store_element(view.data, view.dtype, i, x); }
  void fill(float x) {
    for (int64_t i = 0; i < numel(); ++i) set(i, x);
  }
  void randomize(std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < numel(); ++i) set(i, normal(rng));
  }
  std::vector<unsigned char> bytes() const {
    const auto* p = reinterpret_cast<const unsigned char*>(storage.data());
    return {p, p + storage.size() * 4};
  }
};

// Q, K, V (+ O, LSE, dO, dQ, dK, dV) of one problem, contiguous [B, S, H, D].
struct Problem {
  HostTensor q, k, v, o, lse, dout, dq, dk, dv;

  Problem(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim,
          int64_t head_dim_v, DType dtype = DType::fp32, uint64_t seed = 1)
      : q(dtype, {batch, seqlen_q, heads, head_dim}),
        k(dtype, {batch, seqlen_k, kv_heads, head_dim}),
        v(dtype, {batch, seqlen_k, kv_heads, head_dim_v}),
        o(dtype, {batch, seqlen_q, heads, head_dim_v}),
        lse(DType::fp32, {batch, heads, seqlen_q}),
        dout(dtype, {batch, seqlen_q, heads, head_dim_v}),
        dq(dtype, {batch, seqlen_q, heads, head_dim}),
        dk(dtype, {batch, seqlen_k, kv_heads, head_dim}),
        dv(dtype, {batch, seqlen_k, kv_heads, head_dim_v}) {
    std::mt19937_64 rng(seed);
    q.randomize(rng);
    k.randomize(rng);
    v.randomize(rng);
    dout.randomize(rng);
  }

  Params params(Backend backend = Backend::cpu) {
    Params p;
    p.q = q.view;
    p.k = k.view;
    p.v = v.view;
    p.o = o.view;
    p.lse = lse.view;
    p.dout = dout.view;
    p.dq = dq.view;
    p.dk = dk.view;
    p.dv = dv.view;
    p.backend = backend;
    return p;
  }
};

}  // namespace fmha::testing
