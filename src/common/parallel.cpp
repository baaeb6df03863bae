// See parallel.h.
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <vector>

namespace fmha {

void parallel_for_each(int64_t n, int threads, ParallelBody body, void* context) {
  if (n <= 0) return;
  const int workers = int(std::min<int64_t>(std::max(threads, 1), n));
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) body(context, 0, i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(context, worker, i);
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

bool wait_for_turn(const std::atomic<int64_t>& turn, int64_t mine, const std::atomic<bool>& abandoned) {
  while (turn.load(std::memory_order_acquire) != mine) {
    if (abandoned.load(std::memory_order_relaxed)) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace fmha
