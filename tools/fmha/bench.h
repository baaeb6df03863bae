// `fmha bench`: named sweeps (`fa`, `seed`, `varlen`, `merge`, `decode`) or the single case the run flags describe, timed
// after warm-up as the median of repeats with rotating inputs, written as a table, CSV and JSON.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli_options.h"

namespace fmha::tools {

struct BenchOptions {
  RunOptions run;
  std::string sweep;       // "", "fa", "seed", "varlen", "merge" or "decode"
  std::string csv;         // CSV output file
  std::string json_out;    // JSON output file ("-": stdout)
  int rotate = 0;          // input sets to rotate through (0: enough to exceed the L2 cache)
  bool no_progress = false;
  bool dtype_given = false;  // --dtype / --mode given explicitly: restrict a sweep to it
  bool mode_given = false;
};

void add_bench_options(CLI::App* app, BenchOptions& opt);

// FlashAttention's sweep (fa) and the seed shape in each precision and direction (seed), built on
// `base`; false for another name. `fmha tune` tunes the same sweeps.
bool named_sweep(const std::string& name, const CaseSpec& base, std::vector<CaseSpec>* cases);
std::vector<CaseSpec> fa_sweep(const CaseSpec& base);
std::vector<CaseSpec> seed_sweep(const CaseSpec& base);

// A progress bar on stderr: `done` of `total`, then `label`; a newline when done == total.
void progress_bar(size_t done, size_t total, const std::string& label, bool enabled);
int run_bench(const BenchOptions& opt);

}  // namespace fmha::tools
