// A parallel-for for the CPU backends: dynamic scheduling of [0, n) over a pool of worker threads
// that are started once and reused by every later call (a short call would otherwise spend most
// of its time starting and joining threads). Exceptions thrown by a worker are rethrown on the
// calling thread.
//
// Callers from several threads are serialised: one call runs on the pool at a time and the others
// wait for it to finish (each then gets every worker; splitting the pool between concurrent
// callers would not make the sum of their work faster on the same cores). A call made from inside
// a body (a nested call, on a worker or on the caller) runs its items on that thread alone.
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
// is in [0, workers), and a worker index names one thread for the whole call (per-thread scratch
// may be indexed by it, or kept in thread_local storage: the pool's threads live on). The calling
// thread is worker 0. Defined in src/common/parallel.cpp.
void parallel_for_each(int64_t n, int threads, ParallelBody body, void* context);

// The pool's worker threads started so far (not counting callers): a test's view of the reuse.
int pool_threads();

// Counts the parallel_for calls started so far, nested and one-thread calls included: a value
// other than the one a thread saw last tells a per-thread cache that a new call has begun.
uint64_t parallel_call_epoch();

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
