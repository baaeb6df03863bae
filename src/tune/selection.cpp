// The variant-selection order shared by every tier (selection.h) and the problem class a call
// belongs to (include/fmha/tune.h).
#include "tune/selection.h"

#include <algorithm>

#include "common/decode.h"
#include "common/paged.h"
#include "common/problem.h"
#include "fmha/tune.h"
#include "tune/cache.h"
#include "tune/class.h"

namespace fmha {
namespace {

constexpr int64_t kSmallestSeqlenBucket = 64;  // one tile of every tier: shorter rows share a class

int64_t seqlen_bucket(int64_t seqlen) {
  int64_t bucket = kSmallestSeqlenBucket;
  while (bucket < seqlen) bucket *= 2;
  return bucket;
}

const char* dtype_key(DType dtype, Precision precision) {
  return dtype == DType::fp32 && precision != Precision::ieee ? to_string(precision) : to_string(dtype);
}

// The candidate the tuner measures on this thread.
thread_local bool t_candidate_active = false;
thread_local Backend t_candidate_tier = Backend::auto_select;
thread_local Direction t_candidate_direction = Direction::forward;
thread_local int t_tuning_depth = 0;
thread_local std::string t_candidate_name;

}  // namespace

const char* to_string(MaskKind mask) {
  switch (mask) {
    case MaskKind::none: return "none";
    case MaskKind::causal: return "causal";
    case MaskKind::window: return "window";
  }
  return "unknown";
}

std::string ProblemClass::key() const {
  // Built by appending: GCC 12 warns (falsely, -Wrestrict) on long chains of operator+.
  std::string k = to_string(tier);
  k += ' ';
  k += to_string(direction);
  k += ' ';
  k += dtype_key(dtype, precision);
  k += " d";
  k += std::to_string(head_dim);
  if (head_dim_v != head_dim) {
    k += 'v';
    k += std::to_string(head_dim_v);
  }
  k += ' ';
  k += to_string(mask);
  k += " g";
  k += std::to_string(group);
  k += " q";
  k += std::to_string(seqlen_q_bucket);
  k += " k";
  k += std::to_string(seqlen_k_bucket);
  if (direction == Direction::backward && deterministic) k += " deterministic";
  if (decode) {
    k += " decode b";
    k += std::to_string(decode_blocks_bucket);
  }
  return k;
}

namespace detail {

ProblemClass class_of(Backend tier, const Params& p, Direction direction) {
  const Problem s = Problem::of(p);
  ProblemClass c;
  c.tier = tier;
  c.direction = direction;
  c.dtype = s.dtype;
  c.precision = p.precision;
  c.head_dim = s.head_dim;
  c.head_dim_v = s.head_dim_v;
  c.mask = p.causal != Causal::none                        ? MaskKind::causal
           : (p.window_left >= 0 || p.window_right >= 0) ? MaskKind::window
                                                           : MaskKind::none;
  c.group = s.group;
  c.seqlen_q_bucket = seqlen_bucket(s.seqlen_q);
  c.seqlen_k_bucket = seqlen_bucket(s.seqlen_k);
  c.deterministic = direction == Direction::backward && p.deterministic;
  c.decode = tier == Backend::cuda_sm80 && (is_paged(p) || decode::is_decode_shape(p, direction));
  if (c.decode) {
    const int64_t blocks = s.batch * s.kv_heads * decode::row_tiles(s.seqlen_q, s.group);
    c.decode_blocks_bucket = 1;
    while (c.decode_blocks_bucket < blocks) c.decode_blocks_bucket *= 2;
  }
  return c;
}

const char* to_string(VariantSource source) {
  switch (source) {
    case VariantSource::tuner: return "tuner";
    case VariantSource::variable: return "variable";
    case VariantSource::cache: return "cache";
    case VariantSource::builtin: return "default";
  }
  return "unknown";
}

VariantRequest requested_variant(Backend tier, const Params& p, Direction direction, const char* variable) {
  if (t_candidate_active && t_candidate_tier == tier && t_candidate_direction == direction)
    return {t_candidate_name, VariantSource::tuner};
  if (variable && *variable) return {variable, VariantSource::variable};
  if (cache_has_entries()) {
    std::string name = cached_variant(device_key(p.q.device), class_of(tier, p, direction).key());
    if (!name.empty()) return {std::move(name), VariantSource::cache};
  }
  return {};
}

CandidateScope::CandidateScope(Backend tier, Direction direction, std::string name)
    : previous_tier_(t_candidate_tier),
      previous_direction_(t_candidate_direction),
      previous_name_(t_candidate_name),
      previous_active_(t_candidate_active) {
  t_candidate_active = true;
  t_candidate_tier = tier;
  t_candidate_direction = direction;
  t_candidate_name = std::move(name);
}

CandidateScope::~CandidateScope() {
  t_candidate_active = previous_active_;
  t_candidate_tier = previous_tier_;
  t_candidate_direction = previous_direction_;
  t_candidate_name = std::move(previous_name_);
}

TuningGuard::TuningGuard() { ++t_tuning_depth; }
TuningGuard::~TuningGuard() { --t_tuning_depth; }
bool tuning_in_progress() { return t_tuning_depth > 0; }

}  // namespace detail
}  // namespace fmha
