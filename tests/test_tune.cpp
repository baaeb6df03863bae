// Tuning on the CPU (include/fmha/tune.h): the cache's round trip and its failure modes (corrupt
// and foreign-version files, concurrent writers), the order in which a call's variant is chosen
// (variable > cache > default), the tuner's refusal of a candidate that disagrees with the
// default, and autotuning. Every test points FMHA_TUNE_CACHE at a file of its own.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fmha/fmha.h"
#include "fmha/tune.h"
#include "tune/cache.h"
#include "tune/class.h"
#include "tune/tuner.h"

namespace fmha {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Sets (or unsets) an environment variable until the end of the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = getenv(name)) previous_ = old, had_ = true;
    if (value.empty()) unsetenv(name);
    else setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, previous_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string previous_;
  bool had_ = false;
};

// A cache file of the test's own, empty at the start; the process forgets any cache it read.
class TuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fmha_tune_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    path_ = (dir_ / "sub" / "tune.json").string();  // a directory the cache must create
    env_ = std::make_unique<ScopedEnv>(detail::kCacheVariable, path_);
    no_config_ = std::make_unique<ScopedEnv>("FMHA_CPU_CONFIG", "");
    detail::reload_tune_cache();
  }
  void TearDown() override {
    detail::set_test_candidate(std::nullopt);
    set_autotune(false);
    env_.reset();
    no_config_.reset();
    detail::reload_tune_cache();
    fs::remove_all(dir_);
  }
  Json read_cache() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return Json::parse(text.str());  // throws (fails the test) on a torn or corrupt file
  }
  void write_file(const std::string& text) const {
    fs::create_directories(fs::path(path_).parent_path());
    std::ofstream(path_) << text;
  }

  fs::path dir_;
  std::string path_;
  std::unique_ptr<ScopedEnv> env_, no_config_;
};

// A small CPU call with real buffers (the forward's outputs; the tuner allocates its own).
struct SmallCall {
  static constexpr int64_t B = 1, S = 200, H = 2, D = 32;
  std::vector<float> q = std::vector<float>(B * S * H * D, 0.25f), o = q, lse = std::vector<float>(B * H * S);
  Params p;
  SmallCall() {
    p.q = make_tensor(q.data(), DType::fp32, {B, S, H, D});
    p.k = p.v = p.q;
    p.o = make_tensor(o.data(), DType::fp32, {B, S, H, D});
    p.lse = make_tensor(lse.data(), DType::fp32, {B, H, S});
    p.backend = Backend::cpu;
  }
  std::string class_key() const {
    ProblemClass c;
    EXPECT_TRUE(problem_class(p, Direction::forward, &c).ok());
    return c.key();
  }
  std::string device() const { return detail::device_key(Device{}); }
  VariantChoice choice() const {
    VariantChoice c;
    const Status s = selected_variant(p, Direction::forward, &c);
    EXPECT_TRUE(s.ok()) << s.message;
    return c;
  }
};

detail::CacheEntry entry(const std::string& variant) {
  detail::CacheEntry e;
  e.variant = variant;
  e.default_variant = "k2048";
  e.ms = 1.0;
  e.default_ms = 2.0;
  e.timings = {{"k2048", 2.0}, {variant, 1.0}};
  return e;
}

TEST(ProblemClassKey, NamesTierDirectionTypeDimsMaskGroupAndBuckets) {
  std::vector<uint16_t> data(64 * 2 * 200 * 8 * 4);
  Params p;
  p.q = make_tensor(data.data(), DType::bf16, {2, 100, 8, 64});
  p.k = p.v = make_tensor(data.data(), DType::bf16, {2, 1000, 2, 64});
  p.o = p.dout = p.dq = p.q;
  p.dk = p.dv = p.k;
  p.lse = make_tensor(data.data(), DType::fp32, {2, 8, 100});
  p.backend = Backend::cpu;
  ProblemClass c;
  ASSERT_TRUE(problem_class(p, Direction::forward, &c).ok());
  EXPECT_EQ(c.key(), "cpu fwd bf16 d64 none g4 q128 k1024");
  p.causal = Causal::bottom_right;
  ASSERT_TRUE(problem_class(p, Direction::backward, &c).ok());
  EXPECT_EQ(c.key(), "cpu bwd bf16 d64 causal g4 q128 k1024");
  p.causal = Causal::none;
  p.window_left = 16;
  p.deterministic = true;
  p.q = make_tensor(data.data(), DType::bf16, {2, 1, 8, 64});  // shorter than a tile: the smallest bucket
  p.o = p.dout = p.dq = p.q;
  p.lse = make_tensor(data.data(), DType::fp32, {2, 8, 1});
  ASSERT_TRUE(problem_class(p, Direction::backward, &c).ok());
  EXPECT_EQ(c.key(), "cpu bwd bf16 d64 window g4 q64 k1024 deterministic");
  // Shapes alone are enough: the data of q, k and v may be null.
  Params shapes = p;
  shapes.q.data = shapes.k.data = shapes.v.data = nullptr;
  ASSERT_TRUE(problem_class(shapes, Direction::backward, &c).ok());
  // A bad call is refused, naming the argument.
  p.k = p.v = make_tensor(data.data(), DType::bf16, {2, 1000, 3, 64});
  const Status s = problem_class(p, Direction::forward, &c);
  EXPECT_EQ(s.code, Code::invalid_argument);
  EXPECT_NE(s.message.find("kv_heads"), std::string::npos) << s.message;
}

// The sm80 tier's decode-kernel calls (a KV cache, or at most 16 queries in fp16/bf16) are a
// class of their own: their variants are split counts, not the dense kernels' configurations.
TEST(ProblemClassKey, DecodeKernelCallsOfTheSm80TierAreTheirOwnClass) {
  Params p;  // shapes only
  p.q = p.o = make_tensor(nullptr, DType::bf16, {2, 1, 32, 128});
  p.k = p.v = make_tensor(nullptr, DType::bf16, {2, 8192, 8, 128});
  // 2 sequences · 8 KV heads · one tile of 4 packed rows: 16 CTAs before splitting.
  EXPECT_EQ(detail::class_of(Backend::cuda_sm80, p, Direction::forward).key(),
            "sm80 fwd bf16 d128 none g4 q64 k8192 decode b16");
  Params more = p;  // 20 sequences: 160 CTAs, up to 256
  more.q = more.o = make_tensor(nullptr, DType::bf16, {20, 1, 32, 128});
  more.k = more.v = make_tensor(nullptr, DType::bf16, {20, 8192, 8, 128});
  EXPECT_EQ(detail::class_of(Backend::cuda_sm80, more, Direction::forward).key(),
            "sm80 fwd bf16 d128 none g4 q64 k8192 decode b256");
  EXPECT_FALSE(detail::class_of(Backend::cuda_sm90, p, Direction::forward).decode);
  EXPECT_FALSE(detail::class_of(Backend::cpu, p, Direction::forward).decode);
  EXPECT_FALSE(detail::class_of(Backend::cuda_sm80, p, Direction::backward).decode);
  Params longer = p;  // 64 queries: the dense kernels, in the same buckets
  longer.q = longer.o = make_tensor(nullptr, DType::bf16, {2, 64, 32, 128});
  EXPECT_EQ(detail::class_of(Backend::cuda_sm80, longer, Direction::forward).key(),
            "sm80 fwd bf16 d128 none g4 q64 k8192");
  Params paged = longer;  // on a KV cache, every query count takes the decode kernel
  paged.k = paged.v = make_tensor(nullptr, DType::bf16, {256, 64, 8, 128});
  paged.block_table = make_tensor(nullptr, DType::int32, {2, 128});
  paged.cache_seqlens = make_tensor(nullptr, DType::int32, {2});
  // 64 queries · 4 heads a KV head = 256 packed rows: 16 tiles, · 2 · 8 = 256 CTAs.
  EXPECT_EQ(detail::class_of(Backend::cuda_sm80, paged, Direction::forward).key(),
            "sm80 fwd bf16 d128 none g4 q64 k8192 decode b256");
}

TEST_F(TuneTest, CacheRoundTrip) {
  const SmallCall call;
  EXPECT_EQ(call.choice().source, "default");
  ASSERT_TRUE(detail::store_in_cache(call.device(), call.class_key(), entry("k512")).ok());
  // This process sees its own winner at once...
  EXPECT_EQ(call.choice().variant, "k512");
  // ...and another one (a fresh read of the file) too.
  detail::reload_tune_cache();
  const VariantChoice c = call.choice();
  EXPECT_EQ(c.variant, "k512");
  EXPECT_EQ(c.source, "cache");
  const Json j = read_cache();
  EXPECT_EQ(j["format"], detail::kCacheFormat);
  EXPECT_EQ(j["version"], detail::kCacheVersion);
  const Json& e = j["devices"][call.device()][call.class_key()];
  EXPECT_EQ(e["variant"], "k512");
  EXPECT_EQ(e["default"], "k2048");
  EXPECT_DOUBLE_EQ(e["timings"]["k2048"].get<double>(), 2.0);
  // No temporary file is left next to the cache.
  for (const auto& f : fs::directory_iterator(fs::path(path_).parent_path()))
    EXPECT_EQ(f.path().string().find(".tmp."), std::string::npos) << f.path();
  // Cleared: the file is gone and calls run the default.
  ASSERT_TRUE(clear_tune_cache().ok());
  EXPECT_FALSE(fs::exists(path_));
  EXPECT_EQ(call.choice().source, "default");
}

TEST_F(TuneTest, CorruptOrUnreadableCacheIsIgnoredWithOneWarning) {
  const SmallCall call;
  for (const std::string& text : {std::string("{\"format\": \"fmha-tune-cache\", \"version\": 1, \"devi"),
                                  std::string("[1, 2, 3]"), std::string("\x01\x02 not json")}) {
    write_file(text);
    detail::reload_tune_cache();
    ::testing::internal::CaptureStderr();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(call.choice().variant, "k2048");
    SmallCall run;
    EXPECT_TRUE(forward(run.p).ok());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("ignoring the tuning cache"), std::string::npos) << err;
    EXPECT_EQ(err.find("ignoring", err.find("ignoring") + 1), std::string::npos) << "one warning only: " << err;
  }
  // A directory where the file should be: unreadable, ignored too.
  fs::remove(path_);
  fs::create_directories(path_);
  detail::reload_tune_cache();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(call.choice().variant, "k2048");
  ::testing::internal::GetCapturedStderr();
  fs::remove_all(path_);
  // The next tuner replaces a corrupt file with a valid one.
  write_file("garbage");
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(detail::store_in_cache(call.device(), call.class_key(), entry("c2")).ok());
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(read_cache()["devices"][call.device()][call.class_key()]["variant"], "c2");
}

TEST_F(TuneTest, ForeignVersionsAreNotUsed) {
  const SmallCall call;
  // Another format version of the file: ignored with a warning.
  Json other = {{"format", detail::kCacheFormat},
                {"version", detail::kCacheVersion + 1},
                {"devices", {{call.device(), {{call.class_key(), {{"variant", "k512"}}}}}}}};
  write_file(other.dump());
  detail::reload_tune_cache();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(call.choice().variant, "k2048");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("format version"), std::string::npos) << err;
  // Winners of another fmha version (or another CPU path, another GPU) sit under another device
  // key: silently not used, and kept when this process writes its own.
  std::string foreign = call.device();
  foreign.replace(foreign.find(version()), std::strlen(version()), "0.0.1-other");
  Json mine = {{"format", detail::kCacheFormat},
               {"version", detail::kCacheVersion},
               {"devices", {{foreign, {{call.class_key(), {{"variant", "k512"}}}}}}}};
  write_file(mine.dump());
  detail::reload_tune_cache();
  EXPECT_EQ(call.choice().source, "default");
  ASSERT_TRUE(detail::store_in_cache(call.device(), "cpu fwd fp32 d32 none g1 q64 k64", entry("c16")).ok());
  const Json j = read_cache();
  EXPECT_EQ(j["devices"][foreign][call.class_key()]["variant"], "k512");
  // A cached name this build does not have runs the default, without an error.
  ASSERT_TRUE(detail::store_in_cache(call.device(), call.class_key(), entry("no-such-variant")).ok());
  EXPECT_EQ(call.choice().variant, "k2048");
  SmallCall run;
  EXPECT_TRUE(forward(run.p).ok());
}

TEST_F(TuneTest, ConcurrentWritersNeverTearTheFileNorLoseAWinner) {
  const std::string device = SmallCall().device();
  constexpr int kProcesses = 2, kThreads = 3, kWrites = 15;
  auto key = [](int writer, int i) { return "cpu fwd fp32 d64 none g1 q" + std::to_string(writer) + " k" + std::to_string(i); };
  // Two processes, each with three threads, write at once while this one reads the file.
  std::vector<pid_t> children;
  for (int proc = 0; proc < kProcesses; ++proc) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::vector<std::thread> threads;
      bool ok = true;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
          for (int i = 0; i < kWrites; ++i)
            ok = detail::store_in_cache(device, key(proc * kThreads + t, i), entry("k1024")).ok() && ok;
        });
      for (auto& t : threads) t.join();
      _exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  int parsed = 0;
  for (bool running = true; running;) {
    running = false;
    for (pid_t pid : children) running = running || waitpid(pid, nullptr, WNOHANG) == 0;
    if (fs::exists(path_)) {
      EXPECT_NO_THROW(read_cache());
      ++parsed;
    }
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
  }
  const Json j = read_cache();
  int found = 0;
  for (int w = 0; w < kProcesses * kThreads; ++w)
    for (int i = 0; i < kWrites; ++i) found += j["devices"][device].contains(key(w, i));
  EXPECT_EQ(found, kProcesses * kThreads * kWrites) << "a writer's winner was lost";
  EXPECT_GT(parsed, 0);
}

TEST_F(TuneTest, OverrideOrderIsVariableThenCacheThenDefault) {
  SmallCall call;
  EXPECT_EQ(call.choice().variant, "k2048");
  EXPECT_EQ(call.choice().source, "default");
  ASSERT_TRUE(detail::store_in_cache(call.device(), call.class_key(), entry("k512")).ok());
  EXPECT_EQ(call.choice().variant, "k512");
  EXPECT_EQ(call.choice().source, "cache");
  {
    ScopedEnv force("FMHA_CPU_CONFIG", "c16");
    EXPECT_EQ(call.choice().variant, "c16");
    EXPECT_EQ(call.choice().source, "variable");
    EXPECT_TRUE(forward(call.p).ok());
  }
  {
    ScopedEnv force("FMHA_CPU_CONFIG", "no-such-variant");
    const Status s = forward(call.p);
    EXPECT_EQ(s.code, Code::invalid_argument);
    EXPECT_NE(s.message.find("FMHA_CPU_CONFIG=no-such-variant"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("k2048"), std::string::npos) << "lists the names: " << s.message;
  }
  // The cached winner is for this class only.
  SmallCall other;
  other.p.causal = Causal::top_left;
  EXPECT_EQ(other.choice().source, "default");
  ASSERT_TRUE(clear_tune_cache().ok());
  EXPECT_EQ(call.choice().variant, "k2048");
}

TEST_F(TuneTest, TunerTimesEveryVariantAndCachesTheFastest) {
  SmallCall call;
  TuneOptions options;
  options.iters = 2;
  options.warmup = 0;
  std::vector<std::string> progress;
  options.progress = [&](int done, int total, const std::string& v) {
    EXPECT_LE(done, total);
    progress.push_back(v);
  };
  TuneResult r;
  const Status s = tune(call.p, Direction::forward, options, &r);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(r.problem.key(), call.class_key());
  EXPECT_EQ(r.default_variant, "k2048");
  ASSERT_EQ(r.variants.size(), 6u);
  EXPECT_EQ(progress.size(), 7u);
  const VariantTiming* fastest = nullptr;
  for (const VariantTiming& v : r.variants) {
    EXPECT_TRUE(v.agrees) << v.variant << ": " << v.status;
    EXPECT_GT(v.ms, 0.0) << v.variant;
    EXPECT_LE(v.difference, 1e-5) << v.variant;
    if (!fastest || v.ms < fastest->ms) fastest = &v;
  }
  // The fastest, unless it beats the default by too little to be more than noise.
  EXPECT_TRUE(r.winner == fastest->variant || (r.winner == "k2048" && fastest->ms > 0.98 * r.default_ms)) << r.winner;
  EXPECT_EQ(read_cache()["devices"][r.device][r.problem.key()]["variant"], r.winner);
  EXPECT_EQ(call.choice().variant, r.winner);
  // A dry run writes nothing.
  ASSERT_TRUE(clear_tune_cache().ok());
  options.write_cache = false;
  ASSERT_TRUE(tune(call.p, Direction::backward, options, &r).ok());
  EXPECT_FALSE(fs::exists(path_));
  EXPECT_EQ(r.problem.direction, Direction::backward);
  // The oracle has no variants.
  call.p.backend = Backend::reference;
  EXPECT_EQ(tune(call.p, Direction::forward, options, &r).code, Code::unsupported);
}

// A packed call is tuned as the dense batch of its longest sequences: its own class.
// One quick tuning of p's forward (one timed run, nothing cached), which must succeed and land
// in the class problem_class gives p.
void tune_once_in_its_class(const Params& p, TuneResult* r) {
  TuneOptions options;
  options.iters = 1;
  options.warmup = 0;
  options.write_cache = false;
  const Status s = tune(p, Direction::forward, options, r);
  ASSERT_TRUE(s.ok()) << s.message;
  ProblemClass expected;
  ASSERT_TRUE(problem_class(p, Direction::forward, &expected).ok());
  EXPECT_EQ(r->problem.key(), expected.key());
}

TEST_F(TuneTest, APackedCallTunesItsClass) {
  constexpr int64_t kHeads = 2, kDim = 32;
  const std::vector<int32_t> cu = {0, 40, 41, 141};
  std::vector<float> q(size_t(141 * kHeads * kDim)), o(q.size()), lse(size_t(kHeads * 141));
  Params p;
  p.q = make_tensor(q.data(), DType::fp32, {141, kHeads, kDim});
  p.k = p.v = p.q;
  p.o = make_tensor(o.data(), DType::fp32, {141, kHeads, kDim});
  p.lse = make_tensor(lse.data(), DType::fp32, {kHeads, 141});
  p.cu_seqlens_q = p.cu_seqlens_k = make_tensor(const_cast<int32_t*>(cu.data()), DType::int32, {4});
  p.max_seqlen_q = p.max_seqlen_k = 100;
  p.backend = Backend::cpu;
  TuneResult r;
  ASSERT_NO_FATAL_FAILURE(tune_once_in_its_class(p, &r));
  EXPECT_FALSE(r.winner.empty());
}

// A call on a paged KV cache tunes as the call on a contiguous cache of its capacity (the
// caller's pages and table are not read): same class, every variant run and compared.
TEST_F(TuneTest, APagedCallTunesAsItsContiguousCache) {
  constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kDim = 32, kPage = 16, kPagesPerSeq = 5;
  std::vector<float> q(size_t(kBatch * kHeads * kDim)), o(q.size()), lse(size_t(kBatch * kHeads));
  std::vector<float> cache(size_t(3 * kPage * kKvHeads * kDim));  // a pool smaller than batch · pages
  const std::vector<int32_t> table = {2, 0, 1, 2, 0, 1, 1, 0, 2, 2}, lengths = {70, 33};
  Params p;
  p.q = make_tensor(q.data(), DType::fp32, {kBatch, 1, kHeads, kDim});
  p.k = p.v = make_tensor(cache.data(), DType::fp32, {3, kPage, kKvHeads, kDim});
  p.o = make_tensor(o.data(), DType::fp32, {kBatch, 1, kHeads, kDim});
  p.lse = make_tensor(lse.data(), DType::fp32, {kBatch, kHeads, 1});
  p.block_table = make_tensor(const_cast<int32_t*>(table.data()), DType::int32, {kBatch, kPagesPerSeq});
  p.cache_seqlens = make_tensor(const_cast<int32_t*>(lengths.data()), DType::int32, {kBatch});
  p.causal = Causal::bottom_right;
  p.backend = Backend::cpu;
  ASSERT_TRUE(forward(p).ok()) << "a valid call";
  TuneResult r;
  ASSERT_NO_FATAL_FAILURE(tune_once_in_its_class(p, &r));
  EXPECT_EQ(r.problem.seqlen_k_bucket, 128) << "the capacity, 5 pages of 16";
  int agreed = 0;
  for (const VariantTiming& v : r.variants) agreed += v.agrees;
  EXPECT_EQ(agreed, int(r.variants.size())) << "every CPU variant runs the cache";
  EXPECT_FALSE(r.winner.empty());
}

TEST_F(TuneTest, ACandidateThatDisagreesOrFailsIsNeverChosen) {
  SmallCall call;
  // Fastest of all (it computes nothing) and wrong: zeros for O.
  detail::set_test_candidate(detail::TestCandidate{"wrong-but-fast", [](const Params& p, Direction) {
                                                     std::memset(p.o.data, 0, size_t(p.o.numel()) * sizeof(float));
                                                     std::memset(p.lse.data, 0, size_t(p.lse.numel()) * sizeof(float));
                                                     return Status::success();
                                                   }});
  TuneOptions options;
  options.iters = 1;
  options.warmup = 0;
  TuneResult r;
  ASSERT_TRUE(tune(call.p, Direction::forward, options, &r).ok());
  ASSERT_EQ(r.variants.size(), 7u);
  const VariantTiming& wrong = r.variants.back();
  EXPECT_EQ(wrong.variant, "wrong-but-fast");
  EXPECT_FALSE(wrong.agrees);
  EXPECT_NE(wrong.status.find("disagrees"), std::string::npos) << wrong.status;
  EXPECT_NE(r.winner, "wrong-but-fast");
  EXPECT_NE(read_cache()["devices"][r.device][r.problem.key()]["variant"], "wrong-but-fast");
  EXPECT_FALSE(read_cache()["devices"][r.device][r.problem.key()]["timings"].contains("wrong-but-fast"));

  // One that fails outright.
  detail::set_test_candidate(detail::TestCandidate{
      "broken", [](const Params&, Direction) { return Status{Code::internal, "launch failed"}; }});
  ASSERT_TRUE(tune(call.p, Direction::forward, options, &r).ok());
  EXPECT_EQ(r.variants.back().status, "failed: launch failed");
  EXPECT_NE(r.winner, "broken");
  // One that is slightly off (a 5 % error in O) is caught too, not only gross errors.
  detail::set_test_candidate(detail::TestCandidate{"slightly-off", [](const Params& p, Direction) {
                                                     const Status s = forward(p);
                                                     float* o = static_cast<float*>(p.o.data);
                                                     for (int64_t i = 0; i < p.o.numel(); ++i) o[i] *= 1.05f;
                                                     return s;
                                                   }});
  ASSERT_TRUE(tune(call.p, Direction::forward, options, &r).ok());
  EXPECT_FALSE(r.variants.back().agrees) << r.variants.back().status;
  EXPECT_NE(r.winner, "slightly-off");
}

TEST_F(TuneTest, AutotuneTunesTheFirstCallOfAnUntunedClassOnly) {
  SmallCall call;
  EXPECT_FALSE(autotune_enabled());
  ASSERT_TRUE(forward(call.p).ok());
  EXPECT_FALSE(fs::exists(path_)) << "off by default";
  set_autotune(true);
  ASSERT_TRUE(forward(call.p).ok());
  ASSERT_TRUE(fs::exists(path_));
  const Json first = read_cache();
  ASSERT_TRUE(first["devices"][call.device()].contains(call.class_key()));
  EXPECT_EQ(call.choice().source, "cache");
  // A second call of the class does not tune again.
  const auto written = fs::last_write_time(path_);
  ASSERT_TRUE(forward(call.p).ok());
  EXPECT_EQ(fs::last_write_time(path_), written);
}

}  // namespace
}  // namespace fmha
