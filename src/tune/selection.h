// Which variant of a tier a call runs, for the variant-selection layer of every tier (the CPU
// path's src/cpu/dispatch.cpp, the GPU tiers' src/cuda/common/variant.h). One order, for all:
//
//   1. the candidate the tuner is measuring, on the thread that measures it (src/tune/tuner.cpp)
//   2. the tier's FMHA_*_CONFIG environment variable, when set
//   3. the tuning cache's winner for the call's problem class on this device (src/tune/cache.cpp)
//   4. the tier's built-in default (and, on the GPU, the first variant that fits the device)
//
// The tiers know their variants by name; this layer knows names only, so that a tier that gains
// or loses a variant needs no change here. A cached name the build does not have is ignored.
#pragma once

#include <string>

#include "fmha/fmha.h"

namespace fmha::detail {

enum class VariantSource { tuner, variable, cache, builtin };
const char* to_string(VariantSource source);

struct VariantRequest {
  std::string name;  // empty: the tier's built-in default
  VariantSource source = VariantSource::builtin;
};

// The request for a call of `tier` (a validated call). `variable` is the value of the tier's
// FMHA_*_CONFIG variable (null or empty when unset), read by the tier as it reads it.
VariantRequest requested_variant(Backend tier, const Params& params, Direction direction, const char* variable);

// While one is alive, calls of `tier` in `direction` on this thread run the variant `name`
// (empty: the built-in default), above every other source. The tuner's way to run each
// candidate in turn.
class CandidateScope {
 public:
  CandidateScope(Backend tier, Direction direction, std::string name);
  ~CandidateScope();
  CandidateScope(const CandidateScope&) = delete;
  CandidateScope& operator=(const CandidateScope&) = delete;

 private:
  Backend previous_tier_;
  Direction previous_direction_;
  std::string previous_name_;
  bool previous_active_;
};

// Marks this thread as tuning while it lives: autotune does not start a tuning inside another.
class TuningGuard {
 public:
  TuningGuard();
  ~TuningGuard();
  TuningGuard(const TuningGuard&) = delete;
  TuningGuard& operator=(const TuningGuard&) = delete;
};
bool tuning_in_progress();

}  // namespace fmha::detail
