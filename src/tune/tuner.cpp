// The tuning engine (include/fmha/tune.h): for one problem class, run the tier's default variant
// on fresh random inputs, then every other variant that runs the class; keep those whose outputs
// match the default's, time them as `fmha bench` does, and record the fastest in the cache.
#include "tune/tuner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "backends.h"
#include "common/numeric.h"
#include "common/paged.h"
#include "common/problem.h"
#include "common/tolerance.h"
#include "fmha/tune.h"
#include "tune/cache.h"
#include "tune/class.h"
#include "tune/device.h"
#include "tune/selection.h"

namespace fmha {
namespace detail {
namespace {

// GPU timing as `fmha bench` times (tools/fmha/bench.cpp): enough input sets to span more than
// an H100/H200's L2 (50/60 MB), so that no run finds its inputs cached by the one before.
constexpr size_t kRotateBytes = size_t(256) << 20;
constexpr int kMaxInputSets = 8;
constexpr int kGpuWarmup = 5, kGpuIters = 20, kCpuWarmup = 1, kCpuIters = 3;
// Two results that each meet the accuracy rule against the oracle differ by at most twice it.
constexpr double kAgreementFactor = 2.0;
// Another variant replaces the default only when it is this much faster: timing noise (a few
// percent on a shared machine) must not turn into a recorded winner.
constexpr double kMinGain = 0.02;
constexpr uint64_t kInputSeed = 0x5eed;

std::mutex g_test_mutex;
std::optional<TestCandidate> g_test_candidate;

// ---- The CPU as a tuning device ----------------------------------------------------------------

class CpuTuneDevice final : public TuneDevice {
 public:
  void* allocate(size_t bytes) override {
    // 64-byte alignment: what the GPU allocators give, and the CPU path's vector loads like.
    constexpr size_t kAlign = 64;
    void* data = std::aligned_alloc(kAlign, (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign);
    if (!data) throw Error(Code::internal, "tuner: out of host memory");
    return data;
  }
  void release(void* data) override { std::free(data); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill(void* dst, unsigned char value, size_t bytes) override { std::memset(dst, value, bytes); }
  void* stream() override { return nullptr; }
  double time(const std::function<Status()>& run, Status* status) override {
    const auto start = std::chrono::steady_clock::now();
    *status = run();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  void synchronize() override {}
};

// ---- Inputs ------------------------------------------------------------------------------------

// Buffers the tuner owns on its device, released with it.
class Arena {
 public:
  explicit Arena(TuneDevice& device) : device_(device) {}
  ~Arena() {
    for (void* data : owned_) device_.release(data);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Tensor tensor(DType dtype, Device device, std::initializer_list<int64_t> shape) {
    Tensor t = make_tensor(nullptr, dtype, shape, device);
    t.data = device_.allocate(size_t(t.numel()) * dtype_size(dtype));
    owned_.push_back(t.data);
    return t;
  }
  void* bytes(size_t n) {
    owned_.push_back(device_.allocate(n));
    return owned_.back();
  }

 private:
  TuneDevice& device_;
  std::vector<void*> owned_;
};

size_t bytes_of(const Tensor& t) { return size_t(t.numel()) * dtype_size(t.dtype); }

// Uniform values in [-1, 1] stored as t's dtype, generated once per tensor role: the rotated
// input sets hold the same values in other memory (what rotation defeats is the L2, not the data).
const std::vector<unsigned char>& random_values(const Tensor& t, std::vector<unsigned char>& host,
                                                std::mt19937_64& rng) {
  if (!host.empty()) return host;
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  host.resize(bytes_of(t));
  for (int64_t i = 0; i < t.numel(); ++i) store_element(host.data(), t.dtype, i, uniform(rng));
  return host;
}

std::vector<double> read_back(TuneDevice& device, const Tensor& t) {
  std::vector<unsigned char> host(bytes_of(t));
  device.download(host.data(), t.data, host.size());
  std::vector<double> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = double(load_element(host.data(), t.dtype, i));
  return out;
}

// ||a - ref|| / ||ref||; infinity where a has a NaN, or an infinity that ref does not (rows that
// see no key have LSE = -inf in both).
double relative_difference(const std::vector<double>& a, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    if (!std::isfinite(a[i]) || !std::isfinite(ref[i])) {
      if (a[i] != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The call's outputs: O and LSE forward, dQ, dK, dV backward.
std::vector<const Tensor*> outputs(const Params& p, Direction direction) {
  if (direction == Direction::backward) return {&p.dq, &p.dk, &p.dv};
  return {&p.o, &p.lse};
}

double median(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

// One tuning: the inputs on the device, and running and measuring the candidates.
class Session {
 public:
  Session(TuneDevice& device, const BackendEntry& entry, const Params& shape, Direction direction, int sets)
      : device_(device), arena_(device), entry_(entry), direction_(direction) {
    const Problem s = Problem::of(shape);
    std::mt19937_64 rng(kInputSeed);
    std::vector<unsigned char> host_q, host_k, host_v, host_dout;
    auto fill = [&](const Tensor& t, std::vector<unsigned char>& host) {
      device.upload(t.data, random_values(t, host, rng).data(), bytes_of(t));
    };
    const Device where = shape.q.device;
    const bool paged = is_paged(shape);
    for (int i = 0; i < sets; ++i) {
      Params p = shape;
      // A packed (variable-length) call is tuned as the dense batch of its longest sequences,
      // the problem class it falls in (class_of reads the sequence count and longest lengths).
      p.cu_seqlens_q = p.cu_seqlens_k = Tensor{};
      p.max_seqlen_q = p.max_seqlen_k = 0;
      // A call on a KV cache as one on a contiguous cache of its capacity, every sequence full:
      // the same kernels and class, the pages in order.
      if (paged) {
        p.block_table = Tensor{};
        p.cache_seqlens = arena_.tensor(DType::int32, where, {s.batch});
        const std::vector<int32_t> full(size_t(s.batch), int32_t(s.seqlen_k));
        device.upload(p.cache_seqlens.data, full.data(), full.size() * sizeof(int32_t));
      }
      p.backend = entry.id;
      p.stream = device.stream();
      p.workspace = nullptr;
      p.workspace_bytes = 0;
      p.q = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_q, s.heads, s.head_dim});
      p.k = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim});
      p.v = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim_v});
      p.o = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_q, s.heads, s.head_dim_v});
      p.lse = arena_.tensor(DType::fp32, where, {s.batch, s.heads, s.seqlen_q});
      p.dout = p.dq = p.dk = p.dv = Tensor{};
      fill(p.q, host_q);
      fill(p.k, host_k);
      fill(p.v, host_v);
      if (direction == Direction::backward) {
        p.dout = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_q, s.heads, s.head_dim_v});
        p.dq = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_q, s.heads, s.head_dim});
        p.dk = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim});
        p.dv = arena_.tensor(s.dtype, where, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim_v});
        fill(p.dout, host_dout);
      }
      params_.push_back(p);
    }
  }

  const Params& params(int set = 0) const { return params_[size_t(set)]; }

  // The backward's O and LSE (from the forward of any backend), and the workspace: the most any
  // of `names` asks for (the decode kernel's split variants ask for different amounts).
  Status prepare(const std::vector<std::string>& names) {
    size_t workspace = 0;
    for (const std::string& name : names) {
      CandidateScope scope(entry_.id, direction_, name);
      size_t bytes = 0;
      if (entry_.workspace_size(params_[0], direction_, &bytes).ok()) workspace = std::max(workspace, bytes);
    }
    {
      CandidateScope builtin(entry_.id, direction_, "");
      size_t bytes = 0;
      if (Status st = entry_.workspace_size(params_[0], direction_, &bytes); !st.ok()) return st;
      workspace = std::max(workspace, bytes);
    }
    void* buffer = workspace > 0 ? arena_.bytes(workspace) : nullptr;
    for (Params& p : params_) {
      p.workspace = buffer;
      p.workspace_bytes = workspace;
      if (direction_ != Direction::backward) continue;
      Params fwd = p;
      fwd.backend = Backend::auto_select;
      fwd.workspace = nullptr;
      fwd.workspace_bytes = 0;
      if (Status st = fmha::forward(fwd); !st.ok()) return st;
    }
    device_.synchronize();
    return Status::success();
  }

  // Runs `name` once on set 0 with its outputs poisoned first (all bits set: NaN in every dtype).
  Status run_once(const std::string& name, std::vector<std::vector<double>>* results) {
    for (const Tensor* t : outputs(params_[0], direction_)) device_.fill(t->data, 0xFF, bytes_of(*t));
    if (Status st = run(name, 0); !st.ok()) return st;
    device_.synchronize();
    results->clear();
    for (const Tensor* t : outputs(params_[0], direction_)) results->push_back(read_back(device_, *t));
    return Status::success();
  }

  Status time(const std::string& name, int warmup, int iters, double* ms) {
    const int sets = int(params_.size());
    for (int i = 0; i < warmup; ++i)
      if (Status st = run(name, i % sets); !st.ok()) return st;
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      Status st;
      times.push_back(device_.time([&] { return run(name, i % sets); }, &st));
      if (!st.ok()) return st;
    }
    *ms = median(times);
    return Status::success();
  }

 private:
  Status run(const std::string& name, int set) {
    {
      std::lock_guard<std::mutex> lock(g_test_mutex);
      if (g_test_candidate && g_test_candidate->name == name)
        return g_test_candidate->run(params_[size_t(set)], direction_);
    }
    CandidateScope scope(entry_.id, direction_, name);
    return entry_.run(params_[size_t(set)], direction_);
  }

  TuneDevice& device_;
  Arena arena_;
  const BackendEntry& entry_;
  Direction direction_;
  std::vector<Params> params_;
};

size_t input_bytes(const Params& p, Direction direction) {
  const Problem s = Problem::of(p);
  const size_t e = dtype_size(s.dtype);
  size_t n = size_t(s.batch * s.seqlen_q * s.heads * (s.head_dim + s.head_dim_v)) +
             size_t(s.batch * s.seqlen_k * s.kv_heads * (s.head_dim + s.head_dim_v));
  return (direction == Direction::backward ? 2 : 1) * n * e;
}

// The environment variable of a call's variants on `tier`, for reporting where a choice came
// from; none for the decode kernel's split counts (Params::num_splits is their override).
const char* variable_of(Backend tier, const Params& params, Direction direction) {
  const bool bwd = direction == Direction::backward;
  if (class_of(tier, params, direction).decode) return nullptr;
  switch (tier) {
    case Backend::cpu: return "FMHA_CPU_CONFIG";
    case Backend::cuda_simt: return bwd ? "FMHA_SIMT_BWD_CONFIG" : "FMHA_SIMT_CONFIG";
    case Backend::cuda_sm80: return bwd ? "FMHA_SM80_BWD_CONFIG" : "FMHA_SM80_FWD_CONFIG";
    case Backend::cuda_sm90: return bwd ? nullptr : "FMHA_SM90_FWD_CONFIG";
    default: return nullptr;
  }
}

// The call's shapes, types, devices and options, with contiguous views at a placeholder address
// that is never read: enough to validate the call and choose its backend.
Params shape_of(const Params& call) {
  alignas(64) static unsigned char never_read[64];
  Params p = call;
  auto like = [&](const Tensor& t, DType dtype, std::initializer_list<int64_t> shape) {
    return make_tensor(never_read, dtype, shape, t.device);
  };
  const Tensor q = call.q, k = call.k, v = call.v;
  if (q.rank != 4 || k.rank != 4 || v.rank != 4) return p;  // validate() names what is wrong
  const int64_t b = q.shape[0], sq = q.shape[1], h = q.shape[2], d = q.shape[3];
  const int64_t sk = k.shape[1], hkv = k.shape[2], dv = v.shape[3];
  p.q = like(q, q.dtype, {b, sq, h, d});
  p.k = like(k, k.dtype, {k.shape[0], sk, hkv, k.shape[3]});
  p.v = like(v, v.dtype, {v.shape[0], v.shape[1], v.shape[2], dv});
  p.o = p.dout = like(q, q.dtype, {b, sq, h, dv});
  p.lse = like(q, DType::fp32, {b, h, sq});
  p.dq = like(q, q.dtype, {b, sq, h, d});
  p.dk = like(k, q.dtype, {k.shape[0], sk, hkv, k.shape[3]});
  p.dv = like(v, q.dtype, {v.shape[0], v.shape[1], v.shape[2], dv});
  p.workspace = nullptr;
  p.workspace_bytes = 0;
  return p;
}

Status tune_call(const Params& call, Direction direction, const TuneOptions& options, TuneResult* result) {
  BackendEntry entry{};
  Params shape;  // the call's shape as the chosen tier runs it
  if (Status st = choose_backend(shape_of(call), direction, &entry, &shape); !st.ok()) return st;
  if (!entry.variants || entry.variants(shape, direction).empty())
    return {Code::unsupported, std::string("backend: ") + to_string(entry.id) + " has no variants to tune for the " +
                                   to_string(direction)};
  const bool gpu = shape.q.device.type == DeviceType::cuda;
  std::unique_ptr<TuneDevice> device = gpu ? make_cuda_tune_device(shape.q.device.index) : make_cpu_tune_device();
  if (!device) return {Code::no_device, "q: this build has no CUDA backend to tune"};
  const int warmup = options.warmup >= 0 ? options.warmup : (gpu ? kGpuWarmup : kCpuWarmup);
  const int iters = options.iters >= 1 ? options.iters : (gpu ? kGpuIters : kCpuIters);
  if (options.iters == 0) return {Code::invalid_argument, "iters: expected at least 1"};
  const int sets = options.rotate > 0 ? options.rotate
                   : gpu ? int(std::clamp<size_t>(kRotateBytes / std::max<size_t>(input_bytes(shape, direction), 1), 1,
                                                  kMaxInputSets))
                         : 1;

  TuningGuard tuning;
  Session session(*device, entry, shape, direction, sets);
  const Params& p = session.params();
  std::vector<std::string> names = entry.variants(p, direction);
  if (Status st = session.prepare(names); !st.ok()) return st;

  TuneResult r;
  r.problem = class_of(entry.id, p, direction);
  r.device = device_key(p.q.device);
  {
    CandidateScope builtin(entry.id, direction, "");
    if (Status st = entry.variant_of(p, direction, &r.default_variant); !st.ok()) return st;
  }
  {
    std::lock_guard<std::mutex> lock(g_test_mutex);
    if (g_test_candidate) names.push_back(g_test_candidate->name);
  }
  const int total = int(names.size());
  auto progress = [&](int done, const std::string& name) {
    if (options.progress) options.progress(done, total, name);
  };

  // The default's outputs: what every candidate must reproduce.
  std::vector<std::vector<double>> reference;
  if (Status st = session.run_once(r.default_variant, &reference); !st.ok())
    return {st.code, "the default variant " + r.default_variant + " failed: " + st.message};
  const double allowed = kAgreementFactor * tolerance(p.q.dtype, p.precision, direction);

  for (int i = 0; i < total; ++i) {
    const std::string& name = names[size_t(i)];
    progress(i, name);
    VariantTiming v;
    v.variant = name;
    v.is_default = name == r.default_variant;
    bool is_test = false;
    {
      std::lock_guard<std::mutex> lock(g_test_mutex);
      is_test = g_test_candidate && g_test_candidate->name == name;
    }
    if (!is_test) {
      std::string runs;
      CandidateScope scope(entry.id, direction, name);
      if (Status st = entry.variant_of(p, direction, &runs); !st.ok()) {
        v.status = "refused: " + st.message;
        r.variants.push_back(v);
        continue;
      }
      if (runs != name) {  // not compiled for this class: the request falls back to another
        v.status = "not compiled for this class";
        r.variants.push_back(v);
        continue;
      }
    }
    std::vector<std::vector<double>> got;
    if (Status st = session.run_once(name, &got); !st.ok()) {
      v.status = "failed: " + st.message;
      r.variants.push_back(v);
      continue;
    }
    for (size_t o = 0; o < got.size(); ++o)
      v.difference = std::max(v.difference, relative_difference(got[o], reference[o]));
    if (!(v.difference <= allowed)) {
      char text[96];
      std::snprintf(text, sizeof text, "disagrees with the default (difference %.3g > %.3g)", v.difference, allowed);
      v.status = text;
      r.variants.push_back(v);
      continue;
    }
    if (Status st = session.time(name, warmup, iters, &v.ms); !st.ok()) {
      v.status = "failed: " + st.message;
      v.ms = 0.0;
      r.variants.push_back(v);
      continue;
    }
    v.agrees = true;
    v.status = "ok";
    r.variants.push_back(v);
  }
  progress(total, "");

  const VariantTiming* best = nullptr;
  const VariantTiming* builtin = nullptr;
  for (const VariantTiming& v : r.variants) {
    if (v.is_default) builtin = &v;
    if (v.agrees && (!best || v.ms < best->ms)) best = &v;
  }
  if (builtin && builtin->agrees) {
    r.default_ms = builtin->ms;
    if (best && best->ms > builtin->ms * (1.0 - kMinGain)) best = builtin;
  }
  if (!best)
    return {Code::internal, "no variant of " + std::string(to_string(entry.id)) + " ran the class " + r.problem.key()};
  r.winner = best->variant;
  r.winner_ms = best->ms;

  if (options.write_cache) {
    CacheEntry e;
    e.variant = r.winner;
    e.ms = r.winner_ms;
    e.default_variant = r.default_variant;
    e.default_ms = r.default_ms;
    for (const VariantTiming& v : r.variants)
      if (v.agrees) e.timings.emplace_back(v.variant, v.ms);
    if (Status st = store_in_cache(r.device, r.problem.key(), e); !st.ok()) return st;
  }
  *result = std::move(r);
  return Status::success();
}

std::atomic<int> g_autotune{-1};  // -1: not yet read from FMHA_AUTOTUNE
std::mutex g_tried_mutex;
std::set<std::string> g_tried;

}  // namespace

std::unique_ptr<TuneDevice> make_cpu_tune_device() { return std::make_unique<CpuTuneDevice>(); }

void set_test_candidate(std::optional<TestCandidate> candidate) {
  std::lock_guard<std::mutex> lock(g_test_mutex);
  g_test_candidate = std::move(candidate);
}

bool autotune_wanted(const Params& p, Direction direction, Backend tier) {
  if (!autotune_enabled() || tuning_in_progress()) return false;
  const std::string device = device_key(p.q.device), key = class_of(tier, p, direction).key();
  if (!cached_variant(device, key).empty()) return false;
  std::lock_guard<std::mutex> lock(g_tried_mutex);
  return g_tried.insert(device + "\n" + key).second;
}

void autotune(const Params& p, Direction direction, Backend tier) {
  Params shape = p;
  shape.backend = tier;
  TuneResult result;
  const Status st = fmha::tune(shape, direction, TuneOptions{}, &result);
  if (!st.ok())
    std::fprintf(stderr, "fmha: autotune of %s failed (the default runs): %s\n",
                 class_of(tier, p, direction).key().c_str(), st.message.c_str());
}

}  // namespace detail

Status problem_class(const Params& params, Direction direction, ProblemClass* out) {
  detail::BackendEntry entry{};
  Params shape;
  if (Status st = detail::choose_backend(detail::shape_of(params), direction, &entry, &shape); !st.ok()) return st;
  *out = detail::class_of(entry.id, shape, direction);
  return Status::success();
}

Status selected_variant(const Params& params, Direction direction, VariantChoice* out) {
  detail::BackendEntry entry{};
  Params call;  // as the chosen tier runs it
  if (Status st = detail::choose_backend(params, direction, &entry, &call); !st.ok()) return st;
  VariantChoice c;
  c.backend = entry.id;
  c.precision = call.precision;
  if (entry.variant_of && entry.variants && !entry.variants(call, direction).empty()) {
    if (Status st = entry.variant_of(call, direction, &c.variant); !st.ok()) return st;
    const char* variable = detail::variable_of(entry.id, call, direction);
    const detail::VariantRequest request =
        detail::requested_variant(entry.id, call, direction, variable ? std::getenv(variable) : nullptr);
    // A request the class cannot honour (a variant not compiled at its head dim) runs the default.
    c.source = request.name == c.variant ? detail::to_string(request.source) : "default";
  }
  *out = c;
  return Status::success();
}

Status tune(const Params& params, Direction direction, const TuneOptions& options, TuneResult* result) {
  if (!result) return {Code::invalid_argument, "result: must not be null"};
  try {
    return detail::tune_call(params, direction, options, result);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  } catch (const std::bad_alloc&) {
    return {Code::internal, "tuner: out of host memory"};
  } catch (const std::exception& e) {
    return {Code::internal, std::string("tuner: ") + e.what()};
  }
}

void set_autotune(bool enabled) { detail::g_autotune = enabled ? 1 : 0; }

bool autotune_enabled() {
  int value = detail::g_autotune;
  if (value < 0) {
    const char* env = std::getenv("FMHA_AUTOTUNE");
    value = env && *env && std::strcmp(env, "0") != 0 ? 1 : 0;
    int expected = -1;
    detail::g_autotune.compare_exchange_strong(expected, value);
    value = detail::g_autotune;
  }
  return value == 1;
}

}  // namespace fmha
