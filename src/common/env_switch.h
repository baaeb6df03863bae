// The measurement switches of the GPU tiers (FMHA_SM90_SCHEDULER, FMHA_SM90_FWD_ORDER, ...): an
// environment variable whose text picks one of a few named values. Unset or empty, a switch takes
// its first value (the default); any other text takes the default too, and says so on stderr,
// naming the variable, the text and the values it takes, so that a misspelt switch is never
// silently a measurement of the default. Each switch is read once, at its first use, and kept for
// the process (its callers hold the result in a static). Plain C++: the CPU build tests it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace fmha {

struct SwitchChoice {
  int index = 0;        // into the values; 0 (the default) for unset, empty or unknown text
  std::string warning;  // empty unless the text names none of the values
};

// The value that `text` (the variable's, null when unset) picks among `values` (the first the default).
inline SwitchChoice choose_switch(const char* name, const char* text, std::initializer_list<const char*> values) {
  SwitchChoice c;
  if (text == nullptr || *text == '\0') return c;
  int i = 0;
  std::string list;
  for (const char* v : values) {
    if (std::strcmp(text, v) == 0) {
      c.index = i;
      return c;
    }
    list += std::string(i++ ? ", " : "") + v;
  }
  c.warning = std::string(name) + "=" + text + " is not one of " + list + "; using " + *values.begin();
  return c;
}

// A switch's warning (empty: none) on stderr; every switch, named or numeric, reports through it.
inline void report_switch(const std::string& warning) {
  if (!warning.empty()) std::fprintf(stderr, "fmha: %s\n", warning.c_str());
}

// Reads switch `name` from the environment; a warning goes to stderr.
inline int read_switch(const char* name, std::initializer_list<const char*> values) {
  const SwitchChoice c = choose_switch(name, std::getenv(name), values);
  report_switch(c.warning);
  return c.index;
}

}  // namespace fmha
