// `fmha bench`: named sweeps (`fa`, `seed`, `varlen`, `merge`) or the single case the run flags describe, timed
// after warm-up as the median of repeats with rotating inputs, written as a table, CSV and JSON.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli_options.h"

namespace fmha::tools {

struct BenchOptions {
  RunOptions run;
  std::string sweep;       // "", "fa", "seed", "varlen" or "merge"
  std::string csv;         // CSV output file
  std::string json_out;    // JSON output file ("-": stdout)
  int rotate = 0;          // input sets to rotate through (0: enough to exceed the L2 cache)
  bool no_progress = false;
  bool dtype_given = false;  // --dtype / --mode given explicitly: restrict a sweep to it
  bool mode_given = false;
};

void add_bench_options(CLI::App* app, BenchOptions& opt);
int run_bench(const BenchOptions& opt);

}  // namespace fmha::tools
