// Named kernel configurations ("variants") of a tier, and which one a call runs. The request
// comes from src/tune/selection.h, in its order: the tuner's candidate, the tier's environment
// variable (FMHA_SIMT_CONFIG / FMHA_SIMT_BWD_CONFIG / FMHA_SM80_FWD_CONFIG / FMHA_SM80_BWD_CONFIG
// / FMHA_SM90_FWD_CONFIG = <name>), the tuning cache's winner for the call's class, the default.
// The variable is read once, the first time a tier dispatches; an unknown name in it makes the
// tier refuse the call (with the list of names) rather than silently measure something else,
// while a cached name this build lacks is ignored (the default runs).
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/common/dispatch_util.h"
#include "cuda/common/host.h"
#include "cuda/instances.h"
#include "tune/selection.h"

namespace fmha::cuda {

inline constexpr int kUnknownVariant = -1;
inline constexpr int kDefaultVariant = -2;  // the variable is unset or empty

// Index of `value` in names[0, count), kDefaultVariant when value is null or empty,
// kUnknownVariant when it names none of them.
inline int variant_index(const char* value, const char* const* names, int count) {
  if (value == nullptr || *value == '\0') return kDefaultVariant;
  for (int i = 0; i < count; ++i)
    if (std::strcmp(value, names[i]) == 0) return i;
  return kUnknownVariant;
}

// The variant_index a call of TIER in DIRECTION requests (tune/selection.h's order: the tuner's
// candidate, the tier's FMHA_*_CONFIG `variable`, the cache's winner), before the head-dim and
// shared-memory rules of with_requested_variant. The variable is read once per TIER and
// DIRECTION, at the first call (what the tiers document), and then kept.
template <Backend TIER, Direction DIRECTION>
int requested_variant_index(const Params& p, const char* variable, const char* const* names, int count) {
  static const std::string value = [variable] {
    const char* set = std::getenv(variable);
    return std::string(set ? set : "");
  }();
  const detail::VariantRequest request = detail::requested_variant(TIER, p, DIRECTION, value.c_str());
  const int index = variant_index(request.name.c_str(), names, count);
  // A cached winner this build does not compile (a cache written by another build) is ignored.
  if (index == kUnknownVariant && request.source == detail::VariantSource::cache) return kDefaultVariant;
  return index;
}

inline std::vector<std::string> variant_list(const char* const* names, int count) {
  return std::vector<std::string>(names, names + count);
}

inline Status unknown_variant(const char* variable, const char* const* names, int count) {
  std::string list;
  for (int i = 0; i < count; ++i) list += std::string(i ? ", " : "") + names[i];
  const char* value = std::getenv(variable);
  return unsupported(std::string(variable) + "=" + (value ? value : "") + " names no configuration; choose one of " +
                     list);
}

// True for the head-dim buckets compiled in every variant (FMHA_CUDA_TUNED_HEAD_DIMS).
constexpr bool is_tuned_head_dim(int head_dim) {
  return in_head_dims(head_dim, {FMHA_CUDA_TUNED_HEAD_DIMS(FMHA_CUDA_LIST_ITEM)});
}

// f(std::integral_constant<int, V>{}) for the runtime index `variant` in [0, COUNT).
template <int COUNT, class F>
Status with_variant(int variant, F&& f) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    Status status = unsupported("variant " + std::to_string(variant) + " is out of range");
    (void)((variant == I ? (status = f(std::integral_constant<int, I>{}), true) : false) || ...);
    return status;
  }(std::make_integer_sequence<int, COUNT>{});
}

// f(std::integral_constant<int, V>{}) for the variant a call runs. At head dims compiled in every
// variant (TUNED): `requested` (a variant_index of `variable`), else DEFAULT. At the others only
// DEFAULT is compiled, and EXTRA too where EXTRA >= 0 (a variant compiled at more head dims, such
// as sm80's compact one): the variable can pick EXTRA there and is ignored otherwise. An unknown
// name is refused. Where the variable is unset and DEFAULT does not fit the device
// (fits(integral_constant<int, V>) is false: its shared memory exceeds what the GPU offers), the
// lowest-numbered compiled variant that fits runs instead; where none fits, DEFAULT, whose
// shared-memory check then reports the call.
template <int COUNT, int DEFAULT, bool TUNED, int EXTRA = -1, class Fits, class F>
Status with_requested_variant(int requested, const char* variable, const char* const* names, Fits&& fits, F&& f) {
  static_assert(EXTRA < COUNT && DEFAULT >= 0 && DEFAULT < COUNT);
  if (requested == kUnknownVariant) return unknown_variant(variable, names, COUNT);
  if constexpr (TUNED) {
    if (requested != kDefaultVariant) return with_variant<COUNT>(requested, f);
    if (!fits(std::integral_constant<int, DEFAULT>{})) {
      int chosen = kUnknownVariant;
      [&]<int... I>(std::integer_sequence<int, I...>) {
        (void)((fits(std::integral_constant<int, I>{}) ? (chosen = I, true) : false) || ...);
      }(std::make_integer_sequence<int, COUNT>{});
      if (chosen != kUnknownVariant) return with_variant<COUNT>(chosen, f);
    }
  } else if constexpr (EXTRA >= 0 && EXTRA != DEFAULT) {
    if (requested == EXTRA ||
        (requested == kDefaultVariant && !fits(std::integral_constant<int, DEFAULT>{}) &&
         fits(std::integral_constant<int, EXTRA>{})))
      return f(std::integral_constant<int, EXTRA>{});
  }
  return f(std::integral_constant<int, DEFAULT>{});
}

}  // namespace fmha::cuda
