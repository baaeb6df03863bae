// Measures this machine's fp32 FMA peak: every hardware thread runs independent chains of
// vector fused multiply-adds of the CPU path's width (cpu/simd.h: 16 lanes with AVX-512, 8 with
// AVX2; this program is compiled with -march=native) (enough chains to hide the FMA latency), and
// the GFLOP/s is the ceiling that the README compares the CPU backend's attention throughput with.
// Then its memory's read rate: every hardware thread sums its share of a buffer far larger than
// the caches (best of a few passes), the ceiling of a decoding call, which reads K and V once.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cpu/simd.h"

using fmha::cpu::peak::kLanes;
using fmha::cpu::peak::vf;

namespace {

constexpr int kChains = 12;           // independent accumulators: > FMA latency x ports
constexpr long kIterations = 50'000'000;
constexpr double kFlopsPerFma = 2.0;

float run_chains(float seed) {
  vf acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = vf{} + (seed + float(c));
  const vf a = vf{} + 0.999999f, b = vf{} + 1e-7f;
  for (long i = 0; i < kIterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
  vf sum{};
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += sum[l];
  return s;
}

constexpr size_t kReadBytes = size_t(512) << 20;  // far past any cache
constexpr int kReadPasses = 3;

// Sums n floats with kChains vector accumulators (the loads, not the additions, bound it).
float sum_floats(const float* x, size_t n) {
  vf acc[kChains] = {};
  size_t i = 0;
  for (; i + kChains * kLanes <= n; i += kChains * kLanes)
    for (int c = 0; c < kChains; ++c) {
      vf v;
      std::memcpy(&v, x + i + size_t(c) * kLanes, sizeof v);
      acc[c] += v;
    }
  vf sum{};
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += sum[l];
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

int main() {
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<float> sink{0.f};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink = sink + run_chains(float(t)); });
  for (auto& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = double(threads) * double(kIterations) * kChains * kLanes * kFlopsPerFma;
  std::printf("fp32 FMA peak: %.1f GFLOP/s on %d threads (%.1f per thread)  [checksum %g]\n", flops / seconds / 1e9,
              threads, flops / seconds / 1e9 / threads, double(sink.load()));

  // Each thread writes its own share first (its pages then sit near it), then all read.
  const size_t n = kReadBytes / sizeof(float), share = n / size_t(threads);
  std::unique_ptr<float[]> data(new float[n]);
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t)
    writers.emplace_back([&, t] { std::fill_n(data.get() + size_t(t) * share, share, 1.0f); });
  for (auto& th : writers) th.join();
  double best = 0.0;
  for (int pass = 0; pass < kReadPasses; ++pass) {
    std::vector<std::thread> readers;
    const auto r0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      readers.emplace_back([&, t] { sink = sink + sum_floats(data.get() + size_t(t) * share, share); });
    for (auto& th : readers) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    best = std::max(best, double(share * threads * sizeof(float)) / s / 1e9);
  }
  std::printf("memory read: %.1f GB/s on %d threads (best of %d passes over %zu MiB)  [checksum %g]\n", best, threads,
              kReadPasses, kReadBytes >> 20, double(sink.load()));
  return 0;
}
