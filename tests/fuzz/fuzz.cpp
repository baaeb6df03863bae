// See fuzz.h: the generator, the naive same-precision attention and the check under the rule.
#include "fuzz.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

#include "common/numeric.h"
#include "common/problem.h"
#include "common/tensor_access.h"
#include "cpu/reference.h"

namespace fmha::fuzz {
namespace {

constexpr double kFp32Roundoff = 1.0 / 16777216.0;  // 2^-24
constexpr uint64_t kDefaultBaseSeed = 20261203;
constexpr float kInf = std::numeric_limits<float>::infinity();
// Elements of padding after each row and each head of a `padded` layout: a multiple of 8 keeps
// every row 16-byte aligned in every dtype, as the GPU tiers' vector loads want.
constexpr int64_t kRowPad = 8, kHeadPad = 16;

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::bhsd: return "bhsd";
    case Layout::padded: return "padded";
    default: return "bshd";
  }
}

double storage_roundoff(DType d) {
  switch (d) {
    case DType::fp16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    default: return kFp32Roundoff;
  }
}

// ---- the generator --------------------------------------------------------------------------

struct Draw {
  std::mt19937_64 rng;
  explicit Draw(uint64_t seed) : rng(seed) {}
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  // 1 .. hi, log-uniform: short lengths as often as long ones.
  int64_t log_uniform(int64_t hi) {
    const double x = std::uniform_real_distribution<double>(0, std::log(double(hi) + 1))(rng);
    return std::clamp<int64_t>(int64_t(std::exp(x)), 1, hi);
  }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[size_t(uniform(0, int64_t(v.size()) - 1))]; }
};

// The share of calls drawn peaked (on top of those that scale 1 and magnitude 3 make peaked).
constexpr double kPeakedChance = 0.1;

// A sequence length: 1 (a single row or key) one time in six, otherwise log-uniform.
int64_t draw_length(Draw& d, int64_t max_seqlen) { return d.chance(1.0 / 6) ? 1 : d.log_uniform(max_seqlen); }

}  // namespace

std::string Config::describe() const {
  std::ostringstream out;
  out << "seed " << seed << ": " << to_string(backend) << " "
      << (precision != Precision::ieee ? to_string(precision) : to_string(dtype)) << " batch " << batch << " heads "
      << heads << "/"
      << kv_heads << " seqlen " << seqlen_q << "x" << seqlen_k << " head_dim " << head_dim << "/" << head_dim_v
      << " causal " << to_string(causal) << " window " << window_left << "," << window_right << " q_offset "
      << q_offset << " scale " << (softmax_scale == 0.f ? std::string("default") : std::to_string(softmax_scale))
      << " magnitude " << magnitude << " layout " << layout_name(layout) << (deterministic ? " deterministic" : "")
      << (backward ? " fwd+bwd" : " fwd");
  return out.str();
}

Tier cpu_tier() {
  Tier t;
  t.backend = Backend::cpu;
  t.flavors = {{DType::fp32, Precision::ieee}, {DType::fp32, Precision::ieee}, {DType::fp32, Precision::tf32},
               {DType::fp16, Precision::ieee}, {DType::bf16, Precision::ieee}, {DType::fp32, Precision::tf32x3}};
  t.max_seqlen = 520;
  t.max_work = 1.5e6;
  t.max_low_precision_logit = std::numeric_limits<double>::infinity();  // its statistics pass forms Δ from P∘dP
  return t;
}

Tier gpu_tier(Backend backend, const std::vector<int64_t>& compiled_head_dims) {
  Tier t;
  t.backend = backend;
  t.head_dims = compiled_head_dims;
  t.max_seqlen = 600;
  t.max_work = 4e6;
  switch (backend) {
    case Backend::cuda_simt:  // tf32x3 computed exactly
      t.flavors = {{DType::fp32, Precision::ieee}, {DType::fp32, Precision::ieee}, {DType::fp32, Precision::tf32x3}};
      break;
    case Backend::cuda_sm80:
      t.flavors = {{DType::fp16, Precision::ieee}, {DType::bf16, Precision::ieee}, {DType::fp32, Precision::tf32},
                   {DType::fp32, Precision::tf32x3}};
      break;
    default:  // sm90: fp16 and bf16 at head dims 64-256, tf32 at 64-128, split tf32 at 64
      t.flavors = {{DType::fp16, Precision::ieee}, {DType::bf16, Precision::ieee}};
      t.head_dims.erase(std::remove_if(t.head_dims.begin(), t.head_dims.end(), [](int64_t d) { return d < 64; }),
                        t.head_dims.end());
      for (const Tier::Flavor fp32 : {Tier::Flavor{DType::fp32, Precision::tf32, kSm90Tf32MaxHeadDim},
                                      Tier::Flavor{DType::fp32, Precision::tf32x3, kSm90Tf32x3MaxHeadDim}})
        if (!flavor_head_dims(t, fp32).empty()) t.flavors.push_back(fp32);
      break;
  }
  return t;
}

std::vector<int64_t> flavor_head_dims(const Tier& tier, const Tier::Flavor& flavor) {
  std::vector<int64_t> out;
  for (int64_t d : tier.head_dims)
    if (flavor.max_head_dim == 0 || d <= flavor.max_head_dim) out.push_back(d);
  return out;
}

Config generate(uint64_t seed, const Tier& tier) {
  Draw d(seed);
  Config c;
  c.seed = seed;
  c.backend = tier.backend;
  const Tier::Flavor flavor = d.pick(tier.flavors);
  c.dtype = flavor.dtype;
  c.precision = flavor.precision;
  c.backward = tier.backward;
  const std::vector<int64_t> head_dims = flavor_head_dims(tier, flavor);

  c.kv_heads = d.uniform(1, 3);
  const std::vector<int64_t> groups = {1, 1, 2, 3, 4, 8};
  c.heads = c.kv_heads * d.pick(groups);
  c.batch = d.uniform(1, 3);
  c.seqlen_q = draw_length(d, tier.max_seqlen);
  c.seqlen_k = draw_length(d, tier.max_seqlen);
  if (tier.head_dims.empty()) {
    const std::vector<int64_t> usual = {16, 32, 64, 128};
    c.head_dim = d.chance(0.5) ? d.pick(usual) : d.uniform(1, kMaxHeadDim);
    c.head_dim_v = d.chance(0.7) ? c.head_dim : d.uniform(1, kMaxHeadDim);
  } else {
    c.head_dim = d.pick(head_dims);
    c.head_dim_v = d.chance(0.8) ? c.head_dim : d.pick(head_dims);
  }

  const Causal causals[] = {Causal::none, Causal::none, Causal::top_left, Causal::bottom_right};
  c.causal = causals[d.uniform(0, 3)];
  if (d.chance(0.3)) {
    c.window_left = d.chance(0.2) ? -1 : d.uniform(0, c.seqlen_k);
    c.window_right = c.causal != Causal::none ? (d.chance(0.5) ? 0 : -1) : (d.chance(0.2) ? -1 : d.uniform(0, c.seqlen_k));
  }
  if (d.chance(0.3)) c.q_offset = d.uniform(-c.seqlen_k, c.seqlen_k);

  // Scales: the default, 1.0 (with magnitude 3 at large head dims: scores of ~100, the peaked
  // softmax), or anything from 0.01 to 2.
  const double r = d.uniform(0, 3);
  c.softmax_scale = r <= 1 ? 0.f : r == 2 ? 1.f : float(std::exp(std::uniform_real_distribution<double>(std::log(0.01), std::log(2.0))(d.rng)));
  const std::vector<float> magnitudes = {1.f, 1.f, 0.25f, 3.f};
  c.magnitude = d.pick(magnitudes);
  const Layout layouts[] = {Layout::bshd, Layout::bshd, Layout::bhsd, Layout::padded};
  c.layout = layouts[d.uniform(0, 3)];
  c.deterministic = d.chance(0.5);
  // The peaked class (fuzz.h): scores of ~kPeakedLogit whatever the head dim. Drawn last, so
  // that the draws above stay those of a seed without it.
  if (d.chance(kPeakedChance)) {
    c.softmax_scale = 1.f;
    c.magnitude = float(std::sqrt(kPeakedLogit / std::sqrt(double(c.head_dim))));
  }

  if (c.dtype != DType::fp32) {
    const double scale = c.softmax_scale != 0.f ? c.softmax_scale : 1.0 / std::sqrt(double(c.head_dim));
    if (std::abs(scale) * c.magnitude * c.magnitude * std::sqrt(double(c.head_dim)) > tier.max_low_precision_logit)
      c.softmax_scale = 0.f, c.magnitude = 1.f;
  }

  // Keep the case within the tier's work budget: shorten the longer sequence, then the batch.
  auto work = [&] {
    return double(c.batch * c.heads) * double(c.seqlen_q) * double(c.seqlen_k) * double(c.head_dim + c.head_dim_v);
  };
  while (work() > tier.max_work) {
    if (c.batch > 1) c.batch = 1;
    else if (c.seqlen_q >= c.seqlen_k && c.seqlen_q > 1) c.seqlen_q = (c.seqlen_q + 1) / 2;
    else if (c.seqlen_k > 1) c.seqlen_k = (c.seqlen_k + 1) / 2;
    else if (c.heads > c.kv_heads) c.heads = c.kv_heads;
    else break;
  }
  if (c.window_left > c.seqlen_k) c.window_left = c.seqlen_k;
  if (c.window_right > c.seqlen_k) c.window_right = c.seqlen_k;
  if (std::abs(c.q_offset) > c.seqlen_k) c.q_offset = c.q_offset < 0 ? -c.seqlen_k : c.seqlen_k;
  return c;
}

// ---- host storage ------------------------------------------------------------------------------

namespace {

// [B, S, H, D] storage of `layout`: sizes and element strides, and the elements spanned.
HostTensor allocate(DType dtype, int64_t b, int64_t s, int64_t h, int64_t d, Layout layout) {
  int64_t stride[4] = {s * h * d, h * d, d, 1}, span = b * s * h * d;
  if (layout == Layout::bhsd) {
    stride[0] = h * s * d, stride[1] = d, stride[2] = s * d;
  } else if (layout == Layout::padded) {
    const int64_t row = d + kRowPad;              // one head's row, padded
    const int64_t token = h * row + kHeadPad;     // all heads of one position, padded
    stride[0] = s * token, stride[1] = token, stride[2] = row;
    span = b * stride[0];
  }
  HostTensor t;
  t.bytes.assign(size_t(std::max<int64_t>(span, 1)) * dtype_size(dtype), 0xff);
  t.view = make_tensor(t.bytes.data(), dtype, {b, s, h, d}, {stride[0], stride[1], stride[2], stride[3]});
  return t;
}

void fill_random(HostTensor& t, float magnitude, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, magnitude);
  const Tensor& v = t.view;
  for (int64_t b = 0; b < v.shape[0]; ++b)
    for (int64_t s = 0; s < v.shape[1]; ++s)
      for (int64_t h = 0; h < v.shape[2]; ++h)
        for (int64_t d = 0; d < v.shape[3]; ++d) store_element(v.data, v.dtype, offset4(v, b, s, h, d), normal(rng));
}

float at(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return load_element(t.data, t.dtype, offset4(t, b, s, h, d));
}

}  // namespace

Params Problem::params() const {
  Params p;
  p.q = q.view, p.k = k.view, p.v = v.view, p.o = o.view, p.lse = lse.view;
  p.dout = dout.view, p.dq = dq.view, p.dk = dk.view, p.dv = dv.view;
  p.softmax_scale = config.softmax_scale;
  p.causal = config.causal;
  p.window_left = config.window_left;
  p.window_right = config.window_right;
  p.q_offset = config.q_offset;
  p.precision = config.precision;
  p.deterministic = config.deterministic;
  p.backend = config.backend;
  p.num_threads = 1;  // the suite's shards run side by side
  return p;
}

Problem make_problem(const Config& c) {
  Problem p;
  p.config = c;
  const DType t = c.dtype;
  p.q = allocate(t, c.batch, c.seqlen_q, c.heads, c.head_dim, c.layout);
  p.k = allocate(t, c.batch, c.seqlen_k, c.kv_heads, c.head_dim, c.layout);
  p.v = allocate(t, c.batch, c.seqlen_k, c.kv_heads, c.head_dim_v, c.layout);
  p.o = allocate(t, c.batch, c.seqlen_q, c.heads, c.head_dim_v, c.layout);
  p.dout = allocate(t, c.batch, c.seqlen_q, c.heads, c.head_dim_v, c.layout);
  p.dq = allocate(t, c.batch, c.seqlen_q, c.heads, c.head_dim, c.layout);
  p.dk = allocate(t, c.batch, c.seqlen_k, c.kv_heads, c.head_dim, c.layout);
  p.dv = allocate(t, c.batch, c.seqlen_k, c.kv_heads, c.head_dim_v, c.layout);
  p.lse.bytes.assign(size_t(std::max<int64_t>(c.batch * c.heads * c.seqlen_q, 1)) * sizeof(float), 0xff);
  p.lse.view = make_tensor(p.lse.bytes.data(), DType::fp32, {c.batch, c.heads, c.seqlen_q});
  std::mt19937_64 rng(c.seed ^ 0x5bd1e9955bd1e995ull);
  for (HostTensor* x : {&p.q, &p.k, &p.v, &p.dout}) fill_random(*x, c.magnitude, rng);
  return p;
}

// ---- the naive computation in the call's precision ----------------------------------------------

namespace {

// Contiguous [B, S, H, D] results of the naive computation, rounded to the storage dtype.
struct Naive {
  std::vector<double> o, lse, dq, dk, dv;
};

struct NaiveMath {
  const Problem& pr;
  const Config& c;
  fmha::Problem s;
  bool tf32;
  // The sm90 tier's tf32 scores read Q and K as they land, which the tensor cores truncate to
  // tf32 (its other operands it rounds first).
  bool truncated_scores;
  bool reverse;  // sum the dot products over the head dim last to first

  NaiveMath(const Problem& problem, bool reverse_order)
      : pr(problem), c(problem.config), s(fmha::Problem::of(problem.params())),
        tf32(problem.config.precision == Precision::tf32),
        truncated_scores(tf32 && problem.config.backend == Backend::cuda_sm90), reverse(reverse_order) {}

  int64_t dim(int64_t step, int64_t n) const { return reverse ? n - 1 - step : step; }

  float in(float x) const { return tf32 ? round_to_tf32(x) : x; }
  float in_scores(float x) const { return truncated_scores ? truncate_to_tf32(x) : in(x); }
  // The format the matmuls' P and dS operands are rounded to.
  float matmul(float x) const { return tf32 ? round_to_tf32(x) : round_to(c.dtype, x); }

  // Row i of head h: the visible keys' scores (scaled), P (softmax with the row max), and the
  // row's max and sum; false when the row sees no key.
  bool softmax(int64_t b, int64_t h, int64_t i, std::vector<float>& p, float* max_out, float* sum_out) const {
    const Range keys = s.mask.keys(i);
    if (keys.empty()) return false;
    const int64_t kvh = h / s.group;
    p.assign(size_t(keys.size()), 0.f);
    float m = -kInf;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      float dot = 0.f;
      for (int64_t t = 0; t < c.head_dim; ++t) {
        const int64_t d = dim(t, c.head_dim);
        dot = std::fma(in_scores(at(pr.q.view, b, i, h, d)), in_scores(at(pr.k.view, b, j, kvh, d)), dot);
      }
      const float score = dot * s.scale;
      p[size_t(j - keys.begin)] = score;
      m = std::max(m, score);
    }
    float l = 0.f;
    for (float& x : p) l += (x = std::exp(x - m));
    for (float& x : p) x /= l;
    *max_out = m;
    *sum_out = l;
    return true;
  }

  Naive forward() const {
    Naive r;
    r.o.assign(size_t(c.batch * c.seqlen_q * c.heads * c.head_dim_v), 0.0);
    r.lse.assign(size_t(c.batch * c.heads * c.seqlen_q), -double(kInf));
    std::vector<float> p, acc(size_t(c.head_dim_v));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          float m = 0.f, l = 0.f;
          if (!softmax(b, h, i, p, &m, &l)) continue;
          const Range keys = s.mask.keys(i);
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = keys.begin; j < keys.end; ++j) {
            const float pj = matmul(p[size_t(j - keys.begin)]);
            for (int64_t d = 0; d < c.head_dim_v; ++d)
              acc[size_t(d)] = std::fma(pj, in(at(pr.v.view, b, j, h / s.group, d)), acc[size_t(d)]);
          }
          for (int64_t d = 0; d < c.head_dim_v; ++d)
            r.o[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim_v + d)] = round_to(c.dtype, acc[size_t(d)]);
          r.lse[size_t((b * c.heads + h) * c.seqlen_q + i)] = m + std::log(l);
        }
    return r;
  }

  Naive backward() const {
    std::vector<float> dq(size_t(c.batch * c.seqlen_q * c.heads * c.head_dim), 0.f);
    std::vector<float> dk(size_t(c.batch * c.seqlen_k * c.kv_heads * c.head_dim), 0.f);
    std::vector<float> dv(size_t(c.batch * c.seqlen_k * c.kv_heads * c.head_dim_v), 0.f);
    std::vector<float> p, dp, o;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          float m = 0.f, l = 0.f;
          if (!softmax(b, h, i, p, &m, &l)) continue;
          const Range keys = s.mask.keys(i);
          const int64_t kvh = h / s.group;
          dp.assign(p.size(), 0.f);
          float delta = 0.f;  // fp32 storage: rowsum(P ∘ dP), as the softmax's own backward forms it
          for (int64_t j = keys.begin; j < keys.end; ++j) {
            float dot = 0.f;
            for (int64_t t = 0; t < c.head_dim_v; ++t) {
              const int64_t d = dim(t, c.head_dim_v);
              dot = std::fma(in(at(pr.dout.view, b, i, h, d)), in(at(pr.v.view, b, j, kvh, d)), dot);
            }
            dp[size_t(j - keys.begin)] = dot;
            delta = std::fma(p[size_t(j - keys.begin)], dot, delta);
          }
          if (c.dtype != DType::fp32) {
            // fp16/bf16 storage: rowsum(dO ∘ O) from O as stored, as every backward forms it (a
            // plain fp16/bf16 computation would round P itself, an error of the same size).
            o.assign(size_t(c.head_dim_v), 0.f);
            for (int64_t j = keys.begin; j < keys.end; ++j)
              for (int64_t d = 0; d < c.head_dim_v; ++d)
                o[size_t(d)] = std::fma(matmul(p[size_t(j - keys.begin)]), at(pr.v.view, b, j, kvh, d), o[size_t(d)]);
            delta = 0.f;
            for (int64_t d = 0; d < c.head_dim_v; ++d)
              delta = std::fma(at(pr.dout.view, b, i, h, d), round_to(c.dtype, o[size_t(d)]), delta);
          }
          for (int64_t j = keys.begin; j < keys.end; ++j) {
            const size_t jj = size_t(j - keys.begin);
            const float ds = matmul(p[jj] * (dp[jj] - delta) * s.scale);
            const float pj = matmul(p[jj]);
            for (int64_t d = 0; d < c.head_dim_v; ++d) {
              float& x = dv[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim_v + d)];
              x = std::fma(pj, in(at(pr.dout.view, b, i, h, d)), x);
            }
            for (int64_t d = 0; d < c.head_dim; ++d) {
              float& xk = dk[size_t(((b * c.seqlen_k + j) * c.kv_heads + kvh) * c.head_dim + d)];
              xk = std::fma(ds, in(at(pr.q.view, b, i, h, d)), xk);
              float& xq = dq[size_t(((b * c.seqlen_q + i) * c.heads + h) * c.head_dim + d)];
              xq = std::fma(ds, in(at(pr.k.view, b, j, kvh, d)), xq);
            }
          }
        }
    Naive r;
    auto rounded = [&](const std::vector<float>& x) {
      std::vector<double> out(x.size());
      for (size_t i = 0; i < x.size(); ++i) out[i] = round_to(c.dtype, x[i]);
      return out;
    };
    r.dq = rounded(dq), r.dk = rounded(dk), r.dv = rounded(dv);
    return r;
  }
};

// Error of one output tensor: the kernel's and the naive computation's against the oracle.
struct Errors {
  double kernel = 0, naive = 0, ref_max = 0;   // maxima, for the report
  double kernel2 = 0, naive2 = 0, ref2 = 0;    // sums of squares: the rule's norms
  int64_t count = 0;
  int64_t nan = 0, not_exact = 0;
  std::string first_bad;
};

// `out` is the kernel's strided view; `ref` and `naive` are contiguous [B, S, H, D].
template <class ExactZero>
Errors compare(const Tensor& out, const std::vector<double>& ref, const std::vector<double>& naive,
               const std::vector<double>& naive_reversed, ExactZero exact_zero, const char* name) {
  Errors e;
  double reversed2 = 0, reversed_max = 0;
  for (int64_t b = 0; b < out.shape[0]; ++b)
    for (int64_t s = 0; s < out.shape[1]; ++s)
      for (int64_t h = 0; h < out.shape[2]; ++h)
        for (int64_t d = 0; d < out.shape[3]; ++d) {
          const size_t idx = size_t(((b * out.shape[1] + s) * out.shape[2] + h) * out.shape[3] + d);
          const double x = at(out, b, s, h, d), r = ref[idx];
          auto where = [&] {
            std::ostringstream w;
            w << name << "[" << b << "," << s << "," << h << "," << d << "] = " << x << " (fp64 " << r << ")";
            return w.str();
          };
          if (std::isnan(x)) {
            if (e.nan++ == 0) e.first_bad = "NaN or unwritten at " + where();
            continue;
          }
          if (exact_zero(s) && x != 0.0 && e.not_exact++ == 0 && e.nan == 0) e.first_bad = "expected exactly 0 at " + where();
          const double err = std::abs(x - r);
          e.kernel2 += err * err;
          e.naive2 += (naive[idx] - r) * (naive[idx] - r);
          e.ref2 += r * r;
          ++e.count;
          if (err > e.kernel) {
            e.kernel = err;
            if (e.nan == 0 && e.not_exact == 0) e.first_bad = "worst at " + where();
          }
          e.naive = std::max(e.naive, std::abs(naive[idx] - r));
          reversed2 += (naive_reversed[idx] - r) * (naive_reversed[idx] - r);
          reversed_max = std::max(reversed_max, std::abs(naive_reversed[idx] - r));
          e.ref_max = std::max(e.ref_max, std::abs(r));
        }
  // The naive error is the larger of the two summation orders': one order's rounding can cancel
  // by chance where a few rows dominate (two competing keys under large logits).
  e.naive2 = std::max(e.naive2, reversed2);
  e.naive = std::max(e.naive, reversed_max);
  return e;
}

std::string verdict(const Errors& e, DType dtype, double unit, const char* name, Outcome& outcome) {
  outcome.errors.push_back({name, std::sqrt(e.kernel2), std::sqrt(e.naive2), std::sqrt(e.ref2)});
  const double kernel = std::sqrt(e.kernel2), naive = std::sqrt(e.naive2), ref = std::sqrt(e.ref2);
  const double bound = kNaiveFactor * naive + kStorageFactor * storage_roundoff(dtype) * ref +
                       kAccumulationFactor * kFp32Roundoff * unit * std::sqrt(double(e.count));
  if (e.nan == 0 && e.not_exact == 0 && kernel <= bound) return "";
  std::ostringstream out;
  out << "  " << name << ": ||error|| " << kernel << " > bound " << bound << " (naive " << naive << ", ||fp64|| " << ref
      << ", max errors " << e.kernel << " vs naive " << e.naive << ", " << e.nan << " NaN, " << e.not_exact
      << " not exactly zero); " << e.first_bad << "\n";
  return out.str();
}

std::string call_failed(const Status& s, Direction dir) {
  return std::string("  ") + to_string(dir) + " failed: " + to_string(s.code) + ": " + s.message + "\n";
}

}  // namespace

Outcome check(const Config& c, const Runner& runner) {
  Outcome outcome;
  Problem pr = make_problem(c);
  const fmha::Problem s = fmha::Problem::of(pr.params());
  const NaiveMath naive(pr, false), naive_reversed(pr, true);
  const double mag = c.magnitude;

  // Forward.
  Params fwd = pr.params();
  fwd.dout = fwd.dq = fwd.dk = fwd.dv = Tensor{};
  if (Status st = runner(fwd, Direction::forward); !st.ok()) {
    if (st.code == Code::unsupported) {
      outcome.refused = true;
      return outcome;
    }
    outcome.failure = call_failed(st, Direction::forward);
    return outcome;
  }
  // The CPU suite's shards run side by side, one thread each; a GPU run has the host to itself.
  const int oracle_threads = c.backend == Backend::cpu ? 1 : 0;
  const reference::ForwardResult ref = reference::forward(fwd, oracle_threads);
  const Naive nf = naive.forward(), nf_reversed = naive_reversed.forward();
  auto masked_row = [&](int64_t row) { return s.mask.keys(row).empty(); };
  std::string msg = verdict(compare(pr.o.view, ref.o, nf.o, nf_reversed.o, masked_row, "o"), c.dtype, mag, "o", outcome);
  {
    Errors e;
    double lse_naive2[2] = {0, 0};
    const float* lse = reinterpret_cast<const float*>(pr.lse.bytes.data());
    for (size_t i = 0; i < ref.lse.size(); ++i) {
      const double x = lse[i];
      if (std::isinf(ref.lse[i])) {
        if (!(std::isinf(x) && x < 0) && e.not_exact++ == 0) e.first_bad = "lse[" + std::to_string(i) + "] = " + std::to_string(x) + ", expected -inf";
        continue;
      }
      if (std::isnan(x)) {
        if (e.nan++ == 0) e.first_bad = "lse[" + std::to_string(i) + "] is NaN or unwritten";
        continue;
      }
      e.kernel = std::max(e.kernel, std::abs(x - ref.lse[i]));
      e.naive = std::max({e.naive, std::abs(nf.lse[i] - ref.lse[i]), std::abs(nf_reversed.lse[i] - ref.lse[i])});
      e.ref_max = std::max(e.ref_max, std::abs(ref.lse[i]));
      e.kernel2 += (x - ref.lse[i]) * (x - ref.lse[i]);
      lse_naive2[0] += (nf.lse[i] - ref.lse[i]) * (nf.lse[i] - ref.lse[i]);
      lse_naive2[1] += (nf_reversed.lse[i] - ref.lse[i]) * (nf_reversed.lse[i] - ref.lse[i]);
      e.ref2 += ref.lse[i] * ref.lse[i];
      ++e.count;
    }
    e.naive2 = std::max(lse_naive2[0], lse_naive2[1]);
    msg += verdict(e, DType::fp32, 1.0, "lse", outcome);
  }
  if (!msg.empty() || !c.backward) {
    outcome.failure = msg;
    return outcome;
  }

  // Backward, on the forward's own O and LSE.
  if (Status st = runner(pr.params(), Direction::backward); !st.ok()) {
    if (st.code == Code::unsupported) {
      outcome.refused = true;
      return outcome;
    }
    outcome.failure = call_failed(st, Direction::backward);
    return outcome;
  }
  const reference::BackwardResult bref = reference::backward(pr.params(), oracle_threads);
  const Naive nb = naive.backward(), nb_reversed = naive_reversed.backward();
  auto unseen_key = [&](int64_t key) { return s.mask.queries(key).empty(); };
  const double score_grad_unit = std::abs(double(s.scale)) * mag * mag * double(c.head_dim_v) * mag;
  // dQ sums one residue per key a row sees, dK one per (query row, head of its group) that sees
  // the key: independent roundings, so their sum grows as the square root of their count.
  int64_t keys_per_row = 1, rows_per_key = 1;
  for (int64_t i = 0; i < c.seqlen_q; ++i) keys_per_row = std::max(keys_per_row, s.mask.keys(i).size());
  for (int64_t j = 0; j < c.seqlen_k; ++j) rows_per_key = std::max(rows_per_key, s.mask.queries(j).size() * s.group);
  msg += verdict(compare(pr.dq.view, bref.dq, nb.dq, nb_reversed.dq, masked_row, "dq"), c.dtype,
                 score_grad_unit * std::sqrt(double(keys_per_row)), "dq", outcome);
  msg += verdict(compare(pr.dk.view, bref.dk, nb.dk, nb_reversed.dk, unseen_key, "dk"), c.dtype,
                 score_grad_unit * std::sqrt(double(rows_per_key)), "dk", outcome);
  msg += verdict(compare(pr.dv.view, bref.dv, nb.dv, nb_reversed.dv, unseen_key, "dv"), c.dtype, mag, "dv", outcome);
  outcome.failure = msg;
  return outcome;
}

std::vector<uint64_t> seeds(int64_t count, int shard, int shards) {
  if (const char* one = std::getenv("FMHA_FUZZ_SEED")) {
    if (shard != 0) return {};
    return {uint64_t(std::strtoull(one, nullptr, 0))};
  }
  if (const char* n = std::getenv("FMHA_FUZZ_COUNT")) count = std::strtoll(n, nullptr, 0);
  // A fixed base by default, so that CI runs the same 2,000 cases every time (a red run is a
  // change's doing, not the draw's); FMHA_FUZZ_BASE_SEED=clock draws fresh ones.
  uint64_t base = kDefaultBaseSeed;
  if (const char* b = std::getenv("FMHA_FUZZ_BASE_SEED")) {
    if (std::string(b) == "clock") {
      // One base per process, the same for every shard of it.
      static const uint64_t clock_base = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
      base = clock_base;
    } else {
      base = std::strtoull(b, nullptr, 0);
    }
  }
  std::vector<uint64_t> out;
  for (int64_t i = shard; i < count; i += shards) {
    // splitmix64 of (base + i): case seeds far apart, each replayable on its own.
    const uint64_t z = splitmix64_mix(base + uint64_t(i) * kSplitmix64Increment);
    out.push_back(z & 0xffffffffffffull);  // 48 bits: short enough to copy
  }
  return out;
}

Config with_negative_scale(Config config) {
  const float scale =
      config.softmax_scale != 0.f ? config.softmax_scale : float(1.0 / std::sqrt(double(config.head_dim)));
  config.softmax_scale = -std::abs(scale);
  return config;
}

Config peaked_config(uint64_t seed, Backend backend, Precision precision, Causal causal, int64_t group,
                     int64_t head_dim, bool deterministic) {
  Config c;
  c.seed = seed;
  c.backend = backend;
  c.dtype = DType::fp32;
  c.precision = precision;
  c.batch = 1, c.kv_heads = 1, c.heads = group;
  c.seqlen_q = 256, c.seqlen_k = 200, c.head_dim = c.head_dim_v = head_dim;
  c.causal = causal;
  c.softmax_scale = 1.f;
  c.magnitude = kPeakedMagnitude;
  c.deterministic = deterministic;
  return c;
}

std::string peaked_failure(const Outcome& outcome) {
  std::ostringstream out;
  for (const TensorError& e : outcome.errors) {
    if (e.name != "dq" && e.name != "dk" && e.name != "dv") continue;
    const double bound = kPeakedNaiveFactor * e.naive + kPeakedRoundingFactor * kFp32Roundoff * e.ref;
    if (!(e.kernel <= bound))
      out << "  " << e.name << ": ||error|| " << e.kernel << " > peaked bound " << bound << " (" << e.kernel / e.naive
          << "x the naive error " << e.naive << ", ||fp64|| " << e.ref << ")\n";
  }
  return out.str();
}

}  // namespace fmha::fuzz
