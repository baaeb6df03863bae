// `fmha tune`: tunes a named sweep's classes (seed, fa) or the one class the run flags describe,
// prints each variant's time per class, and writes the winners to the tuning cache;
// `--show` prints the cache, `--clear` removes it (include/fmha/tune.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli_options.h"

namespace fmha::tools {

struct TuneCliOptions {
  RunOptions run;
  std::string sweep;  // "", "fa" or "seed"
  int rotate = 0;     // input sets (0: enough to exceed the L2 on a GPU)
  bool show = false, clear = false;
  bool dry_run = false;  // measure, print, write nothing
  bool list = false;     // print the classes to tune, measure nothing
  bool no_progress = false;
  bool dtype_given = false, mode_given = false;
};

void add_tune_options(CLI::App* app, TuneCliOptions& opt);
int run_tune(const TuneCliOptions& opt);

}  // namespace fmha::tools
