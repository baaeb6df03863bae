// The fmha command-line tool: `fmha info`, `fmha run` (one case, timed, optionally checked
// against the fp64 oracle), `fmha bench` (named sweeps to CSV/JSON) and `fmha tune` (the
// variants of a sweep's classes timed, the fastest written to the tuning cache).
// Exit codes: 0 success, 1 a --check outside tolerance, 2 bad flags or an invalid call.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench.h"
#include "cli_options.h"
#include "fmha/tune.h"
#include "harness.h"
#include "tune.h"

namespace fmha::tools {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitUsage = 2;

// Oracle work allowed for `--check` before it samples rows: about two seconds of fp64 on one core.
constexpr double kCheckBudgetFlops = 4e9;

int cmd_info(bool json) {
  nlohmann::json j;
  j["version"] = version();
  j["tune_cache"] = tune_cache_path();
  j["autotune"] = autotune_enabled();
  for (Backend b : compiled_backends()) j["backends"].push_back(to_string(b));
  for (const DeviceInfo& d : devices()) {
    nlohmann::json dj;
    dj["device"] = d.device.type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(d.device.index);
    dj["name"] = d.device.type == DeviceType::cpu ? device_description(d.device) : d.name;
    if (d.device.type == DeviceType::cuda) {
      dj["compute_capability"] = d.compute_capability;
      dj["multiprocessors"] = d.multiprocessors;
      dj["memory_gib"] = double(d.memory_bytes) / double(1ull << 30);
    } else {
      dj["threads"] = d.multiprocessors;
      const CpuPaths paths = cpu_paths();
      dj["cpu_paths_compiled"] = paths.compiled;
      dj["cpu_paths_runnable"] = paths.runnable;
      if (!paths.not_runnable.empty()) dj["cpu_paths_not_runnable"] = paths.not_runnable;
      if (!paths.passed_over.empty()) dj["cpu_paths_passed_over"] = paths.passed_over;
      dj["cpu_path"] = paths.selected;
      if (!paths.error.empty()) dj["cpu_path_error"] = paths.error;
    }
    j["devices"].push_back(dj);
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "fmha " << version() << "\nbackends:";
  for (const auto& b : j["backends"]) std::cout << " " << b.get<std::string>();
  std::cout << "\ndevices:\n";
  for (const auto& d : j["devices"]) {
    std::cout << "  " << d["device"].get<std::string>() << ": " << d["name"].get<std::string>();
    if (d.contains("compute_capability"))
      std::cout << " (sm_" << d["compute_capability"].get<int>() << ", " << d["multiprocessors"].get<int>()
                << " SMs, " << d["memory_gib"].get<double>() << " GiB)";
    std::cout << "\n";
    if (d.contains("cpu_path")) {
      auto names = [](const nlohmann::json& list) {
        std::string out;
        for (const auto& name : list) out += (out.empty() ? "" : " ") + name.get<std::string>();
        return out;
      };
      std::cout << "    cpu paths compiled: " << names(d["cpu_paths_compiled"]) << "; this CPU runs: "
                << names(d["cpu_paths_runnable"]) << "\n";
      if (d.contains("cpu_paths_not_runnable"))
        for (const auto& why : d["cpu_paths_not_runnable"]) std::cout << "    not run here: " << why.get<std::string>() << "\n";
      if (d.contains("cpu_paths_passed_over"))
        for (const auto& why : d["cpu_paths_passed_over"]) std::cout << "    passed over: " << why.get<std::string>() << "\n";
      std::cout << "    cpu path in use: ";
      if (d.contains("cpu_path_error")) std::cout << "none (" << d["cpu_path_error"].get<std::string>() << ")\n";
      else std::cout << d["cpu_path"].get<std::string>() << "\n";
    }
  }
  if (j["devices"].size() == 1) std::cout << "  (no CUDA device found)\n";
  std::cout << "tuning cache: " << j["tune_cache"].get<std::string>()
            << (j["autotune"].get<bool>() ? " (autotune on)" : "") << "\n";
  return kExitOk;
}

int cmd_run(const RunOptions& opt) {
  CaseSpec spec;
  std::string error;
  if (!opt.to_case(&spec, &error)) {
    std::cerr << "fmha run: " << error << "\n";
    return kExitUsage;
  }
  Device device;
  if (!choose_device(spec.backend, &device, &error)) {
    std::cerr << "fmha run: " << error << "\n";
    return kExitUsage;
  }
  try {
    Harness harness(spec, device);
    if (Status s = harness.run_once(); !s.ok()) {
      std::cerr << "fmha run: " << s.message << "\n";
      return s.code == Code::invalid_argument || s.code == Code::unsupported || s.code == Code::no_device ? kExitUsage
                                                                                                          : kExitCheckFailed;
    }
    CheckResult check;
    if (opt.check) check = harness.check(kCheckBudgetFlops);
    const bool gpu = device.type == DeviceType::cuda;
    const int iters = opt.iters >= 0 ? opt.iters : (gpu ? 20 : 3);
    const int warmup = opt.warmup >= 0 ? opt.warmup : (gpu ? 5 : 1);
    double ms = 0.0;
    if (iters > 0)
      if (Status s = harness.time(warmup, iters, &ms); !s.ok()) {
        std::cerr << "fmha run: " << s.message << "\n";
        return kExitCheckFailed;
      }
    const CaseSpec& c = harness.spec();
    VariantChoice variant;  // which variant ran, and whether a variable, the cache or the default chose it
    selected_variant(harness.params(), c.mode, &variant);
    const double tflops = ms > 0.0 ? c.flops() / (ms * 1e-3) / 1e12 : 0.0;
    const double tbps = ms > 0.0 ? c.bytes() / (ms * 1e-3) / 1e12 : 0.0;  // Q, K, V, O bytes once

    nlohmann::json j;
    j["backend"] = to_string(harness.backend_used());
    if (harness.backend_used() == Backend::cpu) j["cpu_path"] = cpu_paths().selected;
    if (!variant.variant.empty()) {
      j["variant"] = variant.variant;
      j["variant_source"] = variant.source;
    }
    // fp32 storage: the arithmetic that ran (`auto` may meet ieee with split tf32).
    if (c.dtype == DType::fp32) j["precision"] = to_string(variant.precision);
    j["device"] = device_description(device);
    j["dtype"] = c.dtype_name();
    j["mode"] = to_string(c.mode);
    j["batch"] = c.batch;
    j["heads"] = c.heads;
    j["kv_heads"] = c.kv_heads;
    j["seqlen_q"] = c.seqlen_q;
    j["seqlen_k"] = c.seqlen_k;
    if (c.varlen()) {
      j["seqlens_q"] = c.seqlens_q;
      j["seqlens_k"] = c.seqlens_k;
    }
    j["head_dim"] = c.head_dim;
    j["head_dim_v"] = c.head_dim_v;
    j["causal"] = to_string(c.causal);
    j["window"] = {c.window_left, c.window_right};
    j["q_offset"] = c.q_offset;
    j["deterministic"] = c.deterministic;
    j["seed"] = c.seed;
    j["iters"] = iters;
    j["ms"] = ms;
    j["tflops"] = tflops;
    j["gflops"] = tflops * 1e3;
    j["tbps"] = tbps;
    if (c.paged()) j["page_size"] = c.page_size;
    if (opt.check) {
      j["check"] = check.pass ? "pass" : "fail";
      j["max_abs_err"] = check.max_abs_err;
      j["rel_err"] = check.rel_err;
      j["tolerance"] = check.tolerance;
      j["check_sampled"] = check.sampled;
      if (c.mode == Direction::backward) {
        j["rel_err_dq"] = check.rel_err_dq;
        j["rel_err_dk"] = check.rel_err_dk;
        j["rel_err_dv"] = check.rel_err_dv;
      } else {
        j["lse_err"] = check.lse_err;
      }
      if (!check.pass) j["check_failure"] = check.failure;
    }
    if (opt.json) {
      std::cout << j.dump() << "\n";
    } else {
      std::string path = j.contains("cpu_path") ? ", " + j["cpu_path"].get<std::string>() + " path" : "";
      if (!variant.variant.empty()) path += ", variant " + variant.variant + " (" + variant.source + ")";
      if (c.dtype == DType::fp32 && variant.precision != c.precision)
        path += ", computed as " + std::string(to_string(variant.precision));
      std::printf("fmha run: %s %s on %s (%s%s)\n", to_string(c.mode), c.dtype_name().c_str(), j["backend"].get<std::string>().c_str(),
                  j["device"].get<std::string>().c_str(), path.c_str());
      std::printf("  batch %lld, heads %lld/%lld, seqlen %lld x %lld, head_dim %lld/%lld, causal %s, window %lld,%lld, q_offset %lld\n",
                  (long long)c.batch, (long long)c.heads, (long long)c.kv_heads, (long long)c.seqlen_q,
                  (long long)c.seqlen_k, (long long)c.head_dim, (long long)c.head_dim_v, to_string(c.causal),
                  (long long)c.window_left, (long long)c.window_right, (long long)c.q_offset);
      if (c.varlen())
        std::printf("  varlen: %zu sequences, %lld query and %lld key tokens (seqlen above: the longest)\n",
                    c.seqlens_q.size(), (long long)c.total_q(), (long long)c.total_k());
      if (c.paged())
        std::printf("  paged KV cache: pages of %lld rows, shuffled\n", (long long)c.page_size);
      if (iters > 0)
        std::printf("  %.3f ms (median of %d), %.2f TFLOP/s (%.1f GFLOP/s), %.3f TB/s (Q, K, V, O bytes once)\n", ms,
                    iters, tflops, tflops * 1e3, tbps);
      if (opt.check) {
        std::printf("  check: %s  rel_err %.3g  max_abs_err %.3g  tolerance %.3g%s\n", check.pass ? "pass" : "FAIL",
                    check.rel_err, check.max_abs_err, check.tolerance, check.sampled ? "  (sampled oracle)" : "");
        if (c.mode == Direction::backward)
          std::printf("  rel_err dq %.3g  dk %.3g  dv %.3g\n", check.rel_err_dq, check.rel_err_dk, check.rel_err_dv);
        if (!check.pass) std::printf("  failure: %s\n", check.failure.c_str());
      }
    }
    return opt.check && !check.pass ? kExitCheckFailed : kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "fmha run: " << e.what() << "\n";
    return kExitCheckFailed;
  }
}

}  // namespace
}  // namespace fmha::tools

int main(int argc, char** argv) {
  using namespace fmha::tools;
  CLI::App app{"fmha: fused multi-head attention — run, check and benchmark"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(fmha::version()));

  bool info_json = false;
  CLI::App* info = app.add_subcommand("info", "Version, compiled backends and devices");
  info->add_flag("--json", info_json, "Print JSON");

  RunOptions run_opt;
  CLI::App* run = app.add_subcommand("run", "Run one attention call, time it, optionally check it");
  add_case_options(run, run_opt);
  run->add_flag("--check", run_opt.check, "Compare with the fp64 oracle; exit 1 when outside tolerance");
  run->add_flag("--json", run_opt.json, "Print one JSON object");

  BenchOptions bench_opt;
  CLI::App* bench = app.add_subcommand("bench", "Benchmark a named sweep or one case (CSV / JSON output)");
  add_case_options(bench, bench_opt.run);
  add_bench_options(bench, bench_opt);

  TuneCliOptions tune_opt;
  CLI::App* tune = app.add_subcommand("tune", "Tune a sweep's classes or one class; --show / --clear the cache");
  add_case_options(tune, tune_opt.run);
  add_tune_options(tune, tune_opt);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (info->parsed()) return cmd_info(info_json);
  if (run->parsed()) return cmd_run(run_opt);
  if (bench->parsed()) {
    bench_opt.dtype_given = bench->count("--dtype") > 0;
    bench_opt.mode_given = bench->count("--mode") > 0;
    return run_bench(bench_opt);
  }
  if (tune->parsed()) {
    tune_opt.dtype_given = tune->count("--dtype") > 0;
    tune_opt.mode_given = tune->count("--mode") > 0;
    return run_tune(tune_opt);
  }
  return 2;
}
