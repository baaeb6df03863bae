// The GPU tests' host-side checking, before and after 2026-12-07's changes, on one problem, without
// a GPU (docs/PERF.md, "The GPU tests' host time"). It includes tests/gpu/gpu_test_util.cpp for
// today's functions and carries the earlier ones (compare4 as of commit 3c71ae0, the naive forward
// and backward as of 99b0bc0) under old_ names: first it checks that the naive computations give
// bitwise the same results on 12 shapes, then it times each pair on B8 H8 (4 KV heads), 600 x 150,
// D128, bf16, bottom-right causal. Built and run from a CUDA build directory (libfmha.a), with
// -ffp-contract=off as the tests' build has it for gpu_test_util.cpp since its FMA clone (without
// it that clone may contract a multiply and an add, and one shape's check reports DIFFERENT):
//   c++ -O3 -DNDEBUG -std=gnu++20 -ffp-contract=off -DFMHA_WITH_CUDA=1 -DFMHA_TEST_HEAD_DIMS=\"64,128\" \
//     -DFMHA_TEST_DECODE_HEAD_DIMS=\"128\" -I<src>/src -I<src>/include -I<src>/tests \
//     -isystem /usr/local/cuda/include <src>/docs/perf/2026-12-07-cpu/gpu_test_host_time.cpp \
//     libfmha.a /usr/local/cuda/lib/libcudart.so /usr/lib/x86_64-linux-gnu/libgtest.a \
//     -L/usr/local/cuda/targets/x86_64-linux/lib -lcudadevrt -lrt -lpthread -ldl -o host_time && ./host_time
#include "gpu/gpu_test_util.cpp"  // its anonymous-namespace functions, today's
#include <cstring>
namespace fmha::test { namespace {
template <class ExactZero>
Errors old_compare4(const std::vector<uint8_t>& gpu, DType dtype, const Layout& l, const std::vector<double>& ref,
                const std::vector<float>& naive, ExactZero exact_zero, const char* name) {
  Errors e;
  for (int64_t b = 0; b < l.shape[0]; ++b)
    for (int64_t s = 0; s < l.shape[1]; ++s)
      for (int64_t h = 0; h < l.shape[2]; ++h)
        for (int64_t d = 0; d < l.shape[3]; ++d) {
          const size_t idx = size_t(((b * l.shape[1] + s) * l.shape[2] + h) * l.shape[3] + d);
          const double x = at(gpu, dtype, l, b, s, h, d);
          const double r = ref[idx];
          std::ostringstream where;
          where << name << "[" << b << "," << s << "," << h << "," << d << "] = " << x << " (fp64 " << r << ")";
          if (std::isnan(x)) {
            if (e.nan++ == 0 && e.first_bad.empty()) e.first_bad = "NaN or unwritten at " + where.str();
            continue;
          }
          if (exact_zero(b, s, h) && x != 0.0) {
            if (e.not_exact++ == 0 && e.first_bad.empty()) e.first_bad = "expected exactly 0 at " + where.str();
          }
          const double err = std::abs(x - r);
          if (err > e.kernel) {
            e.kernel = err;
            if (e.first_bad.empty() || e.first_bad.rfind("worst", 0) == 0) e.first_bad = "worst " + where.str();
          }
          e.naive = std::max(e.naive, std::abs(double(naive[idx]) - r));
          e.ref_max = std::max(e.ref_max, std::abs(r));
        }
  return e;
}

NaiveForward old_naive_forward(const HostProblem& hp) {
  const Case& c = hp.c;
  const Layouts L = layouts(c);
  const Problem s = Problem::of(hp.params());
  NaiveForward r;
  r.o.assign(size_t(c.batch * c.seqlen_q * c.heads * c.head_dim_v), 0.f);
  r.lse.assign(size_t(c.batch * c.heads * c.seqlen_q), -std::numeric_limits<float>::infinity());
  const bool tf32 = c.precision == Precision::tf32;
  auto in = [&](float x) { return tf32 ? round_to_tf32(x) : x; };
  // Q and K as the tier's Q·Kᵀ sees them.
  auto in_qk = [&](float x) { return truncates_scores(c) ? truncate_to_tf32(x) : in(x); };
  std::vector<float> scores, acc(size_t(c.head_dim_v));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const Range keys = s.mask.keys(i);
        if (keys.empty()) continue;
        const int64_t kvh = h / s.group;
        scores.assign(size_t(keys.size()), 0.f);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          float dot = 0.f;
          for (int64_t d = 0; d < c.head_dim; ++d)
            dot = std::fma(in_qk(at(hp.q, c.dtype, L.q, b, i, h, d)), in_qk(at(hp.k, c.dtype, L.k, b, j, kvh, d)), dot);
          scores[size_t(j - keys.begin)] = dot * s.scale;
          m = std::max(m, dot * s.scale);
        }
        float l = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const float p = std::exp(scores[size_t(j - keys.begin)] - m);
          l += p;
          const float pr = round_matmul(c, p);
          for (int64_t d = 0; d < c.head_dim_v; ++d) acc[size_t(d)] = std::fma(pr, in(at(hp.v, c.dtype, L.v, b, j, kvh, d)), acc[size_t(d)]);
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
  // Q and K as the tier's scores see them (dK and dQ take them rounded).
  auto in_qk = [&](float x) { return truncates_scores(c) ? truncate_to_tf32(x) : in(x); };
  std::vector<float> dq(size_t(c.batch * c.seqlen_q * c.heads * c.head_dim), 0.f);
  std::vector<float> dk(size_t(c.batch * c.seqlen_k * c.kv_heads * c.head_dim), 0.f);
  std::vector<float> dv(size_t(c.batch * c.seqlen_k * c.kv_heads * c.head_dim_v), 0.f);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const Range keys = s.mask.keys(i);
        const int64_t kvh = h / s.group;
        // Δ = rowsum(O ∘ dO) with dO as dP's product sees it: the tf32 tiers form Δ from dO
        // rounded to tf32, so that dP − Δ cancels where a row sees one key and O is V.
        float delta = 0.f;
        for (int64_t d = 0; d < c.head_dim_v; ++d)
          delta += at(hp.o, c.dtype, L.o, b, i, h, d) * in(at(hp.dout, c.dtype, L.o, b, i, h, d));
        const float lse = reinterpret_cast<const float*>(hp.lse.data())[(b * c.heads + h) * c.seqlen_q + i];
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          float dot = 0.f, dp = 0.f;
          for (int64_t d = 0; d < c.head_dim; ++d)
            dot = std::fma(in_qk(at(hp.q, c.dtype, L.q, b, i, h, d)), in_qk(at(hp.k, c.dtype, L.k, b, j, kvh, d)),
                           dot);
          for (int64_t d = 0; d < c.head_dim_v; ++d)
            dp = std::fma(in(at(hp.dout, c.dtype, L.o, b, i, h, d)), in(at(hp.v, c.dtype, L.v, b, j, kvh, d)), dp);
          const float p = std::exp(dot * s.scale - lse);
          const float ds = round_matmul(c, p * (dp - delta));
          const float pr = round_matmul(c, p);
          for (int64_t d = 0; d < c.head_dim_v; ++d)
            dv[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim_v + d)] +=
                pr * in(at(hp.dout, c.dtype, L.o, b, i, h, d));
          for (int64_t d = 0; d < c.head_dim; ++d) {
            dk[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim + d)] +=
                ds * in(at(hp.q, c.dtype, L.q, b, i, h, d)) * s.scale;
            dq[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim + d)] +=
                ds * in(at(hp.k, c.dtype, L.k, b, j, kvh, d)) * s.scale;
          }
        }
      }
  for (std::vector<float>* x : {&dq, &dk, &dv})
    for (float& e : *x) e = round_to(c.dtype, e);
  return {dq, dk, dv};
}


}
int run_check() {
  int bad = 0;
  for (int k = 0; k < 12; ++k) {
    Case c;
    c.backend = k % 3 == 0 ? Backend::cuda_sm90 : Backend::cuda_sm80;
    c.dtype = k % 2 ? DType::bf16 : DType::fp16;
    if (k % 4 == 3) { c.dtype = DType::fp32; c.precision = Precision::tf32; }
    c.batch = 2, c.heads = 4, c.kv_heads = k % 2 ? 2 : 4, c.seqlen_q = 37 + k, c.seqlen_k = 50 + 3 * k;
    c.head_dim = 64, c.head_dim_v = k % 5 == 1 ? 32 : 64;
    c.causal = k % 3 == 1 ? Causal::bottom_right : Causal::none;
    c.bhsd_layout = k % 4 == 2;
    const HostProblem hp = make_problem(c, 1000 + k);
    const NaiveForward a = naive_forward(hp), b = old_naive_forward(hp);
    const NaiveBackward x = naive_backward(hp), y = old_naive_backward(hp);
    auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
      return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0; };
    const bool ok = same(a.o, b.o) && same(a.lse, b.lse) && same(x.dq, y.dq) && same(x.dk, y.dk) && same(x.dv, y.dv);
    std::printf("%s %s\n", c.name().c_str(), ok ? "bitwise same" : "DIFFERENT");
    bad += !ok;
  }
  return bad;
}
}
#include <chrono>
int main() {
  using namespace fmha; using namespace fmha::test;
  int bad = run_check();
  Case c; c.backend = Backend::cuda_sm90; c.dtype = DType::bf16; c.batch = 8; c.heads = 8; c.kv_heads = 4;
  c.seqlen_q = 600; c.seqlen_k = 150; c.head_dim = c.head_dim_v = 128; c.causal = Causal::bottom_right;
  const HostProblem hp = make_problem(c, 7);
  auto t = [](auto f) { auto t0 = std::chrono::steady_clock::now(); f(); return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  NaiveForward a, b; NaiveBackward x, y;
  const double tn = t([&] { a = naive_forward(hp); }), to = t([&] { b = old_naive_forward(hp); });
  const double bn = t([&] { x = naive_backward(hp); }), bo = t([&] { y = old_naive_backward(hp); });
  const double rf = t([&] { (void)reference::forward(hp.params()); });
  std::printf("%s: naive forward %.2f s -> %.2f s, naive backward %.2f s -> %.2f s; oracle forward %.2f s (%s)\n", c.name().c_str(), to, tn, bo, bn, rf,
              a.o == b.o && x.dq == y.dq && x.dk == y.dk && x.dv == y.dv ? "same" : "DIFFERENT");
  const Layouts L = layouts(c);
  const Problem s = Problem::of(hp.params());
  auto masked_row = [&](int64_t, int64_t row, int64_t) { return s.mask.keys(row).empty(); };
  Errors e1, e2;
  const double cn = t([&] { e1 = compare4(hp.o, c.dtype, L.o, hp.ref.o, a.o, masked_row, "o"); });
  const double co = t([&] { e2 = old_compare4(hp.o, c.dtype, L.o, hp.ref.o, a.o, masked_row, "o"); });
  std::printf("compare4 on O (%zu elements): %.2f s -> %.2f s (%s)\n", hp.ref.o.size(), co, cn,
              e1.kernel == e2.kernel && e1.first_bad == e2.first_bad && e1.not_exact == e2.not_exact ? "same result" : "DIFFERENT");
  return bad;
}
