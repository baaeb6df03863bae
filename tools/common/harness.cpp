// See harness.h. Inputs are drawn from N(0, 1) with a seeded generator, rounded to the storage
// dtype on the host, and uploaded; outputs are poisoned with all-ones bytes (NaN in every dtype)
// before each run so that an element the backend forgot to write cannot pass.
#include "harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "common/numeric.h"
#include "common/parallel.h"
#include "common/problem.h"
#include "common/tensor_access.h"
#include "common/varlen.h"
#include "common/tolerance.h"
#include "cpu/reference.h"

#ifdef FMHA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fmha::tools {

// ------------------------------------------------------------------------------------------------
// CaseSpec
// ------------------------------------------------------------------------------------------------

CaseSpec CaseSpec::resolved() const {
  CaseSpec s = *this;
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (s.varlen()) {
    if (s.seqlens_k.empty()) s.seqlens_k = s.seqlens_q;
    s.batch = int64_t(s.seqlens_q.size());
    s.seqlen_q = *std::max_element(s.seqlens_q.begin(), s.seqlens_q.end());
    s.seqlen_k = s.seqlens_k.empty() ? 0 : *std::max_element(s.seqlens_k.begin(), s.seqlens_k.end());
  } else if (s.seqlen_k == 0) {
    s.seqlen_k = s.seqlen_q;
  }
  if (s.head_dim_v == 0) s.head_dim_v = s.head_dim;
  return s;
}

int64_t CaseSpec::total_q() const {
  return varlen() ? std::accumulate(seqlens_q.begin(), seqlens_q.end(), int64_t(0)) : batch * seqlen_q;
}
int64_t CaseSpec::total_k() const {
  const CaseSpec s = resolved();
  return s.varlen() ? std::accumulate(s.seqlens_k.begin(), s.seqlens_k.end(), int64_t(0)) : s.batch * s.seqlen_k;
}

double CaseSpec::bytes() const {
  const CaseSpec s = resolved();
  return double(dtype_size(s.dtype)) * (double(s.total_q() * s.heads * (s.head_dim + s.head_dim_v)) +
                                        double(s.total_k() * s.kv_heads * (s.head_dim + s.head_dim_v)));
}

std::string CaseSpec::dtype_name() const {
  if (dtype == DType::fp32 && precision != Precision::ieee) return to_string(precision);
  return to_string(dtype);
}

double CaseSpec::flops() const {
  const CaseSpec s = resolved();
  Problem p;
  p.batch = s.varlen() ? 1 : s.batch;
  p.heads = s.heads;
  p.head_dim = s.head_dim;
  p.head_dim_v = s.head_dim_v;
  if (!s.varlen()) {
    p.seqlen_q = s.seqlen_q;
    p.seqlen_k = s.seqlen_k;
    return Problem::flops(p, s.causal, s.mode);
  }
  double sum = 0.0;  // each sequence's own rectangle: padding is no work
  for (size_t b = 0; b < s.seqlens_q.size(); ++b) {
    p.seqlen_q = s.seqlens_q[b];
    p.seqlen_k = s.seqlens_k[b];
    sum += Problem::flops(p, s.causal, s.mode);
  }
  return sum;
}

// ------------------------------------------------------------------------------------------------
// Buffer
// ------------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void cuda_fail(const char* what, int code) {
  throw std::runtime_error(std::string(what) + " failed with CUDA error " + std::to_string(code));
}

#ifdef FMHA_WITH_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

}  // namespace

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  const size_t alloc = std::max<size_t>(bytes, 64);
  if (device.type == DeviceType::cpu) {
    data_ = std::aligned_alloc(64, (alloc + 63) / 64 * 64);
    if (!data_) throw std::bad_alloc();
    return;
  }
#ifdef FMHA_WITH_CUDA
  cuda_check(cudaSetDevice(device.index), "cudaSetDevice");
  cuda_check(cudaMalloc(&data_, alloc), "cudaMalloc");
#else
  cuda_fail("device allocation (this build has no CUDA)", 0);
#endif
}

Buffer::~Buffer() {
  if (!data_) return;
  if (device_.type == DeviceType::cpu) {
    std::free(data_);
    return;
  }
#ifdef FMHA_WITH_CUDA
  cudaFree(data_);
#endif
}

Buffer::Buffer(Buffer&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    new (this) Buffer(std::move(o));
  }
  return *this;
}

void Buffer::upload(const void* host) {
  if (bytes_ == 0) return;
  if (device_.type == DeviceType::cpu) {
    std::memcpy(data_, host, bytes_);
    return;
  }
#ifdef FMHA_WITH_CUDA
  cuda_check(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
#endif
}

void Buffer::download(void* host) const {
  if (bytes_ == 0) return;
  if (device_.type == DeviceType::cpu) {
    std::memcpy(host, data_, bytes_);
    return;
  }
#ifdef FMHA_WITH_CUDA
  cuda_check(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
#endif
}

void Buffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  if (device_.type == DeviceType::cpu) {
    std::memset(data_, value, bytes_);
    return;
  }
#ifdef FMHA_WITH_CUDA
  cuda_check(cudaMemset(data_, value, bytes_), "cudaMemset");
#endif
}

bool cuda_available() {
#ifdef FMHA_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

std::string device_description(Device device) {
  if (device.type == DeviceType::cuda) {
    for (const DeviceInfo& d : devices())
      if (d.device == device) return d.name;
    return "cuda:" + std::to_string(device.index);
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      std::string name = colon == std::string::npos ? line : line.substr(colon + 2);
      return name + " (" + std::to_string(devices().front().multiprocessors) + " threads)";
    }
  return "cpu";
}

// ------------------------------------------------------------------------------------------------
// Harness
// ------------------------------------------------------------------------------------------------

namespace {

constexpr unsigned char kPoisonByte = 0xff;  // all-ones: NaN in fp32, fp16 and bf16

// A tensor of `shape` (contiguous) in a buffer, with a host copy of its stored bytes.
struct Slot {
  Buffer device;
  std::vector<unsigned char> host;
  DType dtype = DType::fp32;
  int rank = 0;
  int64_t shape[kMaxRank] = {};

  Slot() = default;
  Slot(Device dev, DType dt, std::initializer_list<int64_t> dims) : dtype(dt), rank(int(dims.size())) {
    std::copy(dims.begin(), dims.end(), shape);
    device = Buffer(dev, size_t(numel()) * dtype_size(dt));
    host.resize(device.bytes());
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }
  Tensor view(const void* data, Device dev) const {
    Tensor t;
    t.data = const_cast<void*>(data);
    t.dtype = dtype;
    t.device = dev;
    t.rank = rank;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      t.shape[d] = shape[d];
      t.stride[d] = stride;
      stride *= shape[d];
    }
    return t;
  }
  // N(0, 1) values: Box-Muller over splitmix64, in blocks of kRandomBlock elements, each block's
  // stream starting from the tensor's seed (drawn from `state`) and the block's index, so that the
  // blocks fill on every thread of the machine (a gigabyte KV cache takes seconds on one) and the
  // values do not depend on how many there are.
  void fill_random(uint64_t& state) {
    constexpr int64_t kRandomBlock = int64_t(1) << 16;  // even: a block holds whole pairs
    const uint64_t seed = splitmix64(state);
    struct Fill {
      Slot* slot;
      uint64_t seed;
    } fill{this, seed};
    const int64_t n = numel(), blocks = (n + kRandomBlock - 1) / kRandomBlock;
    parallel_for_each(blocks, hardware_threads(), [](void* context, int, int64_t block) {
      const Fill& f = *static_cast<const Fill*>(context);
      uint64_t stream = f.seed ^ (uint64_t(block) * 0xd1b54a32d192ed03ull);
      constexpr double kTwoPi = 6.283185307179586, kUnit = 1.0 / 9007199254740992.0;  // 2^-53
      const int64_t begin = block * kRandomBlock, end = std::min(begin + kRandomBlock, f.slot->numel());
      for (int64_t i = begin; i < end; i += 2) {
        const double u1 = (double(splitmix64(stream) >> 11) + 1.0) * kUnit, u2 = double(splitmix64(stream) >> 11) * kUnit;
        const double radius = std::sqrt(-2.0 * std::log(u1));
        store_element(f.slot->host.data(), f.slot->dtype, i, float(radius * std::cos(kTwoPi * u2)));
        if (i + 1 < end) store_element(f.slot->host.data(), f.slot->dtype, i + 1, float(radius * std::sin(kTwoPi * u2)));
      }
    }, &fill);
    device.upload(host.data());
  }
  // The same values as `other` (another input set for rotation: distinct memory is what counts).
  void copy_values(const Slot& other) { device.upload(other.host.data()); }
  float at(int64_t i) const { return load_element(host.data(), dtype, i); }
};

}  // namespace

struct Harness::Set {
  Slot q, k, v, o, lse, dout, dq, dk, dv;
  Slot cu_seqlens_q, cu_seqlens_k;  // varlen: int32 [batch + 1]
  Slot block_table, cache_seqlens;  // paged: int32 [batch, pages per sequence], [batch]
};

namespace {

// The prefix sums of `lengths` as an int32 table.
void fill_table(Slot& slot, const std::vector<int64_t>& lengths) {
  int64_t sum = 0;
  std::vector<int32_t> table(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) table[b + 1] = int32_t(sum += lengths[b]);
  std::memcpy(slot.host.data(), table.data(), table.size() * sizeof(int32_t));
  slot.device.upload(slot.host.data());
}

}  // namespace

Harness::Harness(const CaseSpec& spec, Device device, int input_sets) : spec_(spec.resolved()), device_(device) {
  const CaseSpec& s = spec_;
  uint64_t rng = s.seed;
  const bool bwd = s.mode == Direction::backward;
  // Dense [B, S, H, D] slots, or packed [total, H, D] ones (lse [H, total_q]) with the tables.
  const bool varlen = s.varlen();
  if (varlen && s.seqlens_k.size() != s.seqlens_q.size())
    throw std::invalid_argument("seqlens_k: " + std::to_string(s.seqlens_k.size()) + " sequences, expected " +
                                std::to_string(s.seqlens_q.size()) + " like seqlens_q");
  if (varlen && s.paged()) throw std::invalid_argument("page_size: a paged KV cache does not combine with a varlen batch");
  if (s.page_size < 0) throw std::invalid_argument("page_size: expected >= 0");
  const int64_t total_q = s.total_q(), total_k = s.total_k();
  // A paged cache: every sequence's pages, all of them in one pool, in a seeded random order.
  const int64_t pages_per_seq = s.paged() ? std::max<int64_t>(1, (s.seqlen_k + s.page_size - 1) / s.page_size) : 0;
  const int64_t num_pages = s.batch * pages_per_seq;
  std::vector<int32_t> table, lengths;
  if (s.paged()) {
    table.resize(size_t(num_pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(s.seed ^ 0x5eedull));
    lengths.assign(size_t(s.batch), int32_t(s.seqlen_k));
  }
  auto q_like = [&](int64_t dim) {
    return varlen ? Slot(device, s.dtype, {total_q, s.heads, dim}) : Slot(device, s.dtype, {s.batch, s.seqlen_q, s.heads, dim});
  };
  auto k_like = [&](int64_t dim) {
    if (s.paged()) return Slot(device, s.dtype, {num_pages, s.page_size, s.kv_heads, dim});
    return varlen ? Slot(device, s.dtype, {total_k, s.kv_heads, dim})
                  : Slot(device, s.dtype, {s.batch, s.seqlen_k, s.kv_heads, dim});
  };
  for (int i = 0; i < std::max(input_sets, 1); ++i) {
    auto set = std::make_unique<Set>();
    set->q = q_like(s.head_dim);
    set->k = k_like(s.head_dim);
    set->v = k_like(s.head_dim_v);
    set->o = q_like(s.head_dim_v);
    set->lse = varlen ? Slot(device, DType::fp32, {s.heads, total_q}) : Slot(device, DType::fp32, {s.batch, s.heads, s.seqlen_q});
    if (varlen) {
      set->cu_seqlens_q = Slot(device, DType::int32, {s.batch + 1});
      set->cu_seqlens_k = Slot(device, DType::int32, {s.batch + 1});
      fill_table(set->cu_seqlens_q, s.seqlens_q);
      fill_table(set->cu_seqlens_k, s.seqlens_k);
    }
    if (s.paged()) {
      set->block_table = Slot(device, DType::int32, {s.batch, pages_per_seq});
      set->cache_seqlens = Slot(device, DType::int32, {s.batch});
      std::memcpy(set->block_table.host.data(), table.data(), table.size() * sizeof(int32_t));
      std::memcpy(set->cache_seqlens.host.data(), lengths.data(), lengths.size() * sizeof(int32_t));
      set->block_table.device.upload(set->block_table.host.data());
      set->cache_seqlens.device.upload(set->cache_seqlens.host.data());
    }
    if (i == 0) {
      set->q.fill_random(rng);
      set->k.fill_random(rng);
      set->v.fill_random(rng);
    } else {
      set->q.copy_values(sets_[0]->q);
      set->k.copy_values(sets_[0]->k);
      set->v.copy_values(sets_[0]->v);
    }
    if (bwd) {
      set->dout = q_like(s.head_dim_v);
      set->dq = q_like(s.head_dim);
      set->dk = k_like(s.head_dim);
      set->dv = k_like(s.head_dim_v);
      if (i == 0) set->dout.fill_random(rng);
      else set->dout.copy_values(sets_[0]->dout);
    }
    sets_.push_back(std::move(set));
  }
#ifdef FMHA_WITH_CUDA
  if (device.type == DeviceType::cuda) {
    cudaStream_t stream = nullptr;
    // A blocking stream: the synchronous copies and memsets on the legacy default stream that
    // poison and read back the buffers are ordered with the calls made on it.
    cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    stream_ = stream;
  }
#endif
}

Harness::~Harness() {
#ifdef FMHA_WITH_CUDA
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

// What the call and the oracle share: the set's slots as views of their device copies (or of
// their host copies, on the CPU), lse where `with_lse`, and the spec's mask and scale.
Params Harness::views(const Set& set, bool host_copies, bool with_lse) const {
  const Device device = host_copies ? Device{} : device_;
  auto view = [&](const Slot& slot) {
    return slot.view(host_copies ? static_cast<const void*>(slot.host.data()) : slot.device.data(), device);
  };
  Params p;
  p.q = view(set.q);
  p.k = view(set.k);
  p.v = view(set.v);
  p.o = view(set.o);
  if (with_lse) p.lse = view(set.lse);
  if (spec_.mode == Direction::backward) {
    p.dout = view(set.dout);
    p.dq = view(set.dq);
    p.dk = view(set.dk);
    p.dv = view(set.dv);
  }
  if (spec_.varlen()) {
    p.cu_seqlens_q = view(set.cu_seqlens_q);
    p.cu_seqlens_k = view(set.cu_seqlens_k);
    p.max_seqlen_q = spec_.seqlen_q;
    p.max_seqlen_k = spec_.seqlen_k;
  }
  if (spec_.paged()) {
    p.block_table = view(set.block_table);
    p.cache_seqlens = view(set.cache_seqlens);
  }
  p.softmax_scale = spec_.softmax_scale;
  p.causal = spec_.causal;
  p.window_left = spec_.window_left;
  p.window_right = spec_.window_right;
  p.q_offset = spec_.q_offset;
  return p;
}

Params Harness::params(int input_set) const {
  Params p = views(*sets_[size_t(input_set)], false, spec_.with_lse || spec_.mode == Direction::backward);
  p.precision = spec_.precision;
  p.deterministic = spec_.deterministic;
  p.backend = spec_.backend;
  p.num_threads = spec_.num_threads;
  p.num_splits = spec_.num_splits;
  p.stream = stream_;
  p.workspace = workspace_.data();
  p.workspace_bytes = workspace_.bytes();
  return p;
}

Status Harness::run(int set, Direction direction) {
  Params p = params(set);
  if (direction == Direction::forward && spec_.mode == Direction::backward) {
    // The forward that produces O and LSE for a backward case.
    p.dout = p.dq = p.dk = p.dv = Tensor{};
  }
  size_t bytes = 0;
  if (Status s = workspace_size(p, direction, &bytes); !s.ok()) return s;
  if (bytes > workspace_.bytes()) {
    workspace_ = Buffer(device_, bytes);
    p.workspace = workspace_.data();
    p.workspace_bytes = workspace_.bytes();
  }
  if (Status s = select_backend(p, direction, &backend_used_); !s.ok()) return s;
  return direction == Direction::forward ? forward(p) : backward(p);
}

Status Harness::prepare_backward_inputs(int set) {
  Set& st = *sets_[size_t(set)];
  st.o.device.fill_bytes(kPoisonByte);
  st.lse.device.fill_bytes(kPoisonByte);
  return run(set, Direction::forward);
}

Status Harness::run_once() {
  try {
    auto finish = [this](Status s) {
#ifdef FMHA_WITH_CUDA
      if (s.ok() && stream_) cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
#endif
      return s;
    };
    Set& set = *sets_[0];
    if (spec_.mode == Direction::forward) {
      set.o.device.fill_bytes(kPoisonByte);
      set.lse.device.fill_bytes(kPoisonByte);
      Status s = finish(run(0, Direction::forward));
      if (s.ok()) {
        set.o.device.download(set.o.host.data());
        set.lse.device.download(set.lse.host.data());
      }
      return s;
    }
    if (Status s = prepare_backward_inputs(0); !s.ok()) return s;
    backward_ready_ = true;
    for (Slot* slot : {&set.dq, &set.dk, &set.dv}) slot->device.fill_bytes(kPoisonByte);
    Status s = finish(run(0, Direction::backward));
    if (s.ok()) {
      for (Slot* slot : {&set.o, &set.lse, &set.dq, &set.dk, &set.dv}) slot->device.download(slot->host.data());
    }
    return s;
  } catch (const std::exception& e) {
    return {Code::internal, e.what()};
  }
}

Status Harness::time(int warmup, int iters, double* median_ms) {
  try {
    const Direction dir = spec_.mode;
    if (dir == Direction::backward)
      for (int i = 0; i < int(sets_.size()); ++i)
        if (Status s = prepare_backward_inputs(i); !s.ok()) return s;
    const int sets = int(sets_.size());
    for (int i = 0; i < warmup; ++i)
      if (Status s = run(i % sets, dir); !s.ok()) return s;
    std::vector<double> ms;
    ms.reserve(size_t(iters));
#ifdef FMHA_WITH_CUDA
    if (device_.type == DeviceType::cuda) {
      cudaStream_t stream = static_cast<cudaStream_t>(stream_);
      cudaEvent_t start, stop;
      cuda_check(cudaEventCreate(&start), "cudaEventCreate");
      cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
      for (int i = 0; i < iters; ++i) {
        cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
        Status s = run(i % sets, dir);
        cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
        if (!s.ok()) return s;
        cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float elapsed = 0.f;
        cuda_check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
        ms.push_back(double(elapsed));
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
#endif
    if (device_.type == DeviceType::cpu) {
      for (int i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (Status s = run(i % sets, dir); !s.ok()) return s;
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    if (ms.empty()) return {Code::invalid_argument, "iters: expected at least 1"};
    std::sort(ms.begin(), ms.end());
    *median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    return Status::success();
  } catch (const std::exception& e) {
    return {Code::internal, e.what()};
  }
}

void Harness::perturb_result_for_testing(float factor) {
  Slot& slot = spec_.mode == Direction::forward ? sets_[0]->o : sets_[0]->dq;
  for (int64_t i = 0; i < slot.numel(); ++i) store_element(slot.host.data(), slot.dtype, i, slot.at(i) * factor);
}

// ------------------------------------------------------------------------------------------------
// Check against the oracle
// ------------------------------------------------------------------------------------------------

namespace {

struct ErrorSum {
  double diff2 = 0.0, ref2 = 0.0, max_abs = 0.0;
  void add(double out, double ref) {
    const double d = out - ref;
    diff2 += d * d;
    ref2 += ref * ref;
    max_abs = std::max(max_abs, std::abs(d));
  }
  double rel() const { return ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2); }
  // Relative to max(||ref||, floor): for a gradient that is (nearly) zero in exact arithmetic.
  double rel(double floor_norm) const {
    const double norm = std::max(std::sqrt(ref2), floor_norm);
    return norm > 0.0 ? std::sqrt(diff2) / norm : std::sqrt(diff2);
  }
};

// First NaN in a host slot, or -1.
int64_t first_nan(const Slot& slot) {
  for (int64_t i = 0; i < slot.numel(); ++i)
    if (std::isnan(slot.at(i))) return i;
  return -1;
}

}  // namespace

CheckResult Harness::check(double budget_flops) const {
  const CaseSpec& s = spec_;
  const Set& set = *sets_[0];
  CheckResult r;
  r.tolerance = tolerance(s.dtype, s.precision, s.mode);

  // An oracle view of the same stored inputs on the CPU; a varlen case is checked one sequence
  // at a time, each as the dense batch-1 call it is (common/varlen.h).
  const Params host = views(set, true, true);
  const std::vector<Params> calls = dense_calls(host);
  std::vector<Problem> problems;
  for (const Params& c : calls) problems.push_back(Problem::of(c));
  // Index into a slot's host copy of element (b, row, h, d) of a call's view of it.
  auto index4 = [](const Slot& slot, const Tensor& view, int64_t b, int64_t row, int64_t h, int64_t d) {
    return (static_cast<const unsigned char*>(view.data) - slot.host.data()) / int64_t(dtype_size(slot.dtype)) +
           offset4(view, b, row, h, d);
  };
  auto index3 = [](const Slot& slot, const Tensor& view, int64_t b, int64_t h, int64_t row) {
    return (static_cast<const unsigned char*>(view.data) - slot.host.data()) / int64_t(sizeof(float)) +
           offset3(view, b, h, row);
  };
  // Items of all calls numbered one after another: the call of flat item i and its local number.
  struct Flat {
    std::vector<int64_t> first;  // [calls + 1]
    std::pair<size_t, int64_t> locate(int64_t item) const {
      const size_t c = size_t(std::upper_bound(first.begin(), first.end(), item) - first.begin()) - 1;
      return {c, item - first[c]};
    }
  };
  std::mt19937_64 rng(s.seed ^ 0x9e3779b97f4a7c15ull);

  auto fail = [&](const std::string& why) {
    if (r.failure.empty()) r.failure = why;
    r.pass = false;
  };
  r.pass = true;

  if (s.mode == Direction::forward) {
    if (int64_t i = first_nan(set.o); i >= 0) fail("o: element " + std::to_string(i) + " is NaN (unwritten?)");
    if (s.with_lse)
      if (int64_t i = first_nan(set.lse); i >= 0) fail("lse: element " + std::to_string(i) + " is NaN (unwritten?)");

    // Rows to compare: all, or a sample that fits the budget (always including first and last rows).
    Flat flat{{0}};
    double cost = 0.0;
    for (const Problem& pr : problems) {
      flat.first.push_back(flat.first.back() + pr.batch * pr.heads * pr.seqlen_q);
      cost += 2.0 * double(pr.batch * pr.heads * pr.seqlen_q) * double(pr.seqlen_k) * double(pr.head_dim + pr.head_dim_v);
    }
    const int64_t total_rows = flat.first.back();
    std::vector<int64_t> rows;
    if (budget_flops <= 0.0 || cost <= budget_flops) {
      rows.resize(size_t(total_rows));
      std::iota(rows.begin(), rows.end(), 0);
    } else {
      r.sampled = true;
      const double row_cost = cost / double(std::max<int64_t>(total_rows, 1));
      const int64_t n = std::max<int64_t>(16, int64_t(budget_flops / row_cost));
      std::uniform_int_distribution<int64_t> pick(0, total_rows - 1);
      rows = {0, total_rows - 1};
      for (int64_t i = 0; i < n; ++i) rows.push_back(pick(rng));
    }
    ErrorSum err;
    double lse_err = 0.0;
    std::vector<double> ref_row;
    for (int64_t item : rows) {
      const auto [c, local] = flat.locate(item);
      const Params& call = calls[c];
      const Problem& pr = problems[c];
      const int64_t row = local % pr.seqlen_q, h = (local / pr.seqlen_q) % pr.heads,
                    b = local / (pr.seqlen_q * pr.heads);
      ref_row.assign(size_t(pr.head_dim_v), 0.0);
      double ref_lse = 0.0;
      reference::forward_row(call, pr, b, h, row, ref_row.data(), &ref_lse);
      const int64_t o0 = index4(set.o, call.o, b, row, h, 0);
      const float out_lse = s.with_lse ? set.lse.at(index3(set.lse, call.lse, b, h, row)) : 0.f;
      if (std::isinf(ref_lse)) {
        for (int64_t d = 0; d < pr.head_dim_v; ++d)
          if (set.o.at(o0 + d) != 0.0f) fail("o: a row that sees no key is not 0");
        if (s.with_lse && !(std::isinf(out_lse) && out_lse < 0)) fail("lse: a row that sees no key is not -inf");
        continue;
      }
      for (int64_t d = 0; d < pr.head_dim_v; ++d) err.add(set.o.at(o0 + d), ref_row[size_t(d)]);
      if (s.with_lse) {
        const double e = std::abs(double(out_lse) - ref_lse) / std::max(1.0, std::abs(ref_lse));
        lse_err = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(lse_err, e);
      }
    }
    r.rel_err_o = err.rel();
    r.lse_err = lse_err;
    r.rel_err = r.rel_err_o;
    r.max_abs_err = err.max_abs;
    if (!(r.rel_err_o <= r.tolerance)) fail("o: rel_err " + std::to_string(r.rel_err_o) + " > tolerance");
    if (!(lse_err <= r.tolerance)) fail("lse: relative error " + std::to_string(lse_err) + " > tolerance");
    return r;
  }

  // Backward.
  for (const Slot* slot : {&set.dq, &set.dk, &set.dv})
    if (int64_t i = first_nan(*slot); i >= 0) fail("a gradient element (" + std::to_string(i) + ") is NaN (unwritten?)");
  auto group_cost = [](const Problem& pr) {
    return 2.0 * double(pr.group) * double(pr.seqlen_q) * double(pr.seqlen_k) * double(2 * pr.head_dim + 3 * pr.head_dim_v);
  };
  Flat flat{{0}};
  double cost = 0.0;
  for (const Problem& pr : problems) {
    flat.first.push_back(flat.first.back() + pr.batch * pr.kv_heads);
    cost += group_cost(pr) * double(pr.batch * pr.kv_heads);
  }
  const int64_t total_groups = flat.first.back();
  std::vector<int64_t> groups(static_cast<size_t>(total_groups));
  std::iota(groups.begin(), groups.end(), 0);
  if (budget_flops > 0.0 && cost > budget_flops) {
    // A random sample of groups whose oracle fits the budget (at least one).
    r.sampled = true;
    std::shuffle(groups.begin(), groups.end(), rng);
    double spent = 0.0;
    size_t n = 0;
    while (n < groups.size()) {
      const double g = group_cost(problems[flat.locate(groups[n]).first]);
      if (n > 0 && spent + g > budget_flops) break;
      spent += g;
      ++n;
    }
    groups.resize(n);
  }
  ErrorSum dq_err, dk_err, dv_err;
  double dq_count = 0.0, dk_count = 0.0, dv_count = 0.0;
  std::vector<double> dq, dk, dv;
  for (int64_t item : groups) {
    const auto [c, local] = flat.locate(item);
    const Params& call = calls[c];
    const Problem& pr = problems[c];
    const int64_t b = local / pr.kv_heads, kv_head = local % pr.kv_heads;
    dq.assign(size_t(pr.group * pr.seqlen_q * pr.head_dim), 0.0);
    dk.assign(size_t(pr.seqlen_k * pr.head_dim), 0.0);
    dv.assign(size_t(pr.seqlen_k * pr.head_dim_v), 0.0);
    reference::backward_group(call, pr, b, kv_head, dq.data(), dk.data(), dv.data());
    for (int64_t g = 0; g < pr.group; ++g)
      for (int64_t row = 0; row < pr.seqlen_q; ++row)
        for (int64_t d = 0; d < pr.head_dim; ++d)
          dq_err.add(set.dq.at(index4(set.dq, call.dq, b, row, kv_head * pr.group + g, d)),
                     dq[size_t((g * pr.seqlen_q + row) * pr.head_dim + d)]);
    for (int64_t j = 0; j < pr.seqlen_k; ++j) {
      for (int64_t d = 0; d < pr.head_dim; ++d)
        dk_err.add(set.dk.at(index4(set.dk, call.dk, b, j, kv_head, d)), dk[size_t(j * pr.head_dim + d)]);
      for (int64_t d = 0; d < pr.head_dim_v; ++d)
        dv_err.add(set.dv.at(index4(set.dv, call.dv, b, j, kv_head, d)), dv[size_t(j * pr.head_dim_v + d)]);
    }
    dq_count += double(pr.group * pr.seqlen_q * pr.head_dim);
    dk_count += double(pr.seqlen_k * pr.head_dim);
    dv_count += double(pr.seqlen_k * pr.head_dim_v);
  }
  // dQ and dK vanish in exact arithmetic where a row sees a single key (P = 1, dP = Δ), leaving
  // only rounding; their error is measured against max(own norm, dV's rms scaled to their size).
  const double dv_rms = std::sqrt(dv_err.ref2 / std::max(1.0, dv_count));
  r.rel_err_dq = dq_err.rel(dv_rms * std::sqrt(dq_count));
  r.rel_err_dk = dk_err.rel(dv_rms * std::sqrt(dk_count));
  r.rel_err_dv = dv_err.rel();
  r.rel_err = std::max({r.rel_err_dq, r.rel_err_dk, r.rel_err_dv});
  r.max_abs_err = std::max({dq_err.max_abs, dk_err.max_abs, dv_err.max_abs});
  if (std::isnan(r.rel_err)) r.rel_err = std::numeric_limits<double>::infinity();
  if (!(r.rel_err <= r.tolerance)) fail("gradients: rel_err " + std::to_string(r.rel_err) + " > tolerance");
  return r;
}

}  // namespace fmha::tools
