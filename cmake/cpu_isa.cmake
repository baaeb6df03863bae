# The fast CPU path compiled once per instruction-set path (src/cpu/isa.h): each compilation of
# src/cpu/fast_attention.cpp is an object library with its own flags and namespace, linked into
# fmha; src/cpu/dispatch.cpp (baseline flags) picks one at run time from what the CPU reports.
# On x86-64 with GCC or Clang the paths are portable, avx2, avx512 and avx512bf16 (those the
# compiler can target); elsewhere the portable path alone. With FMHA_NATIVE the set is cut to the
# paths this machine runs, each tuned for it (-mtune=native); on other architectures the portable
# path is then compiled with -march=native.
include(CheckCXXCompilerFlag)
include(CheckCXXSourceCompiles)

set(FMHA_CPU_ISA_FLAGS_portable "")
set(FMHA_CPU_ISA_FLAGS_avx2 -mavx2 -mfma)
set(FMHA_CPU_ISA_FLAGS_avx512 -mavx2 -mfma -mavx512f -mavx512bw -mavx512dq -mavx512vl)
set(FMHA_CPU_ISA_FLAGS_avx512bf16 ${FMHA_CPU_ISA_FLAGS_avx512} -mavx512bf16)
# What -march=native must define for this machine to run each path.
set(FMHA_CPU_ISA_MACROS_avx2 __AVX2__ __FMA__)
set(FMHA_CPU_ISA_MACROS_avx512 ${FMHA_CPU_ISA_MACROS_avx2} __AVX512F__ __AVX512BW__ __AVX512DQ__ __AVX512VL__)
set(FMHA_CPU_ISA_MACROS_avx512bf16 ${FMHA_CPU_ISA_MACROS_avx512} __AVX512BF16__)

set(FMHA_CPU_ISAS portable)
set(_fmha_cpu_x86 OFF)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86|x86)$")
  set(_fmha_cpu_x86 ON)
endif()

if(_fmha_cpu_x86)
  foreach(isa avx2 avx512 avx512bf16)
    string(REPLACE ";" " " _flags "${FMHA_CPU_ISA_FLAGS_${isa}}")
    check_cxx_compiler_flag("${_flags}" FMHA_CPU_COMPILER_HAS_${isa})
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

foreach(isa IN LISTS FMHA_CPU_ISAS)
  add_library(fmha_cpu_${isa} OBJECT src/cpu/fast_attention.cpp)
  target_include_directories(fmha_cpu_${isa} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_definitions(fmha_cpu_${isa} PRIVATE FMHA_CPU_ISA=${isa})
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # The inner loops: vectorized, FMA-contracted, no libm calls.
    target_compile_options(fmha_cpu_${isa} PRIVATE -Wall -Wextra -O3 -ffp-contract=fast ${FMHA_CPU_ISA_FLAGS_${isa}})
  endif()
  target_sources(fmha PRIVATE $<TARGET_OBJECTS:fmha_cpu_${isa}>)
  string(TOUPPER ${isa} _upper)
  target_compile_definitions(fmha PRIVATE FMHA_CPU_HAS_${_upper})
endforeach()
