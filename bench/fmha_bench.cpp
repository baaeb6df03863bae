// A standalone timing run of the GPU tiers on the seed shape and FlashAttention's bf16 sweep:
// CUDA events around each call, warm-up, median of repeats, TFLOP/s by FlashAttention's
// convention (forward 4·B·H·Sq·Sk·D, halved when causal; backward 2.5× forward).
// Usage: fmha_bench [out.csv]. Prints a table; writes one CSV row per (shape, direction).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace {

struct Shape {
  const char* label;
  fmha::Backend backend;
  fmha::DType dtype;
  fmha::Precision precision;
  int64_t batch, seqlen, heads, head_dim;
  fmha::Causal causal;
};

constexpr int kWarmup = 2;
constexpr double kLongRunMs = 200.0;  // runs this slow get fewer repeats

#define CUDA_OR_DIE(x)                                                              \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));          \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

void* device_random(size_t elements, fmha::DType dtype, std::mt19937& rng) {
  const size_t bytes = elements * fmha::dtype_size(dtype);
  std::vector<uint16_t> half(dtype == fmha::DType::fp32 ? 0 : elements);
  std::vector<float> full(dtype == fmha::DType::fp32 ? elements : 0);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (size_t i = 0; i < elements; ++i) {
    const float x = dist(rng);
    if (dtype == fmha::DType::fp32) {
      full[i] = x;
    } else {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      // Truncation is fine for timing inputs; fp16 gets a value in range by its own encoding.
      half[i] = dtype == fmha::DType::bf16 ? uint16_t(u >> 16) : uint16_t(0x3800 | (rng() & 0x3ff) | (rng() & 1) << 15);
    }
  }
  void* ptr = nullptr;
  CUDA_OR_DIE(cudaMalloc(&ptr, bytes));
  CUDA_OR_DIE(cudaMemcpy(ptr, dtype == fmha::DType::fp32 ? static_cast<void*>(full.data()) : half.data(), bytes,
                         cudaMemcpyHostToDevice));
  return ptr;
}

double flops(const Shape& s, fmha::Direction dir) {
  double f = 4.0 * double(s.batch) * double(s.heads) * double(s.seqlen) * double(s.seqlen) * double(s.head_dim);
  if (s.causal != fmha::Causal::none) f *= 0.5;
  return dir == fmha::Direction::backward ? 2.5 * f : f;
}

// Median milliseconds of `call` on the legacy stream, or a negative value on error.
template <class Call>
double time_ms(Call call) {
  cudaEvent_t start, stop;
  CUDA_OR_DIE(cudaEventCreate(&start));
  CUDA_OR_DIE(cudaEventCreate(&stop));
  std::vector<double> times;
  int repeats = 10;
  for (int i = 0; i < kWarmup + repeats; ++i) {
    CUDA_OR_DIE(cudaEventRecord(start));
    const fmha::Status st = call();
    CUDA_OR_DIE(cudaEventRecord(stop));
    CUDA_OR_DIE(cudaEventSynchronize(stop));
    if (!st.ok()) {
      std::fprintf(stderr, "  call failed: %s\n", st.message.c_str());
      return -1;
    }
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, start, stop));
    if (i >= kWarmup) times.push_back(ms);
    if (i == 0 && ms > kLongRunMs) repeats = 3;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using fmha::Backend;
  using fmha::Causal;
  using fmha::DType;
  using fmha::Precision;
  std::vector<Shape> shapes = {
      {"seed", Backend::cuda_simt, DType::fp32, Precision::ieee, 4, 4096, 4, 64, Causal::none},
      {"seed", Backend::cuda_sm80, DType::fp32, Precision::tf32, 4, 4096, 4, 64, Causal::none},
      {"seed", Backend::cuda_sm80, DType::bf16, Precision::ieee, 4, 4096, 4, 64, Causal::none},
  };
  constexpr int64_t kTokens = 16384, kHidden = 2048;
  for (int64_t d : {64, 128})
    for (Causal causal : {Causal::none, Causal::bottom_right})
      for (int64_t s : {2048, 4096, 8192, 16384})
        shapes.push_back({"sweep", Backend::cuda_sm80, DType::bf16, Precision::ieee, kTokens / s, s, kHidden / d, d,
                          causal});

  FILE* csv = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  if (csv) std::fprintf(csv, "label,backend,dtype,batch,seqlen,heads,head_dim,causal,direction,ms,tflops\n");
  std::printf("%-6s %-5s %-5s %5s %6s %5s %4s %-6s %-4s %10s %9s\n", "shape", "tier", "type", "B", "S", "H", "D",
              "causal", "dir", "ms", "TFLOP/s");
  std::mt19937 rng(1234);
  int device = 0;
  CUDA_OR_DIE(cudaGetDevice(&device));
  const fmha::Device dev{fmha::DeviceType::cuda, device};
  for (const Shape& s : shapes) {
    const size_t n = size_t(s.batch * s.seqlen * s.heads * s.head_dim);
    void* q = device_random(n, s.dtype, rng);
    void* k = device_random(n, s.dtype, rng);
    void* v = device_random(n, s.dtype, rng);
    void* dout = device_random(n, s.dtype, rng);
    void *o, *dq, *dk, *dv, *lse, *workspace = nullptr;
    const size_t bytes = n * fmha::dtype_size(s.dtype);
    CUDA_OR_DIE(cudaMalloc(&o, bytes));
    CUDA_OR_DIE(cudaMalloc(&dq, bytes));
    CUDA_OR_DIE(cudaMalloc(&dk, bytes));
    CUDA_OR_DIE(cudaMalloc(&dv, bytes));
    CUDA_OR_DIE(cudaMalloc(&lse, size_t(s.batch * s.heads * s.seqlen) * 4));
    fmha::Params p;
    p.q = fmha::make_tensor(q, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.k = fmha::make_tensor(k, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.v = fmha::make_tensor(v, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.o = fmha::make_tensor(o, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.lse = fmha::make_tensor(lse, fmha::DType::fp32, {s.batch, s.heads, s.seqlen}, dev);
    p.dout = fmha::make_tensor(dout, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.dq = fmha::make_tensor(dq, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.dk = fmha::make_tensor(dk, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.dv = fmha::make_tensor(dv, s.dtype, {s.batch, s.seqlen, s.heads, s.head_dim}, dev);
    p.causal = s.causal;
    p.precision = s.precision;
    p.backend = s.backend;
    size_t ws = 0;
    if (fmha::workspace_size(p, fmha::Direction::backward, &ws).ok() && ws > 0) {
      CUDA_OR_DIE(cudaMalloc(&workspace, ws));
      p.workspace = workspace;
      p.workspace_bytes = ws;
    }
    for (fmha::Direction dir : {fmha::Direction::forward, fmha::Direction::backward}) {
      const double ms = time_ms([&] { return dir == fmha::Direction::forward ? fmha::forward(p) : fmha::backward(p); });
      const double tflops = ms > 0 ? flops(s, dir) / (ms * 1e-3) / 1e12 : 0.0;
      const char* type = s.precision == Precision::tf32 ? "tf32" : fmha::to_string(s.dtype);
      std::printf("%-6s %-5s %-5s %5lld %6lld %5lld %4lld %-6s %-4s %10.3f %9.1f\n", s.label,
                  fmha::to_string(s.backend), type, (long long)s.batch, (long long)s.seqlen, (long long)s.heads,
                  (long long)s.head_dim, s.causal == Causal::none ? "no" : "yes", fmha::to_string(dir), ms, tflops);
      if (csv)
        std::fprintf(csv, "%s,%s,%s,%lld,%lld,%lld,%lld,%s,%s,%.4f,%.2f\n", s.label, fmha::to_string(s.backend), type,
                     (long long)s.batch, (long long)s.seqlen, (long long)s.heads, (long long)s.head_dim,
                     s.causal == Causal::none ? "none" : "bottom-right", fmha::to_string(dir), ms, tflops);
      std::fflush(stdout);
    }
    for (void* ptr : {q, k, v, dout, o, dq, dk, dv, lse, workspace})
      if (ptr) cudaFree(ptr);
  }
  if (csv) std::fclose(csv);
  return 0;
}
