// See parallel.h. One process-wide pool: worker threads started on first need, kept for later
// calls, and woken for each call by a generation counter they spin on briefly before they sleep
// on a condition variable.
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace fmha {
namespace {

// How long a waiting thread spins before it sleeps: about as long as a short call's items take
// (tens of microseconds), so that back-to-back calls find the workers awake, but short against a
// scheduler time slice, so that an idle pool leaves a busy machine's cores to others.
// A pool with more threads than the machine has (a call asked for more) does not spin at all: a
// spinning thread would then keep a working one off its core.
constexpr int kSpinRounds = 2000;  // pause instructions, ~10-140 cycles each depending on the CPU
// More workers than this are not started, whatever a call asks for (results do not depend on the
// thread count: the backends cut their work by the machine's thread count, not the call's).
constexpr int kMaxPoolThreads = 256;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

thread_local bool t_inside_call = false;  // this thread runs a body now: a nested call runs inline
std::atomic<uint64_t> g_epoch{0};

void run_inline(int64_t n, ParallelBody body, void* context) {
  const bool outer = t_inside_call;
  t_inside_call = true;
  try {
    for (int64_t i = 0; i < n; ++i) body(context, 0, i);
  } catch (...) {
    t_inside_call = outer;
    throw;
  }
  t_inside_call = outer;
}

// A call is open while its caller takes items, and closed once every item has been handed out;
// it returns when no worker is inside it any more. A worker enters (counted by `active_`) before
// it looks whether a call is open and leaves after its last item: the caller waits for the
// workers that took part, never for one that was slow to wake (on a busy machine that can be a
// time slice or more), and rewrites the job only when none is inside.
class Pool {
 public:
  void run(int64_t n, int threads, ParallelBody body, void* context) {
    const std::lock_guard<std::mutex> one_call_at_a_time(call_mutex_);
    grow(threads - 1);
    job_ = Job{n, std::min(threads, int(workers_.size()) + 1), body, context};
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    {
      const std::lock_guard<std::mutex> lock(wake_mutex_);
      open_.store(true, std::memory_order_seq_cst);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    work(0);
    open_.store(false, std::memory_order_seq_cst);
    const int spin_rounds = spin_rounds_.load(std::memory_order_relaxed);
    for (int i = 0; i < spin_rounds && active_.load(std::memory_order_seq_cst) != 0; ++i) cpu_relax();
    if (active_.load(std::memory_order_seq_cst) != 0) {
      std::unique_lock<std::mutex> lock(wake_mutex_);
      done_.wait(lock, [&] { return active_.load(std::memory_order_seq_cst) == 0; });
    }
    if (error_) {
      std::exception_ptr error = error_;
      error_ = nullptr;
      std::rethrow_exception(error);
    }
  }

  int threads() {
    const std::lock_guard<std::mutex> lock(call_mutex_);
    return int(workers_.size());
  }

 private:
  struct Job {
    int64_t n = 0;
    int workers = 0;  // workers 0 (the caller) .. workers - 1 take items
    ParallelBody body = nullptr;
    void* context = nullptr;
  };

  // Starts workers until there are `count` (between calls). A thread the system refuses leaves
  // the pool smaller; calls then run on the workers there are.
  void grow(int count) {
    count = std::min(count, kMaxPoolThreads);
    while (int(workers_.size()) < count) {
      const int index = int(workers_.size()) + 1;
      const uint64_t seen = generation_.load(std::memory_order_acquire);
      try {
        workers_.emplace_back([this, index, seen] { worker_loop(index, seen); });
      } catch (const std::system_error&) {
        break;
      }
    }
    spin_rounds_.store(int(workers_.size()) < hardware_threads() ? kSpinRounds : 0, std::memory_order_relaxed);
  }

  // Takes items until there are none left; the first exception stops the call's other workers.
  void work(int worker) {
    t_inside_call = true;
    try {
      for (int64_t i = next_.fetch_add(1); i < job_.n; i = next_.fetch_add(1)) job_.body(job_.context, worker, i);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      next_.store(job_.n);
    }
    t_inside_call = false;
  }

  void worker_loop(int index, uint64_t seen) {
    for (;;) {
      uint64_t generation = 0;
      for (int spins = 0; (generation = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
        if (spins < spin_rounds_.load(std::memory_order_relaxed)) {
          cpu_relax();
          continue;
        }
        std::unique_lock<std::mutex> lock(wake_mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation;
      active_.fetch_add(1, std::memory_order_seq_cst);
      // Open: the job is the current call's and stays so until this worker leaves.
      if (open_.load(std::memory_order_seq_cst) && index < job_.workers) work(index);
      if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
        const std::lock_guard<std::mutex> lock(wake_mutex_);
        done_.notify_one();
      }
    }
  }

  std::mutex call_mutex_;  // held by the call that runs
  std::vector<std::thread> workers_;  // worker i + 1 of every call
  Job job_;
  std::atomic<int64_t> next_{0};  // the next item to hand out
  std::atomic<bool> open_{false};  // a call hands out items
  std::atomic<int> active_{0};     // workers inside the call
  std::atomic<uint64_t> generation_{0};  // one more for every call
  std::atomic<int> spin_rounds_{kSpinRounds};  // kSpinRounds, or 0 when the pool outnumbers the cores
  std::mutex wake_mutex_;
  std::condition_variable wake_, done_;  // workers sleep on wake_, the caller on done_
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// The pool is never destroyed: its workers sleep until the process ends, and a static
// destructor (or another thread at exit) may still call in. A child process made by fork() has
// none of the parent's threads: it starts a pool of its own on first need.
std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mutex;

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  const std::lock_guard<std::mutex> lock(g_pool_mutex);
  p = g_pool.load(std::memory_order_acquire);
  if (!p) {
    static const bool registered = [] {
#if defined(__unix__) || defined(__APPLE__)
      pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr, std::memory_order_release); });
#endif
      return true;
    }();
    (void)registered;
    p = new Pool;
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

void parallel_for_each(int64_t n, int threads, ParallelBody body, void* context) {
  g_epoch.fetch_add(1, std::memory_order_relaxed);
  if (n <= 0) return;
  const int workers = int(std::min<int64_t>(std::max(threads, 1), n));
  if (workers == 1 || t_inside_call) return run_inline(n, body, context);
  pool().run(n, workers, body, context);
}

int pool_threads() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  return p ? p->threads() : 0;
}

uint64_t parallel_call_epoch() { return g_epoch.load(std::memory_order_relaxed) + 1; }

bool wait_for_turn(const std::atomic<int64_t>& turn, int64_t mine, const std::atomic<bool>& abandoned) {
  while (turn.load(std::memory_order_acquire) != mine) {
    if (abandoned.load(std::memory_order_relaxed)) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace fmha
