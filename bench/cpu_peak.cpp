// Measures this machine's fp32 FMA peak: every hardware thread runs independent chains of
// 16-wide fused multiply-adds (enough chains to hide the FMA latency), and the GFLOP/s is the
// ceiling that the README compares the CPU backend's attention throughput with.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

using v16f = float __attribute__((vector_size(64)));

namespace {

constexpr int kChains = 12;           // independent accumulators: > FMA latency x ports
constexpr long kIterations = 50'000'000;
constexpr double kFlopsPerFma = 2.0;
constexpr int kLanes = 16;

float run_chains(float seed) {
  v16f acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = v16f{} + (seed + float(c));
  const v16f a = v16f{} + 0.999999f, b = v16f{} + 1e-7f;
  for (long i = 0; i < kIterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
  v16f sum{};
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
