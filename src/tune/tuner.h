// The tuning engine's hooks into the call path (api.cpp) and into the tests.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "fmha/fmha.h"

namespace fmha::detail {

// Autotune (include/fmha/tune.h): true when it is on, this thread is not tuning already, and the
// call's class has no cached winner on its device and was not tried before in this process.
bool autotune_wanted(const Params& params, Direction direction, Backend tier);
// Tunes the call's class; a failure is one line on stderr, and the call goes on with the default.
void autotune(const Params& params, Direction direction, Backend tier);

// For tests: an extra candidate the tuner measures after the tier's own, run by `run` in place
// of the tier (for instance one that writes a wrong answer quickly). Reset with std::nullopt.
struct TestCandidate {
  std::string name;
  std::function<Status(const Params&, Direction)> run;
};
void set_test_candidate(std::optional<TestCandidate> candidate);

}  // namespace fmha::detail
