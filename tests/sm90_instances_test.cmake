# The sm90 forward's generated instances at one head dim (cmake/cuda.cmake), as CTest runs it
# (cmake -P; tests/CMakeLists.txt passes SOURCE_DIR, WORK_DIR, GENERATOR, MAKE_PROGRAM, CXX and
# CUDA_COMPILER): the source tree configured at head dim 256 alone, tuned and not (nothing is
# built), and the forward instances each configuration generates:
#   tuned       every variant (v0 ... v6)
#   not tuned   the default and spec (v6), the dense calls' default there (FMHA_SM90_SPEC_HEAD_DIMS)
# and that a head dim where some variant of another tier does not compile (96) is refused as a
# tuned one.
cmake_minimum_required(VERSION 3.25)

# Configures the source tree at head dims `dims`, `tuned` of them tuned, into `build`: rc and log.
function(configure build dims tuned rc_out log_out)
  file(REMOVE_RECURSE "${build}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}" "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}"
            "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}" -DCMAKE_BUILD_TYPE=Release
            -DFMHA_CUDA_ARCHS=90 "-DFMHA_HEAD_DIMS=${dims}" "-DFMHA_TUNED_HEAD_DIMS=${tuned}" -DFMHA_DECODE_HEAD_DIMS=256
            -DFMHA_BUILD_TESTS=OFF -DFMHA_BUILD_CLI=OFF -DFMHA_PYTHON=OFF
    OUTPUT_VARIABLE log ERROR_VARIABLE log RESULT_VARIABLE rc)
  set(${rc_out} "${rc}" PARENT_SCOPE)
  set(${log_out} "${log}" PARENT_SCOPE)
endfunction()

# The sm90 forward instances (file names) that configuring with FMHA_TUNED_HEAD_DIMS=`tuned` generates.
function(instances_when tuned out)
  set(build "${WORK_DIR}/tuned-${tuned}")
  configure("${build}" 256 "${tuned}" rc log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "sm90_instances_test: configuring with FMHA_TUNED_HEAD_DIMS=${tuned} failed:\n${log}")
  endif()
  file(GLOB files RELATIVE "${build}/fmha_generated" "${build}/fmha_generated/sm90_fwd_bf16_hd256_*.cu")
  list(SORT files)
  set(${out} "${files}" PARENT_SCOPE)
  file(REMOVE_RECURSE "${build}")
endfunction()

function(expect_instances tuned)
  instances_when("${tuned}" got)
  set(want "")
  foreach(tag IN LISTS ARGN)
    list(APPEND want "sm90_fwd_bf16_hd256_${tag}.cu")
  endforeach()
  list(SORT want)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "sm90_instances_test: FMHA_TUNED_HEAD_DIMS=${tuned} generated\n  ${got}\nexpected\n  ${want}")
  endif()
  message(STATUS "sm90_instances_test: FMHA_TUNED_HEAD_DIMS=${tuned}: ${got}")
endfunction()

expect_instances(256 v0 v1 v2 v3 v4 v5 v6)
expect_instances("" default v6)

configure("${WORK_DIR}/tuned-96" "96;256" 96 rc log)
file(REMOVE_RECURSE "${WORK_DIR}/tuned-96")
if(rc EQUAL 0 OR NOT log MATCHES "FMHA_TUNED_HEAD_DIMS: 96 cannot be tuned")
  message(FATAL_ERROR "sm90_instances_test: FMHA_TUNED_HEAD_DIMS=96 was not refused (rc ${rc}):\n${log}")
endif()
message(STATUS "sm90_instances_test: FMHA_TUNED_HEAD_DIMS=96 refused")
