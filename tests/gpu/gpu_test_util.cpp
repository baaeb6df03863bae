// Device buffers, random inputs, the naive same-precision attention and the accuracy checks of
// the GPU kernel tests (the rule is stated in gpu_test_util.h).
#include "gpu_test_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "common/numeric.h"
#include "common/problem.h"
#include "common/tensor_access.h"
#include "cpu/reference.h"

namespace fmha::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kAbsoluteSlack = 1e-6;

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

double unit_roundoff(DType d) {
  switch (d) {
    case DType::fp16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// The sm90 tier's tf32 Q·Kᵀ (the forward's S, the backward's Sᵀ = K·Qᵀ) reads Q and K straight
// from TMA's tiles: the tensor cores use the top 19 bits of each fp32 operand (truncation to
// tf32, not rounding; truncate_to_tf32). Its other products take operands it rounded (to nearest).
bool truncates_scores(const Case& c) { return c.precision == Precision::tf32 && c.backend == Backend::cuda_sm90; }

// The rounding the tier applies to matmul operands (P, dS; and inputs for tf32).
float round_matmul(const Case& c, float x) {
  if (c.precision == Precision::tf32) return round_to_tf32(x);
  return round_to(c.dtype, x);
}

struct Layout {
  int64_t shape[4];
  int64_t stride[4];
};

// [B, S, H, D] sizes; stored as BSHD, or BHSD when `bhsd`.
Layout layout4(int64_t b, int64_t s, int64_t h, int64_t d, bool bhsd) {
  Layout l{{b, s, h, d}, {s * h * d, h * d, d, 1}};
  if (bhsd) {
    l.stride[0] = h * s * d;
    l.stride[1] = d;
    l.stride[2] = s * d;
  }
  return l;
}

Tensor view(void* data, DType dtype, const Layout& l, Device device) {
  return make_tensor(data, dtype, {l.shape[0], l.shape[1], l.shape[2], l.shape[3]},
                     {l.stride[0], l.stride[1], l.stride[2], l.stride[3]}, device);
}

struct Layouts {
  Layout q, k, v, o;
};
Layouts layouts(const Case& c) {
  return {layout4(c.batch, c.seqlen_q, c.heads, c.head_dim, c.bhsd_layout),
          layout4(c.batch, c.seqlen_k, c.kv_heads, c.head_dim, false),
          layout4(c.batch, c.seqlen_k, c.kv_heads, c.head_dim_v, false),
          layout4(c.batch, c.seqlen_q, c.heads, c.head_dim_v, c.bhsd_layout)};
}

size_t bytes_of(const Layout& l, DType d) {
  return size_t(l.shape[0] * l.shape[1] * l.shape[2] * l.shape[3]) * dtype_size(d);
}

std::vector<uint8_t> random_tensor(const Layout& l, DType d, std::mt19937_64& rng) {
  std::vector<uint8_t> out(bytes_of(l, d));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const int64_t n = l.shape[0] * l.shape[1] * l.shape[2] * l.shape[3];
  for (int64_t i = 0; i < n; ++i) store_element(out.data(), d, i, dist(rng));
  return out;
}

// Element (b, s, h, d) of a stored tensor as float.
float at(const std::vector<uint8_t>& data, DType dtype, const Layout& l, int64_t b, int64_t s, int64_t h, int64_t d) {
  return load_element(data.data(), dtype, b * l.stride[0] + s * l.stride[1] + h * l.stride[2] + d);
}

// A stored tensor as float, contiguous [B, S, H, D], each element passed through `round` (the
// operand rounding a tier applies): the naive computations read their operands from these, not
// through `at` in their innermost loops.
template <class Round>
std::vector<float> as_float(const std::vector<uint8_t>& data, DType dtype, const Layout& l, Round&& round) {
  std::vector<float> out(size_t(l.shape[0] * l.shape[1] * l.shape[2] * l.shape[3]));
  size_t i = 0;
  for (int64_t b = 0; b < l.shape[0]; ++b)
    for (int64_t s = 0; s < l.shape[1]; ++s)
      for (int64_t h = 0; h < l.shape[2]; ++h)
        for (int64_t d = 0; d < l.shape[3]; ++d) out[i++] = round(at(data, dtype, l, b, s, h, d));
  return out;
}

// The naive computations below are most of a GPU test's host time. On an x86-64 CPU with FMA
// they run as a clone built for it (std::fma inline rather than a call into libm; the file is
// compiled without floating-point contraction, so both clones give the same bits).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FMHA_TEST_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define FMHA_TEST_FMA_CLONES
#endif

// Row `a` against the rows b[0..kKeyBlock) (a block's unused entries may repeat a row): each
// product summed by fma in order d = 0, 1, ..., len - 1, as one key alone would be (bitwise the
// same), the keys' chains interleaved so that they overlap rather than wait on each other.
constexpr int kKeyBlock = 8;
inline __attribute__((always_inline)) void dots_in_order(const float* a, const float* const (&b)[kKeyBlock],
                                                         int64_t len, float (&out)[kKeyBlock]) {
  float acc[kKeyBlock] = {};
  for (int64_t d = 0; d < len; ++d)
    for (int t = 0; t < kKeyBlock; ++t) acc[t] = std::fma(a[d], b[t][d], acc[t]);
  for (int t = 0; t < kKeyBlock; ++t) out[t] = acc[t];
}

struct NaiveForward {
  std::vector<float> o, lse;  // [B, Sq, H, Dv] rounded to dtype; [B, H, Sq]
  // At least scale · sum_d |q_d k_d| for every row and key: per batch and KV head,
  // max over keys of sum_d max_rows|q_d| · |k_d|.
  double abs_score_max = 0;
};

FMHA_TEST_FMA_CLONES NaiveForward naive_forward(const HostProblem& hp) {
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
        for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kKeyBlock) {
          const int n = int(std::min<int64_t>(kKeyBlock, keys.end - j0));
          const float* k[kKeyBlock];
          for (int t = 0; t < kKeyBlock; ++t) k[t] = k_row(b, j0 + std::min(t, n - 1), kvh);
          float dot[kKeyBlock];
          dots_in_order(q, k, c.head_dim, dot);
          for (int t = 0; t < n; ++t) {
            scores[size_t(j0 + t - keys.begin)] = dot[t] * s.scale;
            m = std::max(m, dot[t] * s.scale);
          }
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
  std::vector<float> q_max(size_t(c.head_dim));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t kvh = 0; kvh < c.kv_heads; ++kvh) {
      std::fill(q_max.begin(), q_max.end(), 0.f);
      for (int64_t h = kvh * s.group; h < (kvh + 1) * s.group; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i)
          for (int64_t d = 0; d < c.head_dim; ++d) q_max[size_t(d)] = std::max(q_max[size_t(d)], std::abs(q_row(b, i, h)[d]));
      for (int64_t j = 0; j < c.seqlen_k; ++j) {
        double sum = 0;
        for (int64_t d = 0; d < c.head_dim; ++d) sum += double(q_max[size_t(d)]) * std::abs(k_row(b, j, kvh)[d]);
        r.abs_score_max = std::max(r.abs_score_max, sum * std::abs(double(s.scale)));
      }
    }
  return r;
}

struct NaiveBackward {
  std::vector<float> dq, dk, dv;  // contiguous [B, S, H, D], rounded to dtype
};

FMHA_TEST_FMA_CLONES NaiveBackward naive_backward(const HostProblem& hp) {
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
        float dots[kKeyBlock], dps[kKeyBlock];  // the block's Q·Kᵀ and dO·Vᵀ
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const int t = int((j - keys.begin) % kKeyBlock);
          if (t == 0) {
            const int n = int(std::min<int64_t>(kKeyBlock, keys.end - j));
            const float *ks_block[kKeyBlock], *v_block[kKeyBlock];
            for (int u = 0; u < kKeyBlock; ++u) {
              const int64_t key = j + std::min(u, n - 1);
              ks_block[u] = k_row(k_s, b, key, kvh);
              v_block[u] = &v_in[size_t(((b * c.seqlen_k + key) * c.kv_heads + kvh) * c.head_dim_v)];
            }
            dots_in_order(qs, ks_block, c.head_dim, dots);
            dots_in_order(dout, v_block, c.head_dim_v, dps);
          }
          const float *ki = k_row(k_in, b, j, kvh);
          const float dot = dots[t], dp = dps[t];
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

// Compares a downloaded GPU tensor (layout l) against the oracle and the naive result, both
// contiguous [B, S, H, D]. `exact_zero(b, s)` says which rows must be exactly 0.
template <class ExactZero>
Errors compare4(const std::vector<uint8_t>& gpu, DType dtype, const Layout& l, const std::vector<double>& ref,
                const std::vector<float>& naive, ExactZero exact_zero, const char* name) {
  Errors e;
  for (int64_t b = 0; b < l.shape[0]; ++b)
    for (int64_t s = 0; s < l.shape[1]; ++s)
      for (int64_t h = 0; h < l.shape[2]; ++h)
        for (int64_t d = 0; d < l.shape[3]; ++d) {
          const size_t idx = size_t(((b * l.shape[1] + s) * l.shape[2] + h) * l.shape[3] + d);
          const double x = at(gpu, dtype, l, b, s, h, d);
          const double r = ref[idx];
          // The element's description, formatted only where a message takes it (formatting it for
          // every element was most of a large test's host time).
          auto where = [&] {
            std::ostringstream w;
            w << name << "[" << b << "," << s << "," << h << "," << d << "] = " << x << " (fp64 " << r << ")";
            return w.str();
          };
          if (std::isnan(x)) {
            if (e.nan++ == 0 && e.first_bad.empty()) e.first_bad = "NaN or unwritten at " + where();
            continue;
          }
          if (exact_zero(b, s, h) && x != 0.0) {
            if (e.not_exact++ == 0 && e.first_bad.empty()) e.first_bad = "expected exactly 0 at " + where();
          }
          const double err = std::abs(x - r);
          if (err > e.kernel) {
            e.kernel = err;
            if (e.first_bad.empty() || e.first_bad.rfind("worst", 0) == 0) e.first_bad = "worst " + where();
          }
          e.naive = std::max(e.naive, std::abs(double(naive[idx]) - r));
          e.ref_max = std::max(e.ref_max, std::abs(r));
        }
  return e;
}

// What a tensor-core tier's Q·Kᵀ may add to a score's error beyond the naive fp32 FMAs': the
// tensor cores add each k-step's products (8 or more a step) into the fp32 accumulator aligned to
// the largest and truncated, not rounded to nearest (Fasi, Higham, Mikaitis and Pranesh,
// "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021), so a step may lose up to about 2
// units of roundoff of the partial sum, every step the same way. LSE moves by at most a score's
// error (its derivatives, the softmax weights, sum to 1), so this bounds the LSE's extra error too;
// it is what a D256 row with scores near 50 showed (3.1e-5 beside the naive's 1.0e-5).
double accumulation_bound(const Case& c, const NaiveForward& naive) {
  if (c.backend == Backend::cuda_simt || c.backend == Backend::cpu || c.backend == Backend::reference) return 0.0;
  constexpr double kProductsPerStep = 8, kUlpsPerStep = 2;
  const double steps = std::ceil(double(c.head_dim) / kProductsPerStep);
  return steps * kUlpsPerStep * unit_roundoff(DType::fp32) * naive.abs_score_max;
}

// LSE [B, H, Sq] from the GPU (g) against the oracle's and the naive one; rows that see no key
// must be exactly -inf. `accumulation`: the tier's matmul term (accumulation_bound).
Errors lse_errors(const float* g, const std::vector<double>& ref, const std::vector<float>& naive,
                  double accumulation) {
  Errors e;
  e.accumulation = accumulation;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (!(std::isinf(g[i]) && g[i] < 0) && e.not_exact++ == 0)
        e.first_bad = "lse[" + std::to_string(i) + "] = " + std::to_string(g[i]) + ", expected -inf";
      continue;
    }
    if (std::isnan(g[i])) {
      if (e.nan++ == 0) e.first_bad = "lse[" + std::to_string(i) + "] is NaN or unwritten";
      continue;
    }
    e.kernel = std::max(e.kernel, std::abs(double(g[i]) - ref[i]));
    e.naive = std::max(e.naive, std::abs(double(naive[i]) - ref[i]));
    e.ref_max = std::max(e.ref_max, std::abs(ref[i]));
  }
  return e;
}

std::string verdict(const Errors& e, DType dtype, const char* name) {
  std::ostringstream out;
  const double bound = 2 * e.naive + 2 * unit_roundoff(dtype) * e.ref_max + e.accumulation + kAbsoluteSlack;
  if (e.nan > 0 || e.not_exact > 0 || !(e.kernel <= bound)) {
    out << name << ": error " << e.kernel << " vs bound " << bound << " (naive " << e.naive << ", max|ref| " << e.ref_max;
    if (e.accumulation > 0) out << ", accumulation " << e.accumulation;
    out << "), " << e.nan << " NaN/unwritten, " << e.not_exact << " not exactly zero; " << e.first_bad << "\n";
  }
  return out.str();
}

Device current_cuda_device() {
  int ordinal = 0;
  cuda_ok(cudaGetDevice(&ordinal), "cudaGetDevice");
  return Device{DeviceType::cuda, ordinal};
}

// Device copies of a problem and the views a GPU call needs.
struct DeviceProblem {
  DeviceBuffer q, k, v, o, lse, dout, dq, dk, dv, workspace;
  Params params;
};

DeviceProblem upload(const HostProblem& hp, bool backward) {
  const Case& c = hp.c;
  const Layouts L = layouts(c);
  const Device dev = current_cuda_device();
  DeviceProblem d;
  d.q = DeviceBuffer(hp.q.size(), size_t(c.base_offset));
  d.q.upload(hp.q);
  d.k = DeviceBuffer(hp.k.size(), size_t(c.base_offset));
  d.k.upload(hp.k);
  d.v = DeviceBuffer(hp.v.size(), size_t(c.base_offset));
  d.v.upload(hp.v);
  d.o = DeviceBuffer(hp.o.size(), size_t(c.base_offset));
  d.lse = DeviceBuffer(hp.lse.size(), size_t(c.base_offset));
  Params& p = d.params;
  p.q = view(d.q.ptr, c.dtype, L.q, dev);
  p.k = view(d.k.ptr, c.dtype, L.k, dev);
  p.v = view(d.v.ptr, c.dtype, L.v, dev);
  p.o = view(d.o.ptr, c.dtype, L.o, dev);
  if (c.with_lse || backward) p.lse = make_tensor(d.lse.ptr, DType::fp32, {c.batch, c.heads, c.seqlen_q}, dev);
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.q_offset = c.q_offset;
  p.precision = c.precision;
  p.softmax_scale = c.softmax_scale;
  p.deterministic = c.deterministic;
  p.backend = c.backend;
  if (backward) {
    d.o.upload(hp.o);
    d.lse.upload(hp.lse);
    d.dout = DeviceBuffer(hp.dout.size(), size_t(c.base_offset));
    d.dout.upload(hp.dout);
    d.dq = DeviceBuffer(hp.q.size(), size_t(c.base_offset + c.grad_offset));
    d.dk = DeviceBuffer(hp.k.size(), size_t(c.base_offset + c.grad_offset));
    d.dv = DeviceBuffer(hp.v.size(), size_t(c.base_offset + c.grad_offset));
    p.dout = view(d.dout.ptr, c.dtype, L.o, dev);
    p.dq = view(d.dq.ptr, c.dtype, L.q, dev);
    p.dk = view(d.dk.ptr, c.dtype, L.k, dev);
    p.dv = view(d.dv.ptr, c.dtype, L.v, dev);
  }
  // The workspace the call asks for (the sm90 forward's is its dynamic scheduler's counter).
  size_t bytes = 0;
  throw_if_error(workspace_size(p, backward ? Direction::backward : Direction::forward, &bytes));
  d.workspace = DeviceBuffer(bytes);
  p.workspace = d.workspace.ptr;
  p.workspace_bytes = bytes;
  return d;
}

std::string run_and_sync(const Params& p, Direction dir) {
  const Status s = dir == Direction::forward ? forward(p) : backward(p);
  if (!s.ok()) return std::string("call failed: ") + to_string(s.code) + ": " + s.message + "\n";
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return std::string("kernel failed: ") + cudaGetErrorString(err) + "\n";
  return "";
}

}  // namespace

namespace {
// One key at a time, as the naive computations summed before their key blocks (and as the one
// key alone is defined to be summed): fma in order d = 0, 1, ...
float dot_one_key(const float* a, const float* b, int64_t len) {
  float acc = 0.f;
  for (int64_t d = 0; d < len; ++d) acc = std::fma(a[d], b[d], acc);
  return acc;
}
}  // namespace

double lse_accumulation_bound(const Case& c, uint64_t seed) {
  return accumulation_bound(c, naive_forward(make_problem(c, seed)));
}

FMHA_TEST_FMA_CLONES std::string check_naive_dots(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  for (int64_t len : {1, 7, 64, 96, 128, 256, 257}) {
    std::vector<float> a(static_cast<size_t>(len)), rows(static_cast<size_t>(len * kKeyBlock));
    for (float& x : a) x = dist(rng);
    for (float& x : rows) x = dist(rng);
    for (int n = 1; n <= kKeyBlock; ++n) {
      const float* b[kKeyBlock];
      for (int t = 0; t < kKeyBlock; ++t) b[t] = &rows[size_t(std::min(t, n - 1) * len)];
      float out[kKeyBlock];
      dots_in_order(a.data(), b, len, out);
      for (int t = 0; t < n; ++t) {
        const float one = dot_one_key(a.data(), b[t], len);
        if (std::memcmp(&one, &out[t], sizeof(float)) != 0) {
          std::ostringstream msg;
          msg.precision(9);
          msg << "length " << len << ", block of " << n << ", key " << t << ": " << out[t] << " in the block, " << one
              << " alone\n";
          return msg.str();
        }
      }
    }
  }
  return "";
}

int device_arch() {
  int ordinal = 0, major = 0, minor = 0;
  cudaGetDevice(&ordinal);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  return major * 10 + minor;
}

bool have_cuda_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

std::vector<int64_t> decode_head_dims() {
  std::vector<int64_t> out;
  std::stringstream in(FMHA_TEST_DECODE_HEAD_DIMS);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("FMHA_TEST_SEED")) return uint64_t(std::strtoull(env, nullptr, 10));
    return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  return seed;
}

DeviceBuffer::DeviceBuffer(size_t n, size_t offset) : bytes(n) {
  if (n > 0) {
    cuda_ok(cudaMalloc(&base, n + offset), "cudaMalloc");
    ptr = static_cast<char*>(base) + offset;
  }
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr, o.ptr);
  std::swap(base, o.base);
  std::swap(bytes, o.bytes);
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (base) cudaFree(base);
}
void DeviceBuffer::upload(const std::vector<uint8_t>& host) {
  if (bytes) cuda_ok(cudaMemcpy(ptr, host.data(), std::min(bytes, host.size()), cudaMemcpyHostToDevice), "upload");
}
std::vector<uint8_t> DeviceBuffer::download() const {
  std::vector<uint8_t> out(bytes);
  if (bytes) cuda_ok(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost), "download");
  return out;
}
void DeviceBuffer::poison() {
  if (bytes) cuda_ok(cudaMemset(ptr, 0xFF, bytes), "poison");
}

std::string Case::name() const {
  std::ostringstream out;
  out << to_string(backend) << "_" << (precision != Precision::ieee ? to_string(precision) : to_string(dtype)) << "_b"
      << batch
      << "_q" << seqlen_q << "_k" << seqlen_k << "_h" << heads << "x" << kv_heads << "_d" << head_dim;
  if (head_dim_v != head_dim) out << "v" << head_dim_v;
  if (causal == Causal::top_left) out << "_causalTL";
  if (causal == Causal::bottom_right) out << "_causalBR";
  if (window_left >= 0 || window_right >= 0) out << "_win" << (window_left < 0 ? "inf" : std::to_string(window_left)) << "_"
        << (window_right < 0 ? "inf" : std::to_string(window_right));
  if (q_offset != 0) out << "_off" << (q_offset < 0 ? "m" : "") << std::abs(q_offset);
  if (!with_lse) out << "_nolse";
  if (deterministic) out << "_det";
  if (bhsd_layout) out << "_bhsd";
  if (base_offset) out << "_at" << base_offset;
  if (grad_offset) out << "_grads_at" << grad_offset;
  if (key_ramp > 0) out << "_ramp" << key_ramp;
  if (softmax_scale != 0.f)  // in thousandths (a test name holds letters, digits and underscores)
    out << "_scale" << (softmax_scale < 0 ? "m" : "") << std::lround(std::abs(double(softmax_scale)) * 1000.0);
  return out.str();
}

Params HostProblem::params() const {
  const Layouts L = layouts(c);
  Params p;
  p.q = view(const_cast<uint8_t*>(q.data()), c.dtype, L.q, {});
  p.k = view(const_cast<uint8_t*>(k.data()), c.dtype, L.k, {});
  p.v = view(const_cast<uint8_t*>(v.data()), c.dtype, L.v, {});
  p.o = view(const_cast<uint8_t*>(o.data()), c.dtype, L.o, {});
  p.lse = make_tensor(const_cast<uint8_t*>(lse.data()), DType::fp32, {c.batch, c.heads, c.seqlen_q});
  p.dout = view(const_cast<uint8_t*>(dout.data()), c.dtype, L.o, {});
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.q_offset = c.q_offset;
  p.precision = c.precision;
  p.softmax_scale = c.softmax_scale;
  return p;
}

HostProblem make_problem(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Layouts L = layouts(c);
  HostProblem hp;
  hp.c = c;
  hp.q = random_tensor(L.q, c.dtype, rng);
  hp.k = random_tensor(L.k, c.dtype, rng);
  hp.v = random_tensor(L.v, c.dtype, rng);
  hp.dout = random_tensor(L.o, c.dtype, rng);
  if (c.key_ramp > 0) {
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t s = 0; s < c.seqlen_q; ++s)
        for (int64_t h = 0; h < c.heads; ++h)
          store_element(hp.q.data(), c.dtype, b * L.q.stride[0] + s * L.q.stride[1] + h * L.q.stride[2], 1.f);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.seqlen_k; ++j)
        for (int64_t h = 0; h < c.kv_heads; ++h) {
          const double x = double(j) / double(c.seqlen_k);
          store_element(hp.k.data(), c.dtype, b * L.k.stride[0] + j * L.k.stride[1] + h * L.k.stride[2],
                        float(c.key_ramp * x * x));
        }
  }
  hp.o.assign(bytes_of(L.o, c.dtype), 0);
  hp.lse.assign(size_t(c.batch * c.heads * c.seqlen_q) * sizeof(float), 0);
  // O and LSE as a forward would have stored them: the oracle's, rounded to the storage formats.
  hp.ref = reference::forward(hp.params());
  const reference::ForwardResult& ref = hp.ref;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t s = 0; s < c.seqlen_q; ++s)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t d = 0; d < c.head_dim_v; ++d)
          store_element(hp.o.data(), c.dtype, b * L.o.stride[0] + s * L.o.stride[1] + h * L.o.stride[2] + d,
                        float(ref.o[size_t(((b * c.seqlen_q + s) * c.heads + h) * c.head_dim_v + d)]));
  for (size_t i = 0; i < ref.lse.size(); ++i) reinterpret_cast<float*>(hp.lse.data())[i] = float(ref.lse[i]);
  return hp;
}

std::string check_forward(const Case& c, uint64_t seed) {
  const HostProblem hp = make_problem(c, seed);
  const Layouts L = layouts(c);
  DeviceProblem d = upload(hp, false);
  d.o.poison();
  d.lse.poison();
  if (std::string err = run_and_sync(d.params, Direction::forward); !err.empty()) return err;

  const reference::ForwardResult& ref = hp.ref;
  const NaiveForward naive = naive_forward(hp);
  const Problem s = Problem::of(hp.params());
  auto masked_row = [&](int64_t, int64_t row, int64_t) { return s.mask.keys(row).empty(); };
  std::string msg = verdict(compare4(d.o.download(), c.dtype, L.o, ref.o, naive.o, masked_row, "o"), c.dtype, "o");
  if (c.with_lse) {
    const std::vector<uint8_t> lse = d.lse.download();
    msg += verdict(lse_errors(reinterpret_cast<const float*>(lse.data()), ref.lse, naive.lse, accumulation_bound(c, naive)), DType::fp32, "lse");
  }
  return msg;
}

std::string check_backward(const Case& c, uint64_t seed) {
  const HostProblem hp = make_problem(c, seed);
  const Layouts L = layouts(c);
  DeviceProblem d = upload(hp, true);
  d.dq.poison();
  d.dk.poison();
  d.dv.poison();
  d.workspace.poison();
  if (std::string err = run_and_sync(d.params, Direction::backward); !err.empty()) return err;

  const reference::BackwardResult ref = reference::backward(hp.params());
  const NaiveBackward naive = naive_backward(hp);
  const Problem s = Problem::of(hp.params());
  auto masked_row = [&](int64_t, int64_t row, int64_t) { return s.mask.keys(row).empty(); };
  auto unseen_key = [&](int64_t, int64_t key, int64_t) { return s.mask.queries(key).empty(); };
  std::string msg;
  msg += verdict(compare4(d.dq.download(), c.dtype, L.q, ref.dq, naive.dq, masked_row, "dq"), c.dtype, "dq");
  msg += verdict(compare4(d.dk.download(), c.dtype, L.k, ref.dk, naive.dk, unseen_key, "dk"), c.dtype, "dk");
  msg += verdict(compare4(d.dv.download(), c.dtype, L.v, ref.dv, naive.dv, unseen_key, "dv"), c.dtype, "dv");
  return msg;
}

std::string check_single_key_rows_cancel(const Case& c, uint64_t seed) {
  constexpr double kCancelUlps = 16.0;
  const HostProblem hp = make_problem(c, seed);
  const Layouts L = layouts(c);
  DeviceProblem d = upload(hp, true);
  // O and LSE from the tier's own forward.
  Params fwd = d.params;
  fwd.dout = fwd.dq = fwd.dk = fwd.dv = Tensor{};
  fwd.workspace = nullptr, fwd.workspace_bytes = 0;
  d.o.poison();
  d.lse.poison();
  if (std::string err = run_and_sync(fwd, Direction::forward); !err.empty()) return err;
  d.dq.poison();
  d.dk.poison();
  d.dv.poison();
  if (std::string err = run_and_sync(d.params, Direction::backward); !err.empty()) return err;
  const std::vector<uint8_t> dq = d.dq.download(), dk = d.dk.download();
  const Problem s = Problem::of(hp.params());
  std::vector<double> dk_bound(size_t(c.batch * c.seqlen_k * c.kv_heads), 0.0);
  std::vector<bool> dk_checked(dk_bound.size(), true);
  std::ostringstream out;
  int64_t bad = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const Range keys = s.mask.keys(i);
        const int64_t kvh = h / s.group;
        if (keys.size() != 1) {
          for (int64_t j = keys.begin; j < keys.end; ++j) dk_checked[size_t((b * c.seqlen_k + j) * c.kv_heads + kvh)] = false;
          continue;
        }
        const int64_t j = keys.begin;
        double terms = 0.0, k_max = 0.0, q_max = 0.0;  // sum_d |dO·V|; max|K_j|; max|Q_i|
        for (int64_t e = 0; e < c.head_dim_v; ++e)
          terms += std::abs(double(at(hp.dout, c.dtype, L.o, b, i, h, e)) * at(hp.v, c.dtype, L.v, b, j, kvh, e));
        for (int64_t e = 0; e < c.head_dim; ++e) {
          k_max = std::max(k_max, std::abs(double(at(hp.k, c.dtype, L.k, b, j, kvh, e))));
          q_max = std::max(q_max, std::abs(double(at(hp.q, c.dtype, L.q, b, i, h, e))));
        }
        const double unit = kCancelUlps * std::ldexp(1.0, -24) * std::abs(double(s.scale)) * terms;
        dk_bound[size_t((b * c.seqlen_k + j) * c.kv_heads + kvh)] += unit * q_max;
        for (int64_t e = 0; e < c.head_dim; ++e) {
          const double x = at(dq, c.dtype, L.q, b, i, h, e);
          if (!(std::abs(x) <= unit * k_max) && bad++ == 0)
            out << "dq[" << b << "," << i << "," << h << "," << e << "] = " << x << ", bound " << unit * k_max
                << " (a row that sees one key)\n";
        }
      }
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.seqlen_k; ++j)
      for (int64_t kvh = 0; kvh < c.kv_heads; ++kvh) {
        const size_t idx = size_t((b * c.seqlen_k + j) * c.kv_heads + kvh);
        if (!dk_checked[idx]) continue;
        for (int64_t e = 0; e < c.head_dim; ++e) {
          const double x = at(dk, c.dtype, L.k, b, j, kvh, e);
          if (!(std::abs(x) <= dk_bound[idx]) && bad++ == 0)
            out << "dk[" << b << "," << j << "," << kvh << "," << e << "] = " << x << ", bound " << dk_bound[idx]
                << " (a key that only one-key rows see)\n";
        }
      }
  if (bad > 0) out << bad << " elements above the bound\n";
  return out.str();
}

OutputErrors output_errors(const Case& c, uint64_t seed, bool with_backward) {
  const HostProblem hp = make_problem(c, seed);
  const Layouts L = layouts(c);
  DeviceProblem d = upload(hp, with_backward);  // a forward-only flavour has no backward workspace to ask for
  OutputErrors out;
  auto worst = [&](const DeviceBuffer& buffer, const Layout& l, const std::vector<double>& ref, double* err,
                   double* ref_max) {
    const std::vector<uint8_t> got = buffer.download();
    for (int64_t b = 0; b < l.shape[0]; ++b)
      for (int64_t s = 0; s < l.shape[1]; ++s)
        for (int64_t h = 0; h < l.shape[2]; ++h)
          for (int64_t e = 0; e < l.shape[3]; ++e) {
            const double r = ref[size_t(((b * l.shape[1] + s) * l.shape[2] + h) * l.shape[3] + e)];
            const double x = at(got, c.dtype, l, b, s, h, e);
            *err = std::isnan(x) ? kInf : std::max(*err, std::abs(x - r));
            *ref_max = std::max(*ref_max, std::abs(r));
          }
  };
  if (with_backward && (out.error = run_and_sync(d.params, Direction::backward)).empty()) {
    const reference::BackwardResult ref = reference::backward(hp.params());
    worst(d.dq, L.q, ref.dq, &out.dq, &out.dq_max);
    worst(d.dk, L.k, ref.dk, &out.dk, &out.dk_max);
    worst(d.dv, L.v, ref.dv, &out.dv, &out.dv_max);
  }
  Params fwd = d.params;
  fwd.dout = fwd.dq = fwd.dk = fwd.dv = Tensor{};
  fwd.workspace = nullptr, fwd.workspace_bytes = 0;
  if (out.error.empty() && (out.error = run_and_sync(fwd, Direction::forward)).empty()) {
    worst(d.o, L.o, hp.ref.o, &out.o, &out.o_max);
  }
  return out;
}

std::string check_deterministic(const Case& c, uint64_t seed) {
  Case det = c;
  det.deterministic = true;
  const HostProblem hp = make_problem(det, seed);
  DeviceProblem d = upload(hp, true);
  std::vector<uint8_t> first[3];
  for (int run = 0; run < 2; ++run) {
    d.dq.poison();
    d.dk.poison();
    d.dv.poison();
    if (std::string err = run_and_sync(d.params, Direction::backward); !err.empty()) return err;
    const std::vector<uint8_t> now[3] = {d.dq.download(), d.dk.download(), d.dv.download()};
    if (run == 0) {
      for (int i = 0; i < 3; ++i) first[i] = now[i];
    } else {
      const char* names[3] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i)
        if (now[i] != first[i]) return std::string(names[i]) + " differs bitwise between two deterministic runs\n";
    }
  }
  return "";
}

std::string check_schedules_agree(const Case& c, uint64_t seed) {
  const HostProblem hp = make_problem(c, seed);
  DeviceProblem d = upload(hp, false);
  if (d.params.workspace == nullptr) return "the call asks for no forward workspace: nothing to compare\n";
  std::vector<uint8_t> o[2], lse[2];
  for (int run = 0; run < 2; ++run) {
    Params p = d.params;
    if (run == 1) p.workspace = nullptr, p.workspace_bytes = 0;  // the static schedule
    d.workspace.poison();
    d.o.poison();
    d.lse.poison();
    if (std::string err = run_and_sync(p, Direction::forward); !err.empty()) return err;
    o[run] = d.o.download();
    lse[run] = d.lse.download();
  }
  if (o[0] != o[1]) return "O differs bitwise between the dynamic and the static schedule\n";
  if (lse[0] != lse[1]) return "LSE differs bitwise between the dynamic and the static schedule\n";
  return "";
}

// ------------------------------------------------------------------------------------------------
// Variable-length (packed) calls
// ------------------------------------------------------------------------------------------------

namespace {

// The sequences of a packed call, each generated as the dense batch-1 problem it is: a contiguous
// [1, S, H, D] tensor is the packed [S, H, D] rows of its sequence, so packing is concatenation.
struct PackedProblem {
  std::vector<HostProblem> seqs;
  std::vector<int32_t> cu_q{0}, cu_k{0};  // the sequence tables
  int64_t max_q = 0, max_k = 0;
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
};

PackedProblem make_packed(const VarlenCase& vc, uint64_t seed) {
  PackedProblem pp;
  for (size_t b = 0; b < vc.seqlens_q.size(); ++b) {
    Case c = vc.base;
    c.batch = 1;
    c.seqlen_q = vc.seqlens_q[b];
    c.seqlen_k = vc.seqlens_k[b];
    c.bhsd_layout = false;
    c.base_offset = 0;
    pp.seqs.push_back(make_problem(c, seed + b));
    pp.cu_q.push_back(int32_t(pp.cu_q.back() + c.seqlen_q));
    pp.cu_k.push_back(int32_t(pp.cu_k.back() + c.seqlen_k));
    pp.max_q = std::max(pp.max_q, c.seqlen_q);
    pp.max_k = std::max(pp.max_k, c.seqlen_k);
  }
  pp.max_q += vc.extra_max;
  pp.max_k += vc.extra_max;
  return pp;
}

std::vector<uint8_t> concat(const PackedProblem& pp, std::vector<uint8_t> HostProblem::*member) {
  std::vector<uint8_t> out;
  for (const HostProblem& hp : pp.seqs) out.insert(out.end(), (hp.*member).begin(), (hp.*member).end());
  return out;
}

// The packed LSE [H, total_q] from the sequences' [1, H, S].
std::vector<uint8_t> packed_lse(const PackedProblem& pp, int64_t heads) {
  const int64_t total = pp.total_q();
  std::vector<float> out(size_t(heads * total));
  for (size_t b = 0; b < pp.seqs.size(); ++b) {
    const float* lse = reinterpret_cast<const float*>(pp.seqs[b].lse.data());
    const int64_t len = pp.seqs[b].c.seqlen_q;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t s = 0; s < len; ++s) out[size_t(h * total + pp.cu_q[b] + s)] = lse[h * len + s];
  }
  std::vector<uint8_t> bytes(out.size() * sizeof(float));
  std::memcpy(bytes.data(), out.data(), bytes.size());
  return bytes;
}

// Rows [begin, end) of a downloaded packed tensor whose rows hold `row_elements` elements.
std::vector<uint8_t> rows_of(const std::vector<uint8_t>& packed, int64_t begin, int64_t end, int64_t row_elements,
                             DType dtype) {
  const size_t row_bytes = size_t(row_elements) * dtype_size(dtype);
  return std::vector<uint8_t>(packed.begin() + ptrdiff_t(size_t(begin) * row_bytes),
                              packed.begin() + ptrdiff_t(size_t(end) * row_bytes));
}

struct DevicePacked {
  DeviceBuffer q, k, v, o, lse, dout, dq, dk, dv, tables, workspace;
  Params params;
};

DevicePacked upload_packed(const VarlenCase& vc, const PackedProblem& pp, bool backward) {
  const Case& c = vc.base;
  const Device dev = current_cuda_device();
  const int64_t total_q = pp.total_q(), total_k = pp.total_k(), entries = int64_t(pp.cu_q.size());
  DevicePacked d;
  auto put = [](DeviceBuffer& buffer, const std::vector<uint8_t>& bytes) {
    buffer = DeviceBuffer(bytes.size());
    buffer.upload(bytes);
  };
  put(d.q, concat(pp, &HostProblem::q));
  put(d.k, concat(pp, &HostProblem::k));
  put(d.v, concat(pp, &HostProblem::v));
  put(d.o, concat(pp, &HostProblem::o));
  put(d.lse, packed_lse(pp, c.heads));
  std::vector<uint8_t> tables(size_t(2 * entries) * sizeof(int32_t));
  std::memcpy(tables.data(), pp.cu_q.data(), pp.cu_q.size() * sizeof(int32_t));
  std::memcpy(tables.data() + pp.cu_q.size() * sizeof(int32_t), pp.cu_k.data(), pp.cu_k.size() * sizeof(int32_t));
  put(d.tables, tables);
  Params& p = d.params;
  p.q = make_tensor(d.q.ptr, c.dtype, {total_q, c.heads, c.head_dim}, dev);
  p.k = make_tensor(d.k.ptr, c.dtype, {total_k, c.kv_heads, c.head_dim}, dev);
  p.v = make_tensor(d.v.ptr, c.dtype, {total_k, c.kv_heads, c.head_dim_v}, dev);
  p.o = make_tensor(d.o.ptr, c.dtype, {total_q, c.heads, c.head_dim_v}, dev);
  if (c.with_lse || backward) p.lse = make_tensor(d.lse.ptr, DType::fp32, {c.heads, total_q}, dev);
  p.cu_seqlens_q = make_tensor(d.tables.ptr, DType::int32, {entries}, dev);
  p.cu_seqlens_k = make_tensor(static_cast<int32_t*>(d.tables.ptr) + entries, DType::int32, {entries}, dev);
  p.max_seqlen_q = pp.max_q;
  p.max_seqlen_k = pp.max_k;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.q_offset = c.q_offset;
  p.precision = c.precision;
  p.softmax_scale = c.softmax_scale;
  p.deterministic = c.deterministic;
  p.backend = c.backend;
  if (backward) {
    put(d.dout, concat(pp, &HostProblem::dout));
    d.dq = DeviceBuffer(d.q.bytes);
    d.dk = DeviceBuffer(d.k.bytes);
    d.dv = DeviceBuffer(d.v.bytes);
    p.dout = make_tensor(d.dout.ptr, c.dtype, {total_q, c.heads, c.head_dim_v}, dev);
    p.dq = make_tensor(d.dq.ptr, c.dtype, {total_q, c.heads, c.head_dim}, dev);
    p.dk = make_tensor(d.dk.ptr, c.dtype, {total_k, c.kv_heads, c.head_dim}, dev);
    p.dv = make_tensor(d.dv.ptr, c.dtype, {total_k, c.kv_heads, c.head_dim_v}, dev);
    size_t bytes = 0;
    throw_if_error(workspace_size(p, Direction::backward, &bytes));
    d.workspace = DeviceBuffer(bytes);
    p.workspace = d.workspace.ptr;
    p.workspace_bytes = bytes;
  }
  return d;
}

// THE RULE applies to each output tensor of the call, here the packed one: the errors of its
// sequences combine as one tensor's (the largest errors and magnitudes, every NaN and inexact
// masked element, the first bad element's description, which names its sequence).
void accumulate(Errors* total, const Errors& e) {
  const bool worse = e.kernel > total->kernel;
  const bool total_flagged = total->nan > 0 || total->not_exact > 0;
  const bool e_flagged = e.nan > 0 || e.not_exact > 0;
  if (!total_flagged && (e_flagged || worse)) total->first_bad = e.first_bad;
  total->kernel = std::max(total->kernel, e.kernel);
  total->naive = std::max(total->naive, e.naive);
  total->ref_max = std::max(total->ref_max, e.ref_max);
  total->accumulation = std::max(total->accumulation, e.accumulation);
  total->nan += e.nan;
  total->not_exact += e.not_exact;
}

std::string sequence_label(const char* tensor, size_t b) {
  return std::string(tensor) + " of sequence " + std::to_string(b);
}

}  // namespace

std::string VarlenCase::name() const {
  // The base's name with the sequence count as batch and the longest lengths as seqlens.
  Case named = base;
  named.batch = int64_t(seqlens_q.size());
  named.seqlen_q = seqlens_q.empty() ? 0 : *std::max_element(seqlens_q.begin(), seqlens_q.end());
  named.seqlen_k = seqlens_k.empty() ? 0 : *std::max_element(seqlens_k.begin(), seqlens_k.end());
  named.bhsd_layout = false;
  named.base_offset = 0;
  std::ostringstream out;
  out << named.name() << "_varlen" << seqlens_q.size();
  for (size_t b = 0; b < seqlens_q.size() && b < 4; ++b) out << "_" << seqlens_q[b] << "x" << seqlens_k[b];
  if (seqlens_q.size() > 4) out << "_etc";
  if (extra_max) out << "_max" << extra_max;
  return out.str();
}

std::string check_varlen_forward(const VarlenCase& vc, uint64_t seed) {
  const Case& c = vc.base;
  const PackedProblem pp = make_packed(vc, seed);
  DevicePacked d = upload_packed(vc, pp, false);
  d.o.poison();
  d.lse.poison();
  if (std::string err = run_and_sync(d.params, Direction::forward); !err.empty()) return err;
  const std::vector<uint8_t> o = d.o.download(), lse_bytes = d.lse.download();
  const float* lse = reinterpret_cast<const float*>(lse_bytes.data());
  Errors o_errors, lse_all;
  for (size_t b = 0; b < pp.seqs.size(); ++b) {
    const HostProblem& hp = pp.seqs[b];
    const int64_t len = hp.c.seqlen_q, begin = pp.cu_q[b];
    const reference::ForwardResult& ref = hp.ref;
    const NaiveForward naive = naive_forward(hp);
    const Problem s = Problem::of(hp.params());
    auto masked_row = [&](int64_t, int64_t row, int64_t) { return s.mask.keys(row).empty(); };
    const std::string name = sequence_label("o", b);
    accumulate(&o_errors, compare4(rows_of(o, begin, begin + len, c.heads * c.head_dim_v, c.dtype), c.dtype,
                                   layouts(hp.c).o, ref.o, naive.o, masked_row, name.c_str()));
    if (c.with_lse) {
      std::vector<float> g(size_t(c.heads * len));
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < len; ++i) g[size_t(h * len + i)] = lse[h * pp.total_q() + begin + i];
      Errors e = lse_errors(g.data(), ref.lse, naive.lse, accumulation_bound(hp.c, naive));
      if (!e.first_bad.empty()) e.first_bad = sequence_label("lse", b) + ": " + e.first_bad;
      accumulate(&lse_all, e);
    }
  }
  return verdict(o_errors, c.dtype, "o") + (c.with_lse ? verdict(lse_all, DType::fp32, "lse") : "");
}

std::string check_varlen_backward(const VarlenCase& vc, uint64_t seed) {
  const Case& c = vc.base;
  const PackedProblem pp = make_packed(vc, seed);
  DevicePacked d = upload_packed(vc, pp, true);
  d.dq.poison();
  d.dk.poison();
  d.dv.poison();
  d.workspace.poison();
  if (std::string err = run_and_sync(d.params, Direction::backward); !err.empty()) return err;
  const std::vector<uint8_t> dq = d.dq.download(), dk = d.dk.download(), dv = d.dv.download();
  Errors dq_errors, dk_errors, dv_errors;
  for (size_t b = 0; b < pp.seqs.size(); ++b) {
    const HostProblem& hp = pp.seqs[b];
    const Layouts L = layouts(hp.c);
    const int64_t q_begin = pp.cu_q[b], q_end = pp.cu_q[b + 1], k_begin = pp.cu_k[b], k_end = pp.cu_k[b + 1];
    const reference::BackwardResult ref = reference::backward(hp.params());
    const NaiveBackward naive = naive_backward(hp);
    const Problem s = Problem::of(hp.params());
    auto masked_row = [&](int64_t, int64_t row, int64_t) { return s.mask.keys(row).empty(); };
    auto unseen_key = [&](int64_t, int64_t key, int64_t) { return s.mask.queries(key).empty(); };
    const std::string dq_name = sequence_label("dq", b), dk_name = sequence_label("dk", b),
                      dv_name = sequence_label("dv", b);
    accumulate(&dq_errors, compare4(rows_of(dq, q_begin, q_end, c.heads * c.head_dim, c.dtype), c.dtype, L.q,
                                    ref.dq, naive.dq, masked_row, dq_name.c_str()));
    accumulate(&dk_errors, compare4(rows_of(dk, k_begin, k_end, c.kv_heads * c.head_dim, c.dtype), c.dtype, L.k,
                                    ref.dk, naive.dk, unseen_key, dk_name.c_str()));
    accumulate(&dv_errors, compare4(rows_of(dv, k_begin, k_end, c.kv_heads * c.head_dim_v, c.dtype), c.dtype, L.v,
                                    ref.dv, naive.dv, unseen_key, dv_name.c_str()));
  }
  return verdict(dq_errors, c.dtype, "dq") + verdict(dk_errors, c.dtype, "dk") + verdict(dv_errors, c.dtype, "dv");
}

}  // namespace fmha::test
