// The measurement switches of the GPU tiers (FMHA_SM90_SCHEDULER, FMHA_SM90_FWD_ORDER, ...): an
// environment variable whose text picks one of a few named values. Unset or empty, a switch takes
// its first value (the default); any other text takes the default too, and says so on stderr,
// naming the variable, the text and the values it takes, so that a misspelt switch is never
// silently a measurement of the default. Each switch is read once, at its first use, and kept for
// the process (its callers hold the result in a static). Plain C++: the CPU build tests it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <string>

namespace fmha {

struct SwitchChoice {
  int index = 0;        // into the values; 0 (the default) for unset, empty or unknown text
  std::string warning;  // empty unless the text names none of the values
};

// The value that `text` (the variable's, null when unset) picks among `values` (the first the
// default): any range of C strings.
template <class Values>
SwitchChoice choose_switch_in(const char* name, const char* text, const Values& values) {
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
  c.warning = std::string(name) + "=" + text + " is not one of " + list + "; using " + *std::begin(values);
  return c;
}
inline SwitchChoice choose_switch(const char* name, const char* text, std::initializer_list<const char*> values) {
  return choose_switch_in(name, text, values);
}

// A switch's warning (empty: none) on stderr; every switch, named or numeric, reports through it.
inline void report_switch(const std::string& warning) {
  if (!warning.empty()) std::fprintf(stderr, "fmha: %s\n", warning.c_str());
}

// A two-valued switch as the tiers use it: its variable and its values, the default first and
// then the one that turns the switched behaviour on. Each switch is defined here, once, so that
// the CPU tests check what every value does (test_env_switch.cpp); the tiers only ask
// read_switch_on.
struct NamedSwitch {
  const char* variable;
  std::array<const char*, 2> values;  // [0] the default, [1] the value that turns the behaviour on
};

// FMHA_SM90_SCHEDULER=static: the sm90 forward takes its work tiles at a fixed stride even where
// the call brings a workspace for the dynamic scheduler's counter.
inline constexpr NamedSwitch kSm90StaticSchedule{"FMHA_SM90_SCHEDULER", {"dynamic", "static"}};
// FMHA_SM90_FWD_ORDER=heads: the sm90 forward's walk takes the heads of an L2 section together
// instead of each head's query tiles together (calls without a causal mask or window).
inline constexpr NamedSwitch kSm90HeadsTogether{"FMHA_SM90_FWD_ORDER", {"tiles", "heads"}};
// FMHA_SM90_BWD_ORDER=keys: the sm90 deterministic backward takes one (batch, KV head) pair's key
// tiles after another instead of L2 sections of pairs.
inline constexpr NamedSwitch kSm90PairsAlone{"FMHA_SM90_BWD_ORDER", {"sections", "keys"}};
// FMHA_DEPENDENT_LAUNCH=0: the split decode's merge is launched after the decode kernel ends, not
// as its programmatic dependent.
inline constexpr NamedSwitch kNoDependentLaunch{"FMHA_DEPENDENT_LAUNCH", {"1", "0"}};

// FMHA_DECODE_SHAPE=<shape>, at head dim 128 (other head dims run the default): the sm80 decode
// kernel's keys a stage, stages and copies (sm80_decode_launch.cuh). default: 64 keys, 3 stages
// (two CTAs an SM on sm_90); s2: 64 keys, 2 stages; s4: 64 keys, 4 stages (one CTA an SM);
// k128s2, k128s3: 128 keys a stage, 2 or 3 stages (one CTA an SM); l2: the default whose copies
// carry the 256-byte L2 prefetch hint; bulk: the default's tiles, each K and V row one bulk copy
// (cp.async.bulk, sm_90) issued by one warp and completing on a stage's mbarrier; k128bulk: the
// same at 128 keys a stage, 2 stages. `scripts/gpu_decode_shapes.sh` measures them.
inline constexpr const char* kDecodeShapeVariable = "FMHA_DECODE_SHAPE";
enum class DecodeShapeName : int { default_shape, s2, s4, k128s2, k128s3, l2, bulk, k128bulk, count };
inline constexpr std::array<const char*, size_t(DecodeShapeName::count)> kDecodeShapes{
    "default", "s2", "s4", "k128s2", "k128s3", "l2", "bulk", "k128bulk"};
inline SwitchChoice choose_decode_shape(const char* text) {
  return choose_switch_in(kDecodeShapeVariable, text, kDecodeShapes);
}

// Whether `text` (the variable's, null when unset) turns switch `s` on (names values[1]); its
// warning, if any, into `warning`.
inline bool switch_on(const NamedSwitch& s, const char* text, std::string* warning = nullptr) {
  const SwitchChoice c = choose_switch(s.variable, text, {s.values[0], s.values[1]});
  if (warning != nullptr) *warning = c.warning;
  return c.index == 1;
}

// Reads switch `s` from the environment; a warning goes to stderr.
inline bool read_switch_on(const NamedSwitch& s) {
  std::string warning;
  const bool on = switch_on(s, std::getenv(s.variable), &warning);
  report_switch(warning);
  return on;
}

}  // namespace fmha
