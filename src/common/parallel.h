// A minimal parallel-for for the CPU backends: dynamic scheduling of [0, n) over worker threads
// that live for one call. Exceptions thrown by a worker are rethrown on the calling thread.
//
// The threads, atomics and locks are compiled once, in src/common/parallel.cpp, for the baseline
// target: the fast CPU path is compiled once per instruction set (src/cpu/isa.h), and any inline
// function of the standard library that those compilations emitted (std::mutex::lock, say)
// would be one symbol that the linker keeps from whichever object comes first, AVX-512 code
// included. The template below only forwards to it through a function pointer.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>

namespace fmha {

inline int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

inline int resolve_threads(int requested) { return requested > 0 ? requested : hardware_threads(); }

using ParallelBody = void (*)(void* context, int worker, int64_t item);

// Calls body(context, worker, item) for every item in [0, n) on min(threads, n) workers; worker
// is in [0, workers). Defined in src/common/parallel.cpp.
void parallel_for_each(int64_t n, int threads, ParallelBody body, void* context);

// Waits, yielding the core, until `turn` reaches `mine` (true) or `abandoned` is set (false): an
// item's turn in a fixed-order reduction. Deadlock-free inside parallel_for when `mine` counts the
// items of one reduction in the order parallel_for hands them out, since a waiting worker only
// waits for items handed out before its own. Defined in src/common/parallel.cpp.
bool wait_for_turn(const std::atomic<int64_t>& turn, int64_t mine, const std::atomic<bool>& abandoned);

// Calls body(worker, item) for every item in [0, n); worker is in [0, min(threads, n)).
template <class Body>
void parallel_for(int64_t n, int threads, Body&& body) {
  using Callable = std::remove_reference_t<Body>;
  parallel_for_each(
      n, threads, [](void* context, int worker, int64_t item) { (*static_cast<Callable*>(context))(worker, item); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace fmha
