// The `cpu` backend's entry points: which instruction-set path this CPU runs (src/cpu/isa.h), and
// the call into that path's compilation of the kernels. Compiled for the baseline target only,
// so that it runs on every CPU, including those that lack every path but the portable one.
#include <cstdlib>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/varlen.h"
#include "cpu/fast_attention.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"

namespace fmha::cpu {

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
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
  return set;
}

IsaSet cpu_isas() {
  IsaSet set;
  set.add(Isa::portable);
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also asks the operating system (XGETBV) whether it saves the AVX and
  // AVX-512 registers: a CPU flag alone is not enough to use them.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx512bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (avx2) set.add(Isa::avx2);
  if (avx512) set.add(Isa::avx512);
  if (avx512bf16) set.add(Isa::avx512bf16);
#endif
  return set;
}

Status choose_isa(IsaSet compiled, IsaSet cpu, const char* forced, Isa* chosen) {
  const IsaSet usable = compiled & cpu;
  if (forced && *forced) {
    Isa isa{};
    if (!parse(forced, &isa))
      return {Code::invalid_argument, std::string(kIsaEnvironmentVariable) + "=" + forced +
                                          ": not a CPU path (one of portable, avx2, avx512, avx512bf16)"};
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
    if (usable.has(isa)) best = isa;
  *chosen = best;
  return Status::success();
}

Status selected_isa(Isa* chosen) {
  return choose_isa(compiled_isas(), cpu_isas(), std::getenv(kIsaEnvironmentVariable), chosen);
}

Status supports(const Params& p, Direction) {
  const Problem s = Problem::of(p);
  if (s.head_dim > kMaxHeadDim)
    return {Code::unsupported, "q: head_dim " + std::to_string(s.head_dim) + " is above the cpu backend's limit of " +
                                   std::to_string(kMaxHeadDim)};
  if (s.head_dim_v > kMaxHeadDim)
    return {Code::unsupported, "v: head_dim_v " + std::to_string(s.head_dim_v) +
                                   " is above the cpu backend's limit of " + std::to_string(kMaxHeadDim)};
  Isa isa{};
  return selected_isa(&isa);
}

Status run(const Params& p, Direction direction) {
  Isa isa{};
  if (Status s = selected_isa(&isa); !s.ok()) return s;
  const std::vector<Params> calls = dense_calls(p);
  const int64_t count = int64_t(calls.size());
  switch (isa) {
#ifdef FMHA_CPU_HAS_AVX2
    case Isa::avx2: return avx2::run_kernels(calls.data(), count, direction);
#endif
#ifdef FMHA_CPU_HAS_AVX512
    case Isa::avx512: return avx512::run_kernels(calls.data(), count, direction);
#endif
#ifdef FMHA_CPU_HAS_AVX512BF16
    case Isa::avx512bf16: return avx512bf16::run_kernels(calls.data(), count, direction);
#endif
    default: return portable::run_kernels(calls.data(), count, direction);
  }
}

}  // namespace fmha::cpu

namespace fmha {

CpuPaths cpu_paths() {
  using namespace cpu;
  CpuPaths out;
  const IsaSet compiled = compiled_isas(), runnable = compiled & cpu_isas();
  for (Isa isa : kAllIsas) {
    if (compiled.has(isa)) out.compiled.push_back(to_string(isa));
    if (runnable.has(isa)) out.runnable.push_back(to_string(isa));
  }
  Isa isa{};
  if (Status s = selected_isa(&isa); s.ok()) out.selected = to_string(isa);
  else out.error = s.message;
  return out;
}

}  // namespace fmha
