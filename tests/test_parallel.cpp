// The CPU backends' parallel-for (src/common/parallel.h): every item once, workers reused across
// calls, worker indices that name one thread each, exceptions carried to the caller, nested and
// concurrent callers, one thread, and the fixed-order reduction (wait_for_turn) on the pool.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel.h"

namespace fmha {
namespace {

// Runs parallel_for and returns how often each item was visited.
std::vector<int> visits(int64_t n, int threads) {
  std::vector<std::atomic<int>> count(static_cast<size_t>(n));
  parallel_for(n, threads, [&](int, int64_t item) { count[size_t(item)].fetch_add(1); });
  std::vector<int> out;
  for (auto& c : count) out.push_back(c.load());
  return out;
}

TEST(Parallel, EveryItemOnceForAnyCountOfItemsAndThreads) {
  for (int threads : {1, 2, 3, 8})
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      const std::vector<int> v = visits(n, threads);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(v[size_t(i)], 1) << "item " << i << " of " << n << ", " << threads << " threads";
    }
}

TEST(Parallel, ManyShortCallsReuseTheSameWorkers) {
  parallel_for(4, 4, [](int, int64_t) {});  // the pool has its workers now
  const int started = pool_threads();
  EXPECT_GE(started, 1);
  std::atomic<int64_t> sum{0};
  constexpr int kCalls = 3000;
  for (int call = 0; call < kCalls; ++call)
    parallel_for(16, 4, [&](int, int64_t item) { sum.fetch_add(item + 1); });
  EXPECT_EQ(sum.load(), int64_t(kCalls) * (16 * 17 / 2));
  EXPECT_EQ(pool_threads(), started) << "a call started threads of its own";
}

TEST(Parallel, AWorkerIndexIsOneThreadAndWorkerZeroIsTheCaller) {
  for (int call = 0; call < 50; ++call) {
    std::mutex m;
    std::map<int, std::set<std::thread::id>> threads_of;
    parallel_for(200, 3, [&](int worker, int64_t) {
      const std::lock_guard<std::mutex> lock(m);
      threads_of[worker].insert(std::this_thread::get_id());
    });
    std::set<std::thread::id> all;
    for (const auto& [worker, ids] : threads_of) {
      EXPECT_GE(worker, 0);
      EXPECT_LT(worker, 3);
      EXPECT_EQ(ids.size(), 1u) << "worker " << worker << " ran on several threads";
      all.insert(ids.begin(), ids.end());
    }
    EXPECT_EQ(all.size(), threads_of.size()) << "two worker indices shared a thread";
    if (threads_of.count(0)) EXPECT_EQ(*threads_of[0].begin(), std::this_thread::get_id());
  }
}

TEST(Parallel, OneThreadRunsEveryItemOnTheCallerInOrder) {
  std::vector<int64_t> order;
  parallel_for(100, 1, [&](int worker, int64_t item) {
    EXPECT_EQ(worker, 0);
    EXPECT_EQ(std::this_thread::get_id(), std::this_thread::get_id());
    order.push_back(item);
  });
  std::vector<int64_t> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(Parallel, AnExceptionReachesTheCallerAndThePoolStillWorks) {
  for (int64_t thrower : {0, 1, 37, 199}) {
    std::atomic<int> after{0};
    EXPECT_THROW(parallel_for(200, 4,
                              [&](int, int64_t item) {
                                if (item == thrower) throw std::runtime_error("item " + std::to_string(item));
                                after.fetch_add(1);
                              }),
                 std::runtime_error);
    EXPECT_LT(after.load(), 200);
    const std::vector<int> v = visits(500, 4);
    for (int c : v) ASSERT_EQ(c, 1);
  }
  // Every item throws: one exception comes back, none is lost in a worker.
  EXPECT_THROW(parallel_for(64, 4, [](int, int64_t) { throw std::logic_error("all"); }), std::logic_error);
}

TEST(Parallel, NestedCallsRunOnTheirOwnThread) {
  std::vector<std::atomic<int>> count(20 * 30);
  parallel_for(20, 4, [&](int, int64_t outer) {
    const std::thread::id self = std::this_thread::get_id();
    parallel_for(30, 4, [&](int worker, int64_t inner) {
      EXPECT_EQ(worker, 0);
      EXPECT_EQ(std::this_thread::get_id(), self);
      count[size_t(outer * 30 + inner)].fetch_add(1);
    });
  });
  for (auto& c : count) ASSERT_EQ(c.load(), 1);
}

TEST(Parallel, ConcurrentCallersEachGetEveryItem) {
  constexpr int kCallers = 4, kCalls = 200;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCalls; ++call) {
        std::atomic<int64_t> sum{0};
        parallel_for(50 + c, 3, [&](int, int64_t item) { sum.fetch_add(item); });
        sums[size_t(c)] += sum.load();
      }
    });
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(sums[size_t(c)], int64_t(kCalls) * (50 + c) * (49 + c) / 2);
}

TEST(Parallel, FixedOrderReductionOnThePool) {
  for (int call = 0; call < 100; ++call) {
    std::atomic<int64_t> turn{0};
    std::atomic<bool> abandoned{false};
    std::vector<int64_t> order;
    parallel_for(64, 4, [&](int, int64_t item) {
      ASSERT_TRUE(wait_for_turn(turn, item, abandoned));
      order.push_back(item);
      turn.store(item + 1, std::memory_order_release);
    });
    ASSERT_EQ(order.size(), 64u);
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(order[size_t(i)], i);
  }
}

TEST(Parallel, TheCallEpochMovesWithEveryCall) {
  const uint64_t before = parallel_call_epoch();
  EXPECT_NE(before, 0u);
  parallel_for(1, 1, [](int, int64_t) {});
  const uint64_t after = parallel_call_epoch();
  EXPECT_NE(after, before);
}

}  // namespace
}  // namespace fmha
