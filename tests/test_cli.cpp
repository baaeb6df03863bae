// The CLI's contract: exit codes (0 ok, 1 check failed, 2 bad flags or invalid call), errors on
// stderr, and the JSON keys that scripts rely on.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
};

// Runs `fmha <args>`; `environment` (e.g. "FMHA_CPU_ISA=avx2") is set for that run only.
Result fmha(const std::string& args, bool capture_stderr = false, const std::string& environment = "") {
  const std::string cmd = (environment.empty() ? "" : "env " + environment + " ") + std::string(FMHA_CLI_PATH) + " " +
                          args + (capture_stderr ? " 2>&1" : " 2>/dev/null");
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Cli, InfoListsBackendsAndDevices) {
  const Result r = fmha("info --json");
  ASSERT_EQ(r.exit_code, 0);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.contains("version"));
  EXPECT_NE(std::find(j["backends"].begin(), j["backends"].end(), "cpu"), j["backends"].end());
  EXPECT_EQ(j["devices"][0]["device"], "cpu");
  EXPECT_EQ(fmha("info").exit_code, 0);
}

TEST(Cli, InfoAndRunNameTheCpuPathThatRuns) {
  const auto info = nlohmann::json::parse(fmha("info --json").out);
  const auto& cpu = info["devices"][0];
  ASSERT_TRUE(cpu.contains("cpu_path")) << cpu.dump();
  const auto& runnable = cpu["cpu_paths_runnable"];
  ASSERT_FALSE(runnable.empty());
  // The default is the fastest path this CPU runs that it does not pass over (one that measured
  // slower here than the path before it; `info` says why).
  std::vector<std::string> passed_over;
  if (cpu.contains("cpu_paths_passed_over"))
    for (const auto& line : cpu["cpu_paths_passed_over"]) {
      const std::string why = line.get<std::string>();
      passed_over.push_back(why.substr(0, why.find(':')));
      // Each process measures anew: the path's name, not the rates, is the same in both.
      EXPECT_NE(fmha("info").out.find("passed over: " + passed_over.back() + ": "), std::string::npos) << why;
    }
  std::string expected;
  for (const auto& path : runnable)
    if (std::find(passed_over.begin(), passed_over.end(), path.get<std::string>()) == passed_over.end())
      expected = path.get<std::string>();
  EXPECT_EQ(cpu["cpu_path"], expected) << "the fastest path this CPU runs (and does not pass over) is the default";
  EXPECT_NE(fmha("info").out.find("cpu path in use: " + cpu["cpu_path"].get<std::string>()), std::string::npos);
  for (const auto& path : runnable) {
    const std::string force = "FMHA_CPU_ISA=" + path.get<std::string>();
    EXPECT_EQ(nlohmann::json::parse(fmha("info --json", false, force).out)["devices"][0]["cpu_path"], path);
    const Result r = fmha("run --backend cpu --batch 1 --heads 2 --seqlen-q 70 --iters 1 --check --json", false, force);
    ASSERT_EQ(r.exit_code, 0) << force;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["cpu_path"], path);
    EXPECT_EQ(j["check"], "pass");
  }
}

TEST(Cli, AForcedCpuPathThatCannotRunIsRefused) {
  const auto info = nlohmann::json::parse(fmha("info --json", false, "FMHA_CPU_ISA=avx1024").out);
  EXPECT_EQ(info["devices"][0]["cpu_path"], "");
  EXPECT_NE(info["devices"][0]["cpu_path_error"].get<std::string>().find("FMHA_CPU_ISA=avx1024"), std::string::npos);
  const Result r = fmha("run --backend cpu --batch 1 --seqlen-q 64 --iters 1", true, "FMHA_CPU_ISA=avx1024");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("FMHA_CPU_ISA=avx1024: not a CPU path"), std::string::npos) << r.out;
}

TEST(Cli, RunCheckJsonHasTheDocumentedKeys) {
  for (const char* mode : {"fwd", "bwd"}) {
    const Result r = fmha(std::string("run --backend cpu --batch 2 --heads 4 --kv-heads 2 --seqlen-q 70 --seqlen-k 90 "
                                      "--head-dim 32 --head-dim-v 48 --dtype bf16 --causal bottom-right --window 20,0 "
                                      "--q-offset 3 --iters 2 --seed 5 --check --json --mode ") + mode);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    for (const char* key : {"backend", "device", "dtype", "mode", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k",
                            "head_dim", "head_dim_v", "causal", "ms", "tflops", "check", "max_abs_err", "rel_err"})
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j["check"], "pass");
    EXPECT_EQ(j["mode"], mode);
    EXPECT_EQ(j["dtype"], "bf16");
    EXPECT_EQ(j["kv_heads"], 2);
    EXPECT_EQ(j["head_dim_v"], 48);
    EXPECT_EQ(j["causal"], "bottom-right");
    EXPECT_GT(j["ms"].get<double>(), 0.0);
    if (std::string(mode) == "bwd")
      for (const char* key : {"rel_err_dq", "rel_err_dk", "rel_err_dv"}) EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(Cli, TflopsFollowsTheFlashAttentionConvention) {
  const Result r = fmha("run --backend cpu --batch 1 --heads 2 --seqlen-q 256 --head-dim 64 --iters 1 --json --causal top-left");
  ASSERT_EQ(r.exit_code, 0);
  const auto j = nlohmann::json::parse(r.out);
  const double flops = 4.0 * 1 * 2 * 256 * 256 * 64 / 2;  // halved when causal
  EXPECT_NEAR(j["tflops"].get<double>(), flops / (j["ms"].get<double>() * 1e-3) / 1e12, 1e-9);
}

TEST(Cli, BadFlagsExitTwoWithAMessage) {
  for (const char* args : {"run --dtype fp64", "run --causal sideways", "run --mode both", "run --window 3",
                           "run --batch -1", "run --no-such-flag", "run --backend warp9", "bench --sweep nope"}) {
    const Result r = fmha(args, true);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_FALSE(r.out.empty()) << args;
  }
}

// --precision: tf32x3 (split tf32) runs on the CPU as exact fp32 and reports its name; precisions
// that do not apply to the storage dtype are refused naming the flag.
TEST(Cli, PrecisionTf32x3RunsAndBadCombinationsAreRefused) {
  for (const char* mode : {"fwd", "bwd"}) {
    const Result r = fmha(std::string("run --backend cpu --batch 1 --heads 2 --seqlen-q 40 --seqlen-k 50 --head-dim 32 "
                                      "--precision tf32x3 --iters 1 --check --json --mode ") + mode);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["dtype"], "tf32x3");
    EXPECT_EQ(j["precision"], "tf32x3");  // fp32 storage: the arithmetic that ran
    EXPECT_EQ(j["check"], "pass");
  }
  {
    // Exact fp32 on the CPU; no key for 16-bit storage.
    const auto fp32 =
        nlohmann::json::parse(fmha("run --backend cpu --batch 1 --heads 2 --seqlen-q 40 --head-dim 32 --iters 1 --json").out);
    EXPECT_EQ(fp32["precision"], "ieee");
    const auto bf16 =
        nlohmann::json::parse(fmha("run --backend cpu --dtype bf16 --batch 1 --heads 2 --seqlen-q 40 --iters 1 --json").out);
    EXPECT_FALSE(bf16.contains("precision"));
  }
  for (const char* args : {"run --precision tf32x4", "run --dtype bf16 --precision tf32x3",
                           "run --dtype tf32 --precision tf32x3", "run --dtype fp16 --precision tf32"}) {
    const Result r = fmha(args, true);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.out.find("--precision"), std::string::npos) << args << ": " << r.out;
  }
}

TEST(Cli, InvalidCallExitsTwoNamingTheArgument) {
  Result r = fmha("run --backend cpu --heads 3 --kv-heads 2 --seqlen-q 8 --iters 0", true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("kv_heads"), std::string::npos) << r.out;
  r = fmha("run --backend cpu --causal top-left --window 4,2 --seqlen-q 8 --iters 0", true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("window_right"), std::string::npos) << r.out;
}

TEST(Cli, NoFlagsRunsTheSeedShape) {
  const Result r = fmha("run --json --iters 1 --warmup 0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["batch"], 4);
  EXPECT_EQ(j["heads"], 4);
  EXPECT_EQ(j["seqlen_q"], 4096);
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["dtype"], "fp32");
  EXPECT_EQ(j["causal"], "none");
  EXPECT_EQ(j["mode"], "fwd");
}

TEST(Cli, BenchWritesCsvAndJson) {
  const std::string csv = ::testing::TempDir() + "fmha_bench.csv";
  const Result r = fmha("bench --backend cpu --batch 1 --heads 2 --seqlen-q 128 --iters 2 --no-progress --json-out - --csv " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto start = r.out.find('[');
  ASSERT_NE(start, std::string::npos);
  const auto j = nlohmann::json::parse(r.out.substr(start));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["status"], "ok");
  EXPECT_GT(j[0]["tflops"].get<double>(), 0.0);
  FILE* f = fopen(csv.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char header[256] = {};
  ASSERT_NE(fgets(header, sizeof header, f), nullptr);
  fclose(f);
  EXPECT_EQ(std::string(header).rfind("backend,device,mode", 0), 0u);
}

TEST(Cli, BenchSweepIsFilteredByExplicitDtypeAndMode) {
  const Result r = fmha("bench --sweep seed --backend cpu --dtype bf16 --mode fwd --iters 1 --warmup 0 --no-progress "
                        "--json-out -");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto start = r.out.find('[');
  ASSERT_NE(start, std::string::npos);
  const auto j = nlohmann::json::parse(r.out.substr(start));
  ASSERT_EQ(j.size(), 1u);  // the seed sweep has 8 cases: 4 dtypes x 2 directions
  EXPECT_EQ(j[0]["dtype"], "bf16");
  EXPECT_EQ(j[0]["mode"], "fwd");
  EXPECT_EQ(j[0]["seqlen_q"], 4096);
  EXPECT_EQ(j[0]["status"], "ok");
}

// `fmha tune` end to end on the CPU: a class from the run flags, its table, the cache it writes
// and that `fmha run` then uses (below an FMHA_CPU_CONFIG override), --show, --clear, and two
// tuners writing at once.
TEST(Cli, TuneWritesTheCacheThatRunUses) {
  const std::string dir = ::testing::TempDir() + "fmha_cli_tune_" + std::to_string(getpid());
  const std::string cache = dir + "/tune.json";
  const std::string env = "FMHA_TUNE_CACHE=" + cache;
  std::remove(cache.c_str());
  EXPECT_EQ(nlohmann::json::parse(fmha("info --json", false, env).out)["tune_cache"], cache);
  const std::string small = "--backend cpu --batch 1 --heads 2 --seqlen-q 256 --iters 1 --warmup 0 --no-progress";
  Result r = fmha("tune " + small, true, env);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string key = "cpu fwd fp32 d64 none g1 q256 k256";
  EXPECT_NE(r.out.find(key), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<- winner"), std::string::npos) << r.out;
  for (const char* variant : {"k2048 (def)", "k512", "k1024", "k4096", "c2", "c16"})
    EXPECT_NE(r.out.find(variant), std::string::npos) << variant << " missing from the table:\n" << r.out;
  auto read_cache = [&] {
    FILE* f = fopen(cache.c_str(), "r");
    std::string text;
    if (!f) return nlohmann::json();
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) text.append(buf.data(), n);
    fclose(f);
    return nlohmann::json::parse(text);
  };
  nlohmann::json j = read_cache();
  ASSERT_EQ(j["devices"].size(), 1u) << j.dump();
  const nlohmann::json& classes = j["devices"].begin().value();
  ASSERT_TRUE(classes.contains(key)) << j.dump();
  const std::string winner = classes[key]["variant"];

  auto run_json = [&](const std::string& extra_env) {
    const Result run = fmha("run --backend cpu --batch 1 --heads 2 --seqlen-q 256 --iters 1 --json", false,
                            env + (extra_env.empty() ? "" : " " + extra_env));
    EXPECT_EQ(run.exit_code, 0);
    return nlohmann::json::parse(run.out);
  };
  nlohmann::json run = run_json("");
  EXPECT_EQ(run["variant"], winner);
  EXPECT_EQ(run["variant_source"], "cache");
  run = run_json("FMHA_CPU_CONFIG=c2");
  EXPECT_EQ(run["variant"], "c2");
  EXPECT_EQ(run["variant_source"], "variable");

  r = fmha("tune --show", false, env);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find(key), std::string::npos) << r.out;

  // Two tuners at once (other classes): both winners land, the file parses.
  const std::string both = "sh -c '" + std::string(FMHA_CLI_PATH) + " tune " + small + " --causal top-left & " +
                           std::string(FMHA_CLI_PATH) + " tune " + small + " --head-dim 32 & wait'";
  ASSERT_EQ(std::system(("env " + env + " " + both + " >/dev/null 2>&1").c_str()), 0);
  j = read_cache();
  const nlohmann::json& after = j["devices"].begin().value();
  EXPECT_TRUE(after.contains(key));
  EXPECT_TRUE(after.contains("cpu fwd fp32 d64 causal g1 q256 k256")) << j.dump();
  EXPECT_TRUE(after.contains("cpu fwd fp32 d32 none g1 q256 k256")) << j.dump();

  r = fmha("tune --clear", false, env);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_FALSE(read_cache().is_object());
  EXPECT_EQ(run_json("")["variant_source"], "default");
  EXPECT_NE(fmha("tune --show", false, env).out.find("none yet"), std::string::npos);
  std::system(("rm -rf " + dir).c_str());
}

TEST(Cli, TuneSweepAndBadFlags) {
  const std::string cache = ::testing::TempDir() + "fmha_cli_tune_sweep_" + std::to_string(getpid()) + ".json";
  const std::string env = "FMHA_TUNE_CACHE=" + cache;
  // The seed sweep's classes on the CPU (measuring them takes too long for CI): 4 precisions x 2
  // directions, and --dtype / --mode cut it as they cut `fmha bench`'s.
  Result r = fmha("tune --sweep seed --backend cpu --list", false, env);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key : {"cpu fwd fp32 d64 none g1 q4096 k4096", "cpu bwd fp32 d64 none g1 q4096 k4096",
                          "cpu fwd tf32 d64 none g1 q4096 k4096", "cpu bwd tf32 d64 none g1 q4096 k4096",
                          "cpu fwd tf32x3 d64 none g1 q4096 k4096", "cpu bwd tf32x3 d64 none g1 q4096 k4096",
                          "cpu fwd bf16 d64 none g1 q4096 k4096", "cpu bwd bf16 d64 none g1 q4096 k4096"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << "\n" << r.out;
  r = fmha("tune --sweep seed --backend cpu --dtype bf16 --mode bwd --list", false, env);
  EXPECT_EQ(r.out, "cpu bwd bf16 d64 none g1 q4096 k4096\n");
  // The cpu sweep (also `fmha bench --sweep cpu`): long, short and decode-shaped classes.
  r = fmha("tune --sweep cpu --backend cpu --dtype fp32 --list", false, env);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key : {"cpu fwd fp32 d64 none g1 q4096 k4096", "cpu bwd fp32 d128 none g1 q256 k256",
                          "cpu fwd fp32 d128 causal g8 q64 k32768", "cpu fwd fp32 d128 causal g4 q64 k8192"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << "\n" << r.out;
  EXPECT_EQ(r.out.find("bf16"), std::string::npos) << r.out;
  // The decode sweep (`fmha bench --sweep decode`'s cases, bf16 unless --dtype says otherwise):
  // its paged cases share their contiguous twins' classes, so three classes; a paged class with
  // more than 16 queries a sequence has no dense twin and is refused by name.
  r = fmha("tune --sweep decode --backend cpu --list", false, env);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out,
            "cpu fwd bf16 d128 causal g4 q64 k8192\ncpu fwd bf16 d128 causal g4 q64 k131072\n"
            "cpu fwd bf16 d128 causal g4 q64 k32768\n");
  r = fmha("tune --backend cpu --paged --page-size 16 --seqlen-q 1 --seqlen-k 1000 --list", false, env);
  EXPECT_EQ(r.out, "cpu fwd fp32 d64 none g1 q64 k1024\n") << "1000 keys in whole pages of 16: 1008";
  r = fmha("tune --backend cpu --paged --seqlen-q 17 --seqlen-k 1000 --list", false, env);
  EXPECT_NE(r.out.find("--paged"), std::string::npos) << r.out;
  // A dry run measures and writes nothing.
  r = fmha("tune --backend cpu --batch 1 --heads 1 --seqlen-q 64 --iters 1 --warmup 0 --no-progress --dry-run", false,
           env);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("1 class tuned"), std::string::npos) << r.out;
  FILE* f = fopen(cache.c_str(), "r");
  EXPECT_EQ(f, nullptr) << "--dry-run writes nothing";
  if (f) fclose(f);
  EXPECT_EQ(fmha("tune --sweep nope", false, env).exit_code, 2);
  EXPECT_EQ(fmha("tune --show --clear", false, env).exit_code, 2);
  r = fmha("tune --backend reference --batch 1 --heads 1 --seqlen-q 64 --iters 1", true, env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("no variants"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// A packed batch through the CLI: checked against the oracle per sequence, with the lengths in the
// JSON; bad length lists are usage errors that name the flag.
TEST(Cli, RunVarlenChecksEachSequence) {
  for (const char* mode : {"fwd", "bwd"}) {
    const Result r = fmha(std::string("run --backend cpu --seqlens-q 100,0,37,1 --seqlens-k 60,5,0,1 --heads 4 "
                                      "--kv-heads 2 --head-dim 32 --causal bottom-right --iters 1 --check --json --mode ") +
                          mode);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["check"], "pass");
    EXPECT_EQ(j["batch"], 4);
    EXPECT_EQ(j["seqlen_q"], 100);
    EXPECT_EQ(j["seqlens_k"], nlohmann::json::array({60, 5, 0, 1}));
  }
  struct Bad {
    const char* flags;
    const char* mentions;
  };
  for (Bad bad : {Bad{"--seqlens-q 3,x", "--seqlens-q: expected comma-separated lengths"},
                  Bad{"--seqlens-q 3,-1", "--seqlens-q: expected comma-separated lengths"},
                  Bad{"--seqlens-q 3,4 --seqlens-k 5", "--seqlens-k: has 1 lengths, expected 2"},
                  Bad{"--seqlens-k 5", "--seqlens-k: needs --seqlens-q"}}) {
    const Result r = fmha(std::string("run --backend cpu --iters 1 ") + bad.flags, true);
    EXPECT_EQ(r.exit_code, 2) << bad.flags;
    EXPECT_NE(r.out.find(bad.mentions), std::string::npos) << r.out;
  }
}

}  // namespace

namespace {

// A paged KV cache through the CLI: pages shuffled, checked against the oracle; bad page sizes and
// combinations refused with exit code 2.
TEST(Cli, RunPagedChecksAgainstTheOracle) {
  for (const char* backend : {"cpu", "reference"}) {
    const Result r = fmha(std::string("run --backend ") + backend +
                          " --paged --page-size 16 --batch 3 --heads 8 --kv-heads 2 --seqlen-q 3 --seqlen-k 100 "
                          "--head-dim 32 --causal bottom-right --dtype bf16 --iters 1 --check --json");
    ASSERT_EQ(r.exit_code, 0) << backend << ": " << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["check"], "pass");
    EXPECT_EQ(j["page_size"], 16);
    EXPECT_TRUE(j.contains("tbps"));
  }
  EXPECT_EQ(fmha("run --backend cpu --paged --page-size 8 --batch 1 --seqlen-q 1 --seqlen-k 64 --iters 1").exit_code, 2);
  EXPECT_EQ(fmha("run --backend cpu --paged --page-size 0 --batch 1 --seqlen-q 1 --seqlen-k 64 --iters 1").exit_code, 2);
  EXPECT_EQ(fmha("run --backend cpu --paged --seqlens-q 3,4 --iters 1").exit_code, 2);
  // --num-splits reaches Params::num_splits: out of range refused (the CPU backends ignore it).
  EXPECT_EQ(fmha("run --backend cpu --paged --num-splits -1 --batch 1 --seqlen-q 1 --seqlen-k 64 --iters 1").exit_code, 2);
  EXPECT_EQ(fmha("run --backend cpu --paged --num-splits 300 --batch 1 --seqlen-q 1 --seqlen-k 64 --iters 1").exit_code, 2);
  EXPECT_EQ(fmha("run --backend cpu --paged --num-splits 3 --batch 1 --seqlen-q 1 --seqlen-k 64 --iters 1").exit_code, 0);
  const Result bwd = fmha("run --backend cpu --paged --mode bwd --batch 1 --seqlen-q 1 --seqlen-k 64 --iters 1", true);
  EXPECT_EQ(bwd.exit_code, 2);
  EXPECT_NE(bwd.out.find("block_table: backward"), std::string::npos) << bwd.out;
}

}  // namespace
