// The tuning cache file (cache.h): where it lives, reading it once, and writing it atomically.
// nlohmann-json is a header-only dependency of the build, compiled into libfmha: the installed
// library links nothing new.
#include "tune/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <sstream>
#include <string>

#include "backends.h"
#include "cpu/isa.h"
#include "fmha/tune.h"

namespace fmha {
namespace detail {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "unknown CPU" : line.substr(first);
  }
  return "unknown CPU";
}

// Winners as read from the file (plus those tuned since), per device then class.
struct State {
  std::shared_mutex mutex;
  bool loaded = false;
  std::map<std::string, std::map<std::string, std::string>> winners;
};
State& state() {
  static State s;
  return s;
}
std::atomic<bool> g_has_entries{false};
std::atomic<bool> g_warned{false};

void warn_once(const std::string& path, const std::string& why) {
  if (g_warned.exchange(true)) return;
  std::fprintf(stderr, "fmha: ignoring the tuning cache %s: %s\n", path.c_str(), why.c_str());
}

// The file's contents as an object, or why it is not one to use. A missing file is an empty
// cache, not an error.
bool read_file(const std::string& path, Json* out, std::string* why) {
  *out = Json::object();
  std::error_code ec;
  if (!fs::exists(path, ec)) return true;
  std::ifstream in(path, std::ios::binary);
  if (!in) return *why = "cannot be read", false;
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return *why = "not valid JSON", false;
  if (!j.is_object() || j.value("format", "") != std::string(kCacheFormat))
    return *why = std::string("not an fmha tuning cache (no \"format\": \"") + kCacheFormat + "\")", false;
  const Json version = j.value("version", Json());
  if (!version.is_number_integer() || version.get<int64_t>() != kCacheVersion)
    return *why = "format version " + version.dump() + ", this fmha reads version " + std::to_string(kCacheVersion),
           false;
  if (!j.contains("devices") || !j["devices"].is_object()) return *why = "no \"devices\" object", false;
  *out = std::move(j);
  return true;
}

// Winners of a parsed file; entries of an unexpected shape are skipped one by one.
void collect(const Json& file, std::map<std::string, std::map<std::string, std::string>>* winners) {
  if (!file.contains("devices")) return;
  for (const auto& [device, classes] : file["devices"].items()) {
    if (!classes.is_object()) continue;
    for (const auto& [key, entry] : classes.items())
      if (entry.is_object() && entry.contains("variant") && entry["variant"].is_string())
        (*winners)[device][key] = entry["variant"].get<std::string>();
  }
}

void load_locked(State& s) {
  if (s.loaded) return;
  s.loaded = true;
  s.winners.clear();
  const std::string path = tune_cache_path();
  if (path.empty()) return;
  Json file;
  std::string why;
  if (!read_file(path, &file, &why)) return warn_once(path, why);
  collect(file, &s.winners);
  bool any = false;
  for (const auto& [device, classes] : s.winners) any = any || !classes.empty();
  g_has_entries = any;
}

// An exclusive lock on `<path>.lock` for as long as it lives (flock: released by the kernel if
// the process dies, so a crashed tuner never leaves the cache locked).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Writes `text` to a file of its own next to `path`, then renames it over `path`: readers see
// the old file or the new one, never a part.
Status write_atomically(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  const std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return {Code::internal, "tuning cache: cannot write " + temp};
    out << text;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(temp, ec);
      return {Code::internal, "tuning cache: writing " + temp + " failed"};
    }
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    fs::remove(temp, ec);
    return {Code::internal, "tuning cache: cannot rename " + temp + " to " + path + ": " + ec.message()};
  }
  return Status::success();
}

}  // namespace

std::string device_key(const Device& device) {
  const std::string version = std::string("fmha ") + fmha::version();
  if (device.type == DeviceType::cuda) {
    // Asked once per device: cudaGetDeviceProperties is far too slow for every call.
    static std::mutex mutex;
    static std::map<int, std::string> known;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(device.index);
    if (it == known.end()) {
      const std::string gpu = cuda_device_key(device.index);
      it = known.emplace(device.index, gpu.empty() ? "cuda:" + std::to_string(device.index) + " (unknown), " + version
                                                   : gpu + ", " + version).first;
    }
    return it->second;
  }
  static const std::string model = cpu_model();
  cpu::Isa isa{};
  const std::string path = cpu::selected_isa(&isa).ok() ? cpu::to_string(isa) : "no path";
  return "cpu " + model + ", " + path + " path, " + version;
}

bool cache_has_entries() {
  State& s = state();
  {
    std::shared_lock lock(s.mutex);
    if (s.loaded) return g_has_entries;
  }
  std::unique_lock lock(s.mutex);
  load_locked(s);
  return g_has_entries;
}

std::string cached_variant(const std::string& device, const std::string& class_key) {
  if (!cache_has_entries()) return {};
  State& s = state();
  std::shared_lock lock(s.mutex);
  const auto d = s.winners.find(device);
  if (d == s.winners.end()) return {};
  const auto c = d->second.find(class_key);
  return c == d->second.end() ? std::string() : c->second;
}

Status store_in_cache(const std::string& device, const std::string& class_key, const CacheEntry& entry) {
  const std::string path = tune_cache_path();
  if (path.empty())
    return {Code::invalid_argument,
            std::string("tuning cache: no path (set ") + kCacheVariable + ", XDG_CACHE_HOME or HOME)"};
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) return {Code::internal, "tuning cache: cannot create " + parent.string() + ": " + ec.message()};
  FileLock lock(path);
  if (!lock.ok()) return {Code::internal, "tuning cache: cannot lock " + path + ".lock"};

  // Read what is there now (another process may have written since this one started).
  Json file;
  std::string why;
  if (!read_file(path, &file, &why)) {
    std::fprintf(stderr, "fmha: replacing the tuning cache %s: %s\n", path.c_str(), why.c_str());
    file = Json::object();
  }
  file["format"] = kCacheFormat;
  file["version"] = kCacheVersion;
  if (!file.contains("devices")) file["devices"] = Json::object();
  Json timings = Json::object();
  for (const auto& [name, ms] : entry.timings) timings[name] = ms;
  file["devices"][device][class_key] = {{"variant", entry.variant},
                                        {"ms", entry.ms},
                                        {"default", entry.default_variant},
                                        {"default_ms", entry.default_ms},
                                        {"timings", timings}};
  if (Status st = write_atomically(path, file.dump(2) + "\n"); !st.ok()) return st;

  State& s = state();
  std::unique_lock state_lock(s.mutex);
  load_locked(s);
  collect(file, &s.winners);
  g_has_entries = true;
  return Status::success();
}

void reload_tune_cache() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  s.loaded = false;
  s.winners.clear();
  g_has_entries = false;
  g_warned = false;
}

}  // namespace detail

std::string tune_cache_path() {
  const char* explicit_path = std::getenv(detail::kCacheVariable);
  if (explicit_path && *explicit_path) return explicit_path;
  // XDG: a relative XDG_CACHE_HOME is invalid and ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/fmha/tune.json";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/fmha/tune.json";
  return {};
}

Status clear_tune_cache() {
  const std::string path = tune_cache_path();
  if (path.empty()) return Status::success();
  {
    detail::FileLock lock(path);
    std::error_code ec;
    std::filesystem::remove(path, ec);
    if (ec) return {Code::internal, "tuning cache: cannot remove " + path + ": " + ec.message()};
  }
  detail::reload_tune_cache();
  return Status::success();
}

}  // namespace fmha
