// Switches the compiler to the instruction set of the CPU path being compiled (FMHA_CPU_LEVEL,
// set by the build with FMHA_CPU_ISA; see src/cpu/isa.h). src/cpu/fast_attention.cpp includes it
// after every header it shares with other code and before its own code, so that only the path's
// own functions (namespace fmha::cpu::FMHA_CPU_ISA) use the extra instructions. An inline
// function of a shared header, or a standard-library template, that this file emits out of line
// (the linker keeps one copy for the whole program) is then compiled for the baseline target:
// compiling the whole file with -mavx512f instead could leave AVX-512 code in, say,
// std::vector<float>::resize or Mask::keys for every caller in the program. GCC inlines those
// baseline functions into the path's code, where they get its instruction set.
// The build compiles the path with the instruction-set flags on the command line instead where
// the compiler has no `#pragma GCC target` (FMHA_CPU_TARGET_BY_FLAGS).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#ifndef FMHA_CPU_LEVEL
#error "FMHA_CPU_LEVEL (0 portable, 1 avx2, 2 avx512, 3 avx512bf16, 4 amxbf16) is set by the build (cmake/cpu_isa.cmake)"
#endif

#if !defined(FMHA_CPU_TARGET_BY_FLAGS)
#if FMHA_CPU_LEVEL >= 4
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16")
#elif FMHA_CPU_LEVEL == 3
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
#elif FMHA_CPU_LEVEL == 2
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl")
#elif FMHA_CPU_LEVEL == 1
#pragma GCC target("avx2,fma")
#endif
#endif
