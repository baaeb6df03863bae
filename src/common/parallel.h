// A minimal parallel-for for the CPU backends: dynamic scheduling of [0, n) over worker threads
// that live for one call. Exceptions thrown by a worker are rethrown on the calling thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fmha {

inline int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

inline int resolve_threads(int requested) { return requested > 0 ? requested : hardware_threads(); }

// Calls body(worker, item) for every item in [0, n); worker is in [0, workers).
// Returns the number of workers used (for sizing per-worker scratch before the call, use
// std::min(threads, n)).
template <class Body>
void parallel_for(int64_t n, int threads, Body&& body) {
  if (n <= 0) return;
  const int workers = int(std::min<int64_t>(std::max(threads, 1), n));
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) body(0, i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(worker, i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(size_t(workers - 1));
  for (int w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fmha
