// The instruction-set paths of the fast CPU backend. src/cpu/fast_attention.cpp is compiled once
// per path, each with its own compiler flags and namespace (fmha::cpu::portable, ::avx2, ...), and
// the path a call runs is chosen here at run time from what the CPU reports, so that one binary
// runs everywhere and fast wherever it runs. This file is compiled for the baseline target only.
#pragma once

#include <cstdint>
#include <string>

#include "fmha/fmha.h"

namespace fmha::cpu {

// In order of preference: each path needs everything the ones before it need.
//   portable    no instruction-set flags (the target's baseline: SSE2 on x86-64)
//   avx2        AVX2 + FMA
//   avx512      AVX-512 F/BW/DQ/VL (+ AVX2 + FMA)
//   avx512bf16  avx512 + AVX512_BF16 (vdpbf16ps)
//   amxbf16     avx512bf16 + AMX-TILE + AMX-BF16 (tdpbf16ps), and the operating system's
//               permission to use the tile registers: bf16 storage multiplies on tiles; fp32,
//               tf32 and fp16 storage run the avx512bf16 path's code
enum class Isa : int { portable, avx2, avx512, avx512bf16, amxbf16 };
inline constexpr int kIsaCount = 5;
inline constexpr Isa kAllIsas[kIsaCount] = {Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amxbf16};

const char* to_string(Isa isa);
bool parse(const std::string& text, Isa* out);

// A set of paths, one bit per Isa.
class IsaSet {
 public:
  constexpr IsaSet() = default;
  constexpr IsaSet& add(Isa isa) {
    bits_ |= 1u << int(isa);
    return *this;
  }
  constexpr bool has(Isa isa) const { return (bits_ >> int(isa)) & 1u; }
  constexpr IsaSet operator&(IsaSet other) const { return IsaSet(bits_ & other.bits_); }
  std::string names() const;  // "portable, avx2"

 private:
  constexpr explicit IsaSet(uint32_t bits) : bits_(bits) {}
  uint32_t bits_ = 0;
};

// The paths compiled into this build.
IsaSet compiled_isas();
// The paths this CPU (and its operating system) can execute, whether compiled or not. On Linux the
// first call asks the kernel for the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM), which a
// process must do before it uses them; amxbf16 is in the set only when that succeeded.
IsaSet cpu_isas();
// Why this CPU cannot run `isa` (the features it lacks, or the refused permission); empty when
// it can.
std::string cpu_lacks(Isa isa);

// Paths this CPU runs that the choice passes over because they measured slower here than the
// path before them: avx512bf16 where the core's bf16 dot product does fewer than
// kDotOverFmaToPrefer times the multiply-adds per second of its fp32 FMA (bf16 then runs widened
// to fp32 on the avx512 path). On a 2-core Intel Xeon (docs/PERF.md, 2026-12-04) vdpbf16ps gave
// half its FMA's rate and the widened path ran bf16 1.6x faster; on an AMD EPYC (2026-12-03) the
// dot-product path ran 1.5-1.7x faster than widened arithmetic. Measured once per process, the
// first time the choice needs it, and only where avx512bf16 would be chosen (an AMX CPU takes
// amxbf16 first).
IsaSet cpu_passed_over();
// Why `isa` is passed over (the measured rates); empty when it is not.
std::string cpu_passed_over_why(Isa isa);
inline constexpr double kDotOverFmaToPrefer = 1.25;
// The rule itself: whether a bf16 dot product of `dot` multiply-adds per second is worth taking
// over an fp32 FMA of `fma` (at least kDotOverFmaToPrefer times as many).
constexpr bool dot_product_pays(double dot, double fma) { return dot >= kDotOverFmaToPrefer * fma; }

// The one function that chooses a path: the last path of `compiled` ∩ `cpu` that is not in
// `passed_over` (portable never is), or `forced` (the value of FMHA_CPU_ISA; null or empty for no
// preference), which must be known, compiled in, and supported by the CPU, and is taken even if
// passed over. Otherwise an error that says what is there, and `chosen` is untouched.
Status choose_isa(IsaSet compiled, IsaSet cpu, const char* forced, Isa* chosen, IsaSet passed_over = IsaSet());

// The path calls take now: choose_isa(compiled_isas(), cpu_isas(), getenv("FMHA_CPU_ISA"),
// cpu_passed_over()). FMHA_CPU_ISA is read on every call, so a process (a test) may change it
// between calls.
Status selected_isa(Isa* chosen);

inline constexpr const char* kIsaEnvironmentVariable = "FMHA_CPU_ISA";

}  // namespace fmha::cpu
