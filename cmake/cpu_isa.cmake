# The fast CPU path compiled once per instruction-set path (src/cpu/isa.h): each compilation of
# src/cpu/fast_attention.cpp is an object library with its own flags and namespace, linked into
# fmha; src/cpu/dispatch.cpp (baseline flags) picks one at run time from what the CPU reports.
# On x86-64 with GCC or Clang the paths are portable, avx2, avx512, avx512bf16 and amxbf16 (those
# the compiler can target: amxbf16 wants GCC 12+ or Clang 15+); elsewhere the portable path alone.
# With FMHA_NATIVE the set is cut to the paths this machine runs, each tuned for it
# (-mtune=native); on other architectures the portable path is then compiled with -march=native.
include(CheckCXXCompilerFlag)
include(CheckCXXSourceCompiles)

set(FMHA_CPU_ISA_FLAGS_portable "")
set(FMHA_CPU_ISA_FLAGS_avx2 -mavx2 -mfma)
set(FMHA_CPU_ISA_FLAGS_avx512 -mavx2 -mfma -mavx512f -mavx512bw -mavx512dq -mavx512vl)
set(FMHA_CPU_ISA_FLAGS_avx512bf16 ${FMHA_CPU_ISA_FLAGS_avx512} -mavx512bf16)
set(FMHA_CPU_ISA_FLAGS_amxbf16 ${FMHA_CPU_ISA_FLAGS_avx512bf16} -mamx-tile -mamx-bf16)
# What -march=native must define for this machine to run each path.
set(FMHA_CPU_ISA_MACROS_avx2 __AVX2__ __FMA__)
set(FMHA_CPU_ISA_MACROS_avx512 ${FMHA_CPU_ISA_MACROS_avx2} __AVX512F__ __AVX512BW__ __AVX512DQ__ __AVX512VL__)
set(FMHA_CPU_ISA_MACROS_avx512bf16 ${FMHA_CPU_ISA_MACROS_avx512} __AVX512BF16__)
set(FMHA_CPU_ISA_MACROS_amxbf16 ${FMHA_CPU_ISA_MACROS_avx512bf16} __AMX_TILE__ __AMX_BF16__)
# The tile intrinsics as the amxbf16 path uses them (immediate tile numbers, a 64-byte config):
# a compiler that takes the flags but not these (Clang before 15) leaves the path out.
set(_fmha_cpu_amx_probe [=[
#include <immintrin.h>
#include <cstdint>
alignas(64) static const unsigned char config[64] = {1};
int main() {
  static uint16_t a[16 * 32], b[16 * 32];
  static float c[16 * 16];
  _tile_loadconfig(config);
  _tile_zero(0);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, 64);
  _tile_release();
  return int(c[0]);
}
]=])

set(FMHA_CPU_ISAS portable)
set(_fmha_cpu_x86 OFF)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86|x86)$")
  set(_fmha_cpu_x86 ON)
endif()

if(_fmha_cpu_x86)
  foreach(isa avx2 avx512 avx512bf16 amxbf16)
    string(REPLACE ";" " " _flags "${FMHA_CPU_ISA_FLAGS_${isa}}")
    if(isa STREQUAL "amxbf16")
      set(CMAKE_REQUIRED_FLAGS "${_flags}")
      check_cxx_source_compiles("${_fmha_cpu_amx_probe}" FMHA_CPU_COMPILER_HAS_${isa})
      unset(CMAKE_REQUIRED_FLAGS)
    else()
      check_cxx_compiler_flag("${_flags}" FMHA_CPU_COMPILER_HAS_${isa})
    endif()
    if(NOT FMHA_CPU_COMPILER_HAS_${isa})
      message(STATUS "fmha: the compiler cannot target the ${isa} CPU path; left out")
      continue()
    endif()
    if(FMHA_NATIVE)
      set(_checks "")
      foreach(macro IN LISTS FMHA_CPU_ISA_MACROS_${isa})
        string(APPEND _checks "#ifndef ${macro}\n#error ${macro}\n#endif\n")
      endforeach()
      set(CMAKE_REQUIRED_FLAGS "-march=native")
      check_cxx_source_compiles("${_checks}int main() { return 0; }" FMHA_CPU_NATIVE_HAS_${isa})
      unset(CMAKE_REQUIRED_FLAGS)
      if(NOT FMHA_CPU_NATIVE_HAS_${isa})
        continue()
      endif()
    endif()
    list(APPEND FMHA_CPU_ISAS ${isa})
  endforeach()
  if(FMHA_NATIVE)
    foreach(isa IN LISTS FMHA_CPU_ISAS)
      list(APPEND FMHA_CPU_ISA_FLAGS_${isa} -mtune=native)
    endforeach()
  endif()
elseif(FMHA_NATIVE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(FMHA_CPU_ISA_FLAGS_portable -march=native)
endif()
message(STATUS "fmha: CPU paths compiled: ${FMHA_CPU_ISAS}")

# GCC compiles each path's own code for its instruction set by `#pragma GCC target` (see
# src/cpu/isa_target.h), the rest of the file for the baseline; other compilers take the flags.
set(FMHA_CPU_LEVEL_portable 0)
set(FMHA_CPU_LEVEL_avx2 1)
set(FMHA_CPU_LEVEL_avx512 2)
set(FMHA_CPU_LEVEL_avx512bf16 3)
set(FMHA_CPU_LEVEL_amxbf16 4)
foreach(isa IN LISTS FMHA_CPU_ISAS)
  add_library(fmha_cpu_${isa} OBJECT src/cpu/fast_attention.cpp)
  target_include_directories(fmha_cpu_${isa} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_definitions(fmha_cpu_${isa} PRIVATE FMHA_CPU_ISA=${isa} FMHA_CPU_LEVEL=${FMHA_CPU_LEVEL_${isa}})
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    set(_flags ${FMHA_CPU_ISA_FLAGS_${isa}})
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND _fmha_cpu_x86)
      list(FILTER _flags EXCLUDE REGEX "^-m(avx|fma|amx)")
    else()
      target_compile_definitions(fmha_cpu_${isa} PRIVATE FMHA_CPU_TARGET_BY_FLAGS)
    endif()
    # The inner loops: vectorized, FMA-contracted, no libm calls.
    target_compile_options(fmha_cpu_${isa} PRIVATE -Wall -Wextra -O3 -ffp-contract=fast ${_flags})
  endif()
  target_sources(fmha PRIVATE $<TARGET_OBJECTS:fmha_cpu_${isa}>)
  string(TOUPPER ${isa} _upper)
  target_compile_definitions(fmha PRIVATE FMHA_CPU_HAS_${_upper})
endforeach()
