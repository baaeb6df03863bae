// Measures this machine's fp32 FMA peak: every hardware thread runs independent chains of
// vector fused multiply-adds of the CPU path's width (cpu/simd.h: 16 lanes with AVX-512, 8 with
// AVX2; this program is compiled with -march=native) (enough chains to hide the FMA latency), and
// the GFLOP/s is the ceiling that the README compares the CPU backend's attention throughput with.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
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
  return 0;
}
