// See tune.h.
#include "tune.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "bench.h"
#include "fmha/tune.h"
#include "harness.h"
#include "tune/cache.h"

namespace fmha::tools {
namespace {

constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2;

// The variables that force a variant (they override the cache, so tuning under one would record
// winners that calls of this process never run; the tuner itself ignores them).
constexpr const char* kConfigVariables[] = {"FMHA_CPU_CONFIG",     "FMHA_SIMT_CONFIG",     "FMHA_SIMT_BWD_CONFIG",
                                            "FMHA_SM80_FWD_CONFIG", "FMHA_SM80_BWD_CONFIG", "FMHA_SM90_FWD_CONFIG"};

constexpr int kDecodeMaxQueries = 16;  // the decode kernel's dense calls (src/common/decode.h kMaxSeqlenQ)

// A call with the case's shapes and options; the tuner allocates its own data. A paged case
// (--paged) tunes as the dense call of its cache's capacity (whole pages): with at most 16 queries
// a sequence that is the paged call's class (the decode kernel's on the GPU, the same buckets);
// the tuner tunes a paged call so itself (src/tune/tuner.cpp), and a shapes-only call cannot
// carry a block table (its entries are checked).
Params shape_params(const CaseSpec& c, Device device) {
  Params p;
  const int64_t keys = c.paged() ? std::max<int64_t>(1, (c.seqlen_k + c.page_size - 1) / c.page_size) * c.page_size
                                 : c.seqlen_k;
  p.q = make_tensor(nullptr, c.dtype, {c.batch, c.seqlen_q, c.heads, c.head_dim}, device);
  p.k = make_tensor(nullptr, c.dtype, {c.batch, keys, c.kv_heads, c.head_dim}, device);
  p.v = make_tensor(nullptr, c.dtype, {c.batch, keys, c.kv_heads, c.head_dim_v}, device);
  p.softmax_scale = c.softmax_scale;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.q_offset = c.q_offset;
  p.precision = c.precision;
  p.deterministic = c.deterministic;
  p.backend = c.backend;
  p.num_threads = c.num_threads;
  return p;
}

int show_cache() {
  const std::string path = tune_cache_path();
  if (path.empty()) {
    std::cerr << "fmha tune --show: no cache path (set FMHA_TUNE_CACHE, XDG_CACHE_HOME or HOME)\n";
    return kExitUsage;
  }
  std::ifstream in(path);
  if (!in) {
    std::printf("tuning cache %s: none yet\n", path.c_str());
    return kExitOk;
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("devices") || !j["devices"].is_object()) {
    std::printf("tuning cache %s: not a tuning cache (fmha ignores it; `fmha tune --clear` removes it)\n", path.c_str());
    return kExitFailed;
  }
  const std::string version = j.contains("version") ? j["version"].dump() : "?";
  std::printf("tuning cache %s (format %s, version %s)\n", path.c_str(), j.value("format", "?").c_str(),
              version.c_str());
  if (j.value("format", "") != detail::kCacheFormat || version != std::to_string(detail::kCacheVersion))
    std::printf("  (fmha %s reads format %s version %d and ignores this file)\n", fmha::version(), detail::kCacheFormat,
                detail::kCacheVersion);
  for (const auto& [device, classes] : j["devices"].items()) {
    std::printf("\n%s\n  %-48s %-10s %10s  %-10s %10s %8s\n", device.c_str(), "class", "winner", "ms", "default",
                "ms", "speedup");
    if (!classes.is_object()) continue;
    for (const auto& [key, e] : classes.items()) {
      if (!e.is_object()) continue;
      const double ms = e.value("ms", 0.0), default_ms = e.value("default_ms", 0.0);
      std::printf("  %-48s %-10s %10.3f  %-10s %10.3f %7.2fx\n", key.c_str(), e.value("variant", "?").c_str(), ms,
                  e.value("default", "?").c_str(), default_ms, ms > 0 ? default_ms / ms : 0.0);
    }
  }
  return kExitOk;
}

void print_result(const TuneResult& r) {
  std::printf("\n%s\n  %-12s %10s %8s  %s\n", r.problem.key().c_str(), "variant", "ms", "vs def.", "status");
  for (const VariantTiming& v : r.variants) {
    const std::string name = v.variant + (v.is_default ? " (def)" : "");
    if (v.agrees)
      std::printf("  %-12s %10.3f %7.2fx  %s%s\n", name.c_str(), v.ms, v.ms > 0 ? r.default_ms / v.ms : 0.0,
                  v.status.c_str(), v.variant == r.winner ? "  <- winner" : "");
    else
      std::printf("  %-12s %10s %8s  %s\n", name.c_str(), "-", "-", v.status.c_str());
  }
}

}  // namespace

void add_tune_options(CLI::App* app, TuneCliOptions& o) {
  app->add_option("--sweep", o.sweep, "Named sweep to tune: seed, fa, cpu or decode (default: the class the run flags describe)");
  app->add_option("--rotate", o.rotate, "Input sets to rotate through (default: enough to exceed the L2 cache)");
  app->add_flag("--show", o.show, "Print the tuning cache");
  app->add_flag("--clear", o.clear, "Remove the tuning cache");
  app->add_flag("--dry-run", o.dry_run, "Measure and print, but write nothing to the cache");
  app->add_flag("--list", o.list, "Print the classes that would be tuned, and measure nothing");
  app->add_flag("--no-progress", o.no_progress, "No progress bar");
}

int run_tune(const TuneCliOptions& opt) {
  if (opt.show && opt.clear) {
    std::cerr << "fmha tune: --show and --clear exclude each other\n";
    return kExitUsage;
  }
  if (opt.show) return show_cache();
  if (opt.clear) {
    const std::string path = tune_cache_path();
    if (Status s = clear_tune_cache(); !s.ok()) {
      std::cerr << "fmha tune --clear: " << s.message << "\n";
      return kExitFailed;
    }
    std::printf("tuning cache %s removed\n", path.c_str());
    return kExitOk;
  }

  CaseSpec base;
  std::string error;
  if (!opt.run.to_case(&base, &error)) {
    std::cerr << "fmha tune: " << error << "\n";
    return kExitUsage;
  }
  std::vector<CaseSpec> cases;
  if (opt.sweep == "decode" && !opt.dtype_given) base.dtype = DType::bf16;  // as `fmha bench --sweep decode`
  if (opt.sweep.empty()) cases = {base};
  else if (!named_sweep(opt.sweep, base, &cases)) {
    std::cerr << "fmha tune: --sweep: expected fa, seed, cpu or decode, got '" << opt.sweep << "'\n";
    return kExitUsage;
  } else {
    std::erase_if(cases, [&](const CaseSpec& c) {
      return (opt.dtype_given && c.dtype_name() != opt.run.dtype) || (opt.mode_given && c.mode != base.mode);
    });
  }
  Device device;
  if (!choose_device(base.backend, &device, &error)) {
    std::cerr << "fmha tune: " << error << "\n";
    return kExitUsage;
  }
  for (const char* variable : kConfigVariables)
    if (const char* value = std::getenv(variable); value && *value)
      std::fprintf(stderr, "fmha tune: note: %s=%s is set; it overrides the cache for calls of this process\n",
                   variable, value);
  const bool show_progress = !opt.no_progress && isatty(fileno(stderr));
  TuneOptions options;
  options.iters = opt.run.iters;
  options.warmup = opt.run.warmup;
  options.rotate = opt.rotate;
  options.write_cache = !opt.dry_run;

  if (!opt.list)
    std::printf("fmha tune on %s; cache %s\n", device_description(device).c_str(),
                opt.dry_run ? "(dry run: not written)" : tune_cache_path().c_str());
  int failures = 0, tuned = 0;
  std::set<std::string> seen;  // a sweep's cases may share a class
  for (size_t i = 0; i < cases.size(); ++i) {
    const CaseSpec c = cases[i].resolved();
    if (c.paged() && c.seqlen_q > kDecodeMaxQueries) {
      std::printf("\n%s %s: n/a: --paged: tuned as the dense call of the cache's capacity, which shares the paged "
                  "call's class only up to %d queries a sequence (--seqlen-q is %lld)\n",
                  to_string(c.mode), c.dtype_name().c_str(), kDecodeMaxQueries, (long long)c.seqlen_q);
      ++failures;
      continue;
    }
    const Params p = shape_params(c, device);
    ProblemClass cls;
    if (Status s = problem_class(p, c.mode, &cls); !s.ok()) {
      std::printf("\n%s %s: n/a: %s\n", to_string(c.mode), c.dtype_name().c_str(), s.message.c_str());
      ++failures;
      continue;
    }
    if (!seen.insert(cls.key()).second) continue;
    if (opt.list) {
      std::printf("%s\n", cls.key().c_str());
      ++tuned;
      continue;
    }
    const std::string label = "(" + std::to_string(i + 1) + "/" + std::to_string(cases.size()) + ") " + cls.key();
    options.progress = [&](int done, int total, const std::string& variant) {
      progress_bar(size_t(done), size_t(total), label + " " + variant, show_progress);
    };
    TuneResult r;
    const Status s = tune(p, c.mode, options, &r);
    if (show_progress) std::fprintf(stderr, "\r%*s\r", 120, "");
    if (!s.ok()) {
      std::printf("\n%s: n/a: %s\n", cls.key().c_str(), s.message.c_str());
      ++failures;
      continue;
    }
    ++tuned;
    print_result(r);
    std::fflush(stdout);
  }
  if (!opt.list) std::printf("\n%d class%s tuned, %d failed\n", tuned, tuned == 1 ? "" : "es", failures);
  return tuned == 0 ? (failures ? kExitFailed : kExitOk) : kExitOk;
}

}  // namespace fmha::tools
