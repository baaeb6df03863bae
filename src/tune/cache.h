// The tuning cache: one JSON file of winners, per device and problem class (include/fmha/tune.h
// names the file). Read once per process, at the first lookup; written by the tuner under an
// exclusive lock on a side file, as a whole new file renamed over the old one, so that readers
// and concurrent tuners never see a torn file and no winner of another process is lost.
//
//   {"format": "fmha-tune-cache", "version": 1,
//    "devices": {"<device>": {"<class key>": {"variant": "k1024", "ms": 1.9,
//                                             "default": "k2048", "default_ms": 2.1,
//                                             "timings": {"k2048": 2.1, "k1024": 1.9, ...}}}}}
//
// A file that does not parse, is not such an object, or has another format version is ignored
// with one warning on stderr (and replaced by the next tuner that writes). Devices are named with
// everything that changes the winner (device_key), so sections for other GPUs, drivers or fmha
// versions stay in the file, unused.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fmha/fmha.h"

namespace fmha::detail {

inline constexpr const char* kCacheFormat = "fmha-tune-cache";
inline constexpr int kCacheVersion = 1;
inline constexpr const char* kCacheVariable = "FMHA_TUNE_CACHE";

// CPU: its model, the instruction-set path calls take, and the fmha version. GPU: its name,
// multiprocessor count, CUDA runtime and driver versions, and the fmha version.
std::string device_key(const Device& device);

struct CacheEntry {
  std::string variant, default_variant;
  double ms = 0.0, default_ms = 0.0;
  std::vector<std::pair<std::string, double>> timings;  // variants that agreed, in the tier's order
};

// The cached winner of `class_key` on `device`, or empty. Reads the file at the first lookup.
std::string cached_variant(const std::string& device, const std::string& class_key);
// False until a winner is known for some class on some device (a call then skips the lookup).
bool cache_has_entries();

// Adds (or replaces) a winner in the file and in this process's view of it.
Status store_in_cache(const std::string& device, const std::string& class_key, const CacheEntry& entry);

// Forgets what this process read, so that the next lookup reads the file (at the path the
// environment names then) again. For tests and clear_tune_cache().
void reload_tune_cache();

}  // namespace fmha::detail
