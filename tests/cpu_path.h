// The cpu backend's instruction-set paths in tests: the paths this build has, whether this CPU
// runs one, and FMHA_CPU_ISA forced to one for a scope.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::testing {

inline std::vector<std::string> compiled_cpu_paths() { return cpu_paths().compiled; }

inline bool cpu_runs(const std::string& path) {
  const std::vector<std::string> runnable = cpu_paths().runnable;
  return std::find(runnable.begin(), runnable.end(), path) != runnable.end();
}

// Sets FMHA_CPU_ISA to `path` (unsets it for an empty path) until the end of the scope.
class ForceCpuPath {
 public:
  explicit ForceCpuPath(const std::string& path) {
    if (const char* old = getenv(kVariable)) previous_ = old;
    set(path);
  }
  ~ForceCpuPath() { set(previous_.value_or("")); }
  ForceCpuPath(const ForceCpuPath&) = delete;
  ForceCpuPath& operator=(const ForceCpuPath&) = delete;

 private:
  static constexpr const char* kVariable = "FMHA_CPU_ISA";
  static void set(const std::string& value) {
    if (value.empty()) unsetenv(kVariable);
    else setenv(kVariable, value.c_str(), 1);
  }
  std::optional<std::string> previous_;
};

}  // namespace fmha::testing
