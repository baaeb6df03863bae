// The `cpu` backend's entry points: which instruction-set path this CPU runs (src/cpu/isa.h),
// which block-size variant (src/cpu/cpu_config.h) a call runs, and the call into that path's
// compilation of the kernels. Compiled for the baseline target only, so that it runs on every
// CPU, including those that lack every path but the portable one.
//
// FMHA_CPU_CONFIG=<name> picks the variant; it is read at every call, like FMHA_CPU_ISA, and an
// unknown name is refused with the list of names. Unset, the tuning cache's winner for the call's
// class runs, else the default (src/tune/selection.h).
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "common/paged.h"
#include "common/problem.h"
#include "common/varlen.h"
#include "cpu/fast_attention.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/paged.h"
#include "tune/selection.h"

namespace fmha::cpu {

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amxbf16: return "amxbf16";
  }
  return "unknown";
}

bool parse(const std::string& text, Isa* out) {
  for (Isa isa : kAllIsas)
    if (text == to_string(isa)) return *out = isa, true;
  return false;
}

std::string IsaSet::names() const {
  std::string out;
  for (Isa isa : kAllIsas)
    if (has(isa)) out += std::string(out.empty() ? "" : ", ") + to_string(isa);
  return out.empty() ? "none" : out;
}

IsaSet compiled_isas() {
  IsaSet set;
  set.add(Isa::portable);
#ifdef FMHA_CPU_HAS_AVX2
  set.add(Isa::avx2);
#endif
#ifdef FMHA_CPU_HAS_AVX512
  set.add(Isa::avx512);
#endif
#ifdef FMHA_CPU_HAS_AVX512BF16
  set.add(Isa::avx512bf16);
#endif
#ifdef FMHA_CPU_HAS_AMXBF16
  set.add(Isa::amxbf16);
#endif
  return set;
}

namespace {

// Empty when this process may use the AMX tiles for bf16 matmuls, else why not. Asks Linux for
// the tile registers' state (XFEATURE_XTILEDATA): the kernel enables them in XCR0 but faults a
// process's first tile instruction unless the process has asked for them.
std::string amx_unavailable() {
#if defined(__x86_64__)
  constexpr unsigned kLeaf7EdxAmxBf16 = 1u << 22, kLeaf7EdxAmxTile = 1u << 24;  // CPUID.(EAX=7,ECX=0):EDX
  constexpr unsigned kLeaf1EcxOsxsave = 1u << 27;                               // CPUID.(EAX=1):ECX
  constexpr uint64_t kXcr0TileConfig = 1ull << 17, kXcr0TileData = 1ull << 18;  // XTILECFG, XTILEDATA
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return "the CPU has no CPUID leaf 7";
  std::string missing;
  if (!(edx & kLeaf7EdxAmxTile)) missing = "AMX-TILE";
  if (!(edx & kLeaf7EdxAmxBf16)) missing += std::string(missing.empty() ? "" : " and ") + "AMX-BF16";
  if (!missing.empty()) return "the CPU lacks " + missing;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & kLeaf1EcxOsxsave))
    return "the operating system does not enable XSAVE";
  uint32_t xcr0_low = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const uint64_t xcr0 = uint64_t(xcr0_high) << 32 | xcr0_low;
  if ((xcr0 & (kXcr0TileConfig | kXcr0TileData)) != (kXcr0TileConfig | kXcr0TileData))
    return "the operating system does not enable the tile registers (XCR0)";
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;  // <asm/prctl.h> ARCH_REQ_XCOMP_PERM
  constexpr long kXfeatureXtileData = 18;     // the tile data state component
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0)
    return std::string("the kernel refused the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  return "";
#else
  return "the tile registers are asked for on Linux only";
#endif
#else
  return "not an x86-64 CPU";
#endif
}

// A set of paths with a reason per path, found once per process: what this CPU runs and why not
// the rest (detect_cpu), and what the choice passes over and why (measure_passed_over).
struct PathsAndReasons {
  IsaSet paths;
  std::string why[kIsaCount];
};

PathsAndReasons detect_cpu() {
  PathsAndReasons out;
  out.paths.add(Isa::portable);
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also asks the operating system (XGETBV) whether it saves the AVX and
  // AVX-512 registers: a CPU flag alone is not enough to use them.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx512bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const std::string amx = avx512bf16 ? amx_unavailable() : "the CPU cannot run the avx512bf16 path";
  if (avx2) out.paths.add(Isa::avx2);
  else out.why[int(Isa::avx2)] = "the CPU (or its operating system) lacks AVX2 or FMA";
  if (avx512) out.paths.add(Isa::avx512);
  else out.why[int(Isa::avx512)] = "the CPU (or its operating system) lacks AVX-512 F/BW/DQ/VL or AVX2";
  if (avx512bf16) out.paths.add(Isa::avx512bf16);
  else out.why[int(Isa::avx512bf16)] = "the CPU (or its operating system) lacks AVX512_BF16 or AVX-512";
  if (amx.empty()) out.paths.add(Isa::amxbf16);
  else out.why[int(Isa::amxbf16)] = amx;
#else
  for (Isa isa : kAllIsas)
    if (isa != Isa::portable) out.why[int(isa)] = "not an x86 CPU";
#endif
  return out;
}

const PathsAndReasons& cpu_support() {
  static const PathsAndReasons support = detect_cpu();
  return support;
}

}  // namespace

IsaSet cpu_isas() { return cpu_support().paths; }

std::string cpu_lacks(Isa isa) { return cpu_support().why[int(isa)]; }

Status choose_isa(IsaSet compiled, IsaSet cpu, const char* forced, Isa* chosen, IsaSet passed_over) {
  const IsaSet usable = compiled & cpu;
  if (forced && *forced) {
    Isa isa{};
    IsaSet every_path;
    for (Isa known : kAllIsas) every_path.add(known);
    if (!parse(forced, &isa))
      return {Code::invalid_argument, std::string(kIsaEnvironmentVariable) + "=" + forced +
                                          ": not a CPU path (one of " + every_path.names() + ")"};
    if (!compiled.has(isa))
      return {Code::unsupported, std::string(kIsaEnvironmentVariable) + "=" + forced +
                                     ": this build has no such path (it has " + compiled.names() + ")"};
    if (!cpu.has(isa))
      return {Code::unsupported, std::string(kIsaEnvironmentVariable) + "=" + forced +
                                     ": this CPU cannot run that path (it can run " + usable.names() + ")"};
    *chosen = isa;
    return Status::success();
  }
  Isa best = Isa::portable;
  for (Isa isa : kAllIsas)
    if (usable.has(isa) && !passed_over.has(isa)) best = isa;
  *chosen = best;
  return Status::success();
}

namespace {

// The paths passed over on this CPU, and why, measured once per process where it matters.
PathsAndReasons measure_passed_over() {
  PathsAndReasons out;
#ifdef FMHA_CPU_HAS_AVX512BF16
  // Only where the choice would otherwise land on avx512bf16.
  const IsaSet usable = compiled_isas() & cpu_isas();
  if (!usable.has(Isa::avx512bf16) || usable.has(Isa::amxbf16)) return out;
  const avx512bf16::DotAndFmaRates rates = avx512bf16::measure_dot_and_fma();
  if (!dot_product_pays(rates.dot, rates.fma)) {
    out.paths.add(Isa::avx512bf16);
    char line[200];
    std::snprintf(line, sizeof(line),
                  "this core's bf16 dot product measured %.1f G multiply-adds/s against %.1f for its fp32 FMA "
                  "(below %.2fx): bf16 runs widened to fp32 on the avx512 path",
                  rates.dot * 1e-9, rates.fma * 1e-9, kDotOverFmaToPrefer);
    out.why[int(Isa::avx512bf16)] = line;
  }
#endif
  return out;
}

const PathsAndReasons& passed_over() {
  static const PathsAndReasons measured = measure_passed_over();
  return measured;
}

}  // namespace

IsaSet cpu_passed_over() { return passed_over().paths; }

std::string cpu_passed_over_why(Isa isa) { return passed_over().why[int(isa)]; }

Status selected_isa(Isa* chosen) {
  const char* forced = std::getenv(kIsaEnvironmentVariable);
  // A forced path needs no measurement.
  const IsaSet skip = forced && *forced ? IsaSet() : cpu_passed_over();
  return choose_isa(compiled_isas(), cpu_isas(), forced, chosen, skip);
}

namespace {

// The variant a call runs, or why the request names none.
Status selected_config(const Params& p, Direction direction, const CpuConfig** config) {
  const detail::VariantRequest request =
      detail::requested_variant(Backend::cpu, p, direction, std::getenv(kCpuConfigVariable));
  *config = &kCpuConfigs[kCpuDefaultVariant];
  if (request.name.empty()) return Status::success();
  for (const CpuConfig& c : kCpuConfigs)
    if (request.name == c.name) return *config = &c, Status::success();
  if (request.source == detail::VariantSource::cache) return Status::success();  // another build's name
  std::string names;
  for (const CpuConfig& c : kCpuConfigs) names += std::string(names.empty() ? "" : ", ") + c.name;
  const std::string origin = request.source == detail::VariantSource::variable
                                 ? std::string(kCpuConfigVariable) + "=" + request.name
                                 : "variant '" + request.name + "'";
  return {Code::invalid_argument, origin + " names no cpu configuration; choose one of " + names};
}

}  // namespace

std::vector<std::string> variants(const Params&, Direction direction) {
  // A variant that differs from the default in the backward's settings alone (score_cache_bytes,
  // row_score_bytes) runs the default's forward: the tuner does not time it twice.
  const CpuConfig& base = kCpuConfigs[kCpuDefaultVariant];
  std::vector<std::string> names;
  for (const CpuConfig& c : kCpuConfigs) {
    const bool backward_only = &c != &base && c.key_block == base.key_block && c.query_block == base.query_block &&
                               c.max_chunk_tiles == base.max_chunk_tiles;
    if (direction == Direction::forward && backward_only) continue;
    names.emplace_back(c.name);
  }
  return names;
}

Status variant_of(const Params& p, Direction direction, std::string* name) {
  const CpuConfig* config = nullptr;
  if (Status s = cpu::supports(p, direction); !s.ok()) return s;
  if (Status s = selected_config(p, direction, &config); !s.ok()) return s;
  *name = config->name;
  return Status::success();
}

Status supports(const Params& p, Direction direction) {
  const Problem s = Problem::of(p);
  if (s.head_dim > kMaxHeadDim)
    return {Code::unsupported, "q: head_dim " + std::to_string(s.head_dim) + " is above the cpu backend's limit of " +
                                   std::to_string(kMaxHeadDim)};
  if (s.head_dim_v > kMaxHeadDim)
    return {Code::unsupported, "v: head_dim_v " + std::to_string(s.head_dim_v) +
                                   " is above the cpu backend's limit of " + std::to_string(kMaxHeadDim)};
  Isa isa{};
  if (Status s = selected_isa(&isa); !s.ok()) return s;
  const CpuConfig* config = nullptr;
  return selected_config(p, direction, &config);
}

namespace {

Status run_on_path(Isa isa, const Params* calls, int64_t count, Direction direction, const CpuConfig& config,
                   const KeyPages* pages = nullptr) {
  switch (isa) {
#ifdef FMHA_CPU_HAS_AVX2
    case Isa::avx2: return avx2::run_kernels(calls, count, direction, config, pages);
#endif
#ifdef FMHA_CPU_HAS_AVX512
    case Isa::avx512: return avx512::run_kernels(calls, count, direction, config, pages);
#endif
#ifdef FMHA_CPU_HAS_AVX512BF16
    case Isa::avx512bf16: return avx512bf16::run_kernels(calls, count, direction, config, pages);
#endif
#ifdef FMHA_CPU_HAS_AMXBF16
    case Isa::amxbf16: return amxbf16::run_kernels(calls, count, direction, config, pages);
#endif
    default: return portable::run_kernels(calls, count, direction, config, pages);
  }
}

}  // namespace

Status run(const Params& p, Direction direction) {
  Isa isa{};
  if (Status s = selected_isa(&isa); !s.ok()) return s;
  const CpuConfig* config = nullptr;
  if (Status s = selected_config(p, direction, &config); !s.ok()) return s;
  if (is_paged(p))  // forward only (validate() refuses the backward)
    return run_paged(p, [&](const Params* calls, int64_t count, const KeyPages* pages) {
      return run_on_path(isa, calls, count, Direction::forward, *config, pages);
    });
  const std::vector<Params> calls = dense_calls(p);
  return run_on_path(isa, calls.data(), int64_t(calls.size()), direction, *config);
}

}  // namespace fmha::cpu

namespace fmha {

CpuPaths cpu_paths() {
  using namespace cpu;
  CpuPaths out;
  const IsaSet compiled = compiled_isas(), runnable = compiled & cpu_isas();
  const IsaSet skipped = cpu_passed_over();
  for (Isa isa : kAllIsas) {
    if (compiled.has(isa)) out.compiled.push_back(to_string(isa));
    if (runnable.has(isa)) out.runnable.push_back(to_string(isa));
    else if (compiled.has(isa)) out.not_runnable.push_back(std::string(to_string(isa)) + ": " + cpu_lacks(isa));
    if (runnable.has(isa) && skipped.has(isa))
      out.passed_over.push_back(std::string(to_string(isa)) + ": " + cpu_passed_over_why(isa));
  }
  Isa isa{};
  if (Status s = selected_isa(&isa); s.ok()) out.selected = to_string(isa);
  else out.error = s.message;
  return out;
}

}  // namespace fmha
