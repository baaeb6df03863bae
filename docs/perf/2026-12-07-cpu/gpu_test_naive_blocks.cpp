// The GPU tests' naive computations before and after their key blocks and FMA clone
// (docs/PERF.md, "The GPU tests' naive computations: 8 keys at a time"), on the development
// machine without a GPU. It includes tests/gpu/gpu_test_util.cpp for today's functions and carries
// those of commit 5a0a1e3 under old_ names: first it checks that they give bitwise the same O, LSE,
// dQ, dK and dV on 16 shapes, then it times each on two problems of the sm90 tests. Built from a
// CUDA build directory (libfmha.a), with the flags of the tests' build:
//   c++ -O3 -DNDEBUG -std=gnu++20 -ffp-contract=off -DFMHA_WITH_CUDA=1 -DFMHA_TEST_HEAD_DIMS=\"64,128\" \
//     -DFMHA_TEST_DECODE_HEAD_DIMS=\"128\" -I<src>/src -I<src>/include -I<src>/tests \
//     -isystem /usr/local/cuda/include <src>/docs/perf/2026-12-07-cpu/gpu_test_naive_blocks.cpp \
//     libfmha.a /usr/local/cuda/lib/libcudart.so /usr/lib/x86_64-linux-gnu/libgtest.a \
//     -L/usr/local/cuda/targets/x86_64-linux/lib -lcudadevrt -lrt -lpthread -ldl -o naive_blocks && ./naive_blocks
#include "gpu/gpu_test_util.cpp"  // its anonymous-namespace functions, today's
#include <chrono>
#include <cstdio>
#include <cstring>
namespace fmha::test { namespace {
NaiveForward old_naive_forward(const HostProblem& hp) {
  const Case& c = hp.c;
  const Layouts L = layouts(c);
  const Problem s = Problem::of(hp.params());
  NaiveForward r;
  r.o.assign(size_t(c.batch * c.seqlen_q * c.heads * c.head_dim_v), 0.f);
  r.lse.assign(size_t(c.batch * c.heads * c.seqlen_q), -std::numeric_limits<float>::infinity());
  const bool tf32 = c.precision == Precision::tf32;
  auto in = [&](float x) { return tf32 ? round_to_tf32(x) : x; };
  // Q and K as the tier's Q·Kᵀ sees them, V as its P·V does; [B, S, H, D] rows of D.
  auto in_qk = [&](float x) { return truncates_scores(c) ? truncate_to_tf32(x) : in(x); };
  const std::vector<float> qf = as_float(hp.q, c.dtype, L.q, in_qk), kf = as_float(hp.k, c.dtype, L.k, in_qk),
                           vf = as_float(hp.v, c.dtype, L.v, in);
  auto q_row = [&](int64_t b, int64_t i, int64_t h) { return &qf[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim)]; };
  auto k_row = [&](int64_t b, int64_t j, int64_t h) { return &kf[size_t(((b * c.seqlen_k + j) * c.kv_heads + h) * c.head_dim)]; };
  auto v_row = [&](int64_t b, int64_t j, int64_t h) { return &vf[size_t(((b * c.seqlen_k + j) * c.kv_heads + h) * c.head_dim_v)]; };
  std::vector<float> scores, acc(size_t(c.head_dim_v));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const Range keys = s.mask.keys(i);
        if (keys.empty()) continue;
        const int64_t kvh = h / s.group;
        const float* q = q_row(b, i, h);
        scores.assign(size_t(keys.size()), 0.f);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const float* k = k_row(b, j, kvh);
          float dot = 0.f, abs_dot = 0.f;
          for (int64_t d = 0; d < c.head_dim; ++d) {
            dot = std::fma(q[d], k[d], dot);
            abs_dot += std::abs(q[d] * k[d]);
          }
          r.abs_score_max = std::max(r.abs_score_max, double(abs_dot) * std::abs(s.scale));
          scores[size_t(j - keys.begin)] = dot * s.scale;
          m = std::max(m, dot * s.scale);
        }
        float l = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const float p = std::exp(scores[size_t(j - keys.begin)] - m);
          l += p;
          const float pr = round_matmul(c, p);
          const float* v = v_row(b, j, kvh);
          for (int64_t d = 0; d < c.head_dim_v; ++d) acc[size_t(d)] = std::fma(pr, v[d], acc[size_t(d)]);
        }
        for (int64_t d = 0; d < c.head_dim_v; ++d)
          r.o[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim_v + d)] = round_to(c.dtype, acc[size_t(d)] / l);
        r.lse[size_t((b * c.heads + h) * c.seqlen_q + i)] = m + std::log(l);
      }
  return r;
}

NaiveBackward old_naive_backward(const HostProblem& hp) {
  const Case& c = hp.c;
  const Layouts L = layouts(c);
  const Problem s = Problem::of(hp.params());
  const bool tf32 = c.precision == Precision::tf32;
  auto in = [&](float x) { return tf32 ? round_to_tf32(x) : x; };
  // Q and K as the tier's scores see them (dK and dQ take them rounded); V, dO and O as the
  // other products do; [B, S, H, D] rows of D.
  auto in_qk = [&](float x) { return truncates_scores(c) ? truncate_to_tf32(x) : in(x); };
  auto as_is = [](float x) { return x; };
  const std::vector<float> q_s = as_float(hp.q, c.dtype, L.q, in_qk), k_s = as_float(hp.k, c.dtype, L.k, in_qk),
                           q_in = as_float(hp.q, c.dtype, L.q, in), k_in = as_float(hp.k, c.dtype, L.k, in),
                           v_in = as_float(hp.v, c.dtype, L.v, in), dout_in = as_float(hp.dout, c.dtype, L.o, in),
                           o_f = as_float(hp.o, c.dtype, L.o, as_is);
  auto q_row = [&](const std::vector<float>& t, int64_t b, int64_t i, int64_t h) {
    return &t[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim)];
  };
  auto k_row = [&](const std::vector<float>& t, int64_t b, int64_t j, int64_t h) {
    return &t[size_t(((b * c.seqlen_k + j) * c.kv_heads + h) * c.head_dim)];
  };
  std::vector<float> dq(size_t(c.batch * c.seqlen_q * c.heads * c.head_dim), 0.f);
  std::vector<float> dk(size_t(c.batch * c.seqlen_k * c.kv_heads * c.head_dim), 0.f);
  std::vector<float> dv(size_t(c.batch * c.seqlen_k * c.kv_heads * c.head_dim_v), 0.f);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const Range keys = s.mask.keys(i);
        const int64_t kvh = h / s.group;
        const size_t o_at = size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim_v);
        const float *o = &o_f[o_at], *dout = &dout_in[o_at];
        const float *qs = q_row(q_s, b, i, h), *qi = q_row(q_in, b, i, h);
        // Δ = rowsum(O ∘ dO) with dO as dP's product sees it: the tf32 tiers form Δ from dO
        // rounded to tf32, so that dP − Δ cancels where a row sees one key and O is V.
        float delta = 0.f;
        for (int64_t d = 0; d < c.head_dim_v; ++d) delta += o[d] * dout[d];
        const float lse = reinterpret_cast<const float*>(hp.lse.data())[(b * c.heads + h) * c.seqlen_q + i];
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const float *ks = k_row(k_s, b, j, kvh), *ki = k_row(k_in, b, j, kvh);
          const float* v = &v_in[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim_v)];
          float dot = 0.f, dp = 0.f;
          for (int64_t d = 0; d < c.head_dim; ++d) dot = std::fma(qs[d], ks[d], dot);
          for (int64_t d = 0; d < c.head_dim_v; ++d) dp = std::fma(dout[d], v[d], dp);
          const float p = std::exp(dot * s.scale - lse);
          const float ds = round_matmul(c, p * (dp - delta));
          const float pr = round_matmul(c, p);
          float* dv_row = &dv[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim_v)];
          for (int64_t d = 0; d < c.head_dim_v; ++d) dv_row[d] += pr * dout[d];
          float* dk_row = &dk[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim)];
          float* dq_row = &dq[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim)];
          for (int64_t d = 0; d < c.head_dim; ++d) {
            dk_row[d] += ds * qi[d] * s.scale;
            dq_row[d] += ds * ki[d] * s.scale;
          }
        }
      }
  for (std::vector<float>* x : {&dq, &dk, &dv})
    for (float& e : *x) e = round_to(c.dtype, e);
  return {dq, dk, dv};
}


bool same(const std::vector<float>& u, const std::vector<float>& v) {
  return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
}
int run_check() {
  int bad = 0;
  for (int k = 0; k < 16; ++k) {
    Case c;
    c.backend = k % 3 == 0 ? Backend::cuda_sm90 : Backend::cuda_sm80;
    c.dtype = k % 2 ? DType::bf16 : DType::fp16;
    if (k % 4 == 3) { c.dtype = DType::fp32; c.precision = Precision::tf32; }
    c.batch = 2, c.heads = 4, c.kv_heads = k % 2 ? 2 : 4, c.seqlen_q = 37 + k, c.seqlen_k = 50 + 3 * k;
    c.head_dim = k < 12 ? 64 : 256, c.head_dim_v = k % 5 == 1 ? 32 : c.head_dim;
    c.causal = k % 3 == 1 ? Causal::bottom_right : Causal::none;
    if (k == 14) c.window_left = 9, c.window_right = 3;
    c.bhsd_layout = k % 4 == 2;
    if (k == 15) c.key_ramp = 800;
    const HostProblem hp = make_problem(c, 1000 + k);
    const NaiveForward a = naive_forward(hp), b = old_naive_forward(hp);
    const NaiveBackward x = naive_backward(hp), y = old_naive_backward(hp);
    const bool ok = same(a.o, b.o) && same(a.lse, b.lse) && same(x.dq, y.dq) && same(x.dk, y.dk) && same(x.dv, y.dv);
    std::printf("%-60s %s; largest scale*sum|q k|: %.3f (bound) vs %.3f (each pair)\n", c.name().c_str(),
                ok ? "bitwise same" : "DIFFERENT", a.abs_score_max, b.abs_score_max);
    bad += !ok || !(a.abs_score_max >= b.abs_score_max * (1 - 1e-6));
  }
  return bad;
}
}}
int main() {
  using namespace fmha; using namespace fmha::test;
  int bad = run_check();
  auto t = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  for (int shape = 0; shape < 2; ++shape) {
    Case c; c.backend = Backend::cuda_sm90; c.dtype = DType::bf16; c.heads = 8; c.kv_heads = 4; c.seqlen_k = 150;
    if (shape == 0) c.batch = 8, c.seqlen_q = 600, c.head_dim = c.head_dim_v = 128, c.causal = Causal::bottom_right;
    else c.batch = 32, c.seqlen_q = 200, c.head_dim = c.head_dim_v = 256;
    const HostProblem hp = make_problem(c, 7);
    NaiveForward a, b; NaiveBackward x, y;
    const double to = t([&] { b = old_naive_forward(hp); }), tn = t([&] { a = naive_forward(hp); });
    const double bo = t([&] { y = old_naive_backward(hp); }), bn = t([&] { x = naive_backward(hp); });
    const double rf = t([&] { (void)reference::forward(hp.params(), 1); });
    const bool ok = same(a.o, b.o) && same(a.lse, b.lse) && same(x.dq, y.dq) && same(x.dk, y.dk) && same(x.dv, y.dv);
    bad += !ok;
    std::printf("%s: naive forward %.2f s -> %.2f s, naive backward %.2f s -> %.2f s (%s); oracle forward on one thread %.2f s\n",
                c.name().c_str(), to, tn, bo, bn, ok ? "bitwise same" : "DIFFERENT", rf);
  }
  return bad;
}
