# The installed package, end to end, as CTest runs it after the build (cmake -P; tests/CMakeLists.txt
# passes the variables below), one CTest test per STEP:
#   install             installs the build tree into a fresh prefix, WORK_DIR/prefix
#   consumer_cmake      configures, builds and runs examples/consumer against it (find_package)
#   consumer_pkgconfig  compiles examples/consumer/main.cpp with `pkg-config --cflags --libs fmha`
#                       and runs it; skipped where pkg-config is missing
#
# Inputs: STEP, BUILD_DIR, SOURCE_DIR, WORK_DIR, CONFIG, LIBDIR, GENERATOR, MAKE_PROGRAM, CXX,
# CXX_FLAGS, CUDA_ROOT (the CUDA toolkit fmha was built with; empty for CPU-only builds).
cmake_minimum_required(VERSION 3.25)
set(prefix "${WORK_DIR}/prefix")

function(run)
  string(REPLACE ";" " " line "${ARGN}")
  message(STATUS "package_test: ${line}")
  execute_process(COMMAND ${ARGN} COMMAND_ERROR_IS_FATAL ANY)
endfunction()

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE "${prefix}")
  run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")
  foreach(file include/fmha/fmha.h ${LIBDIR}/cmake/fmha/fmhaConfig.cmake ${LIBDIR}/cmake/fmha/fmhaConfigVersion.cmake
               ${LIBDIR}/cmake/fmha/fmhaTargets.cmake ${LIBDIR}/pkgconfig/fmha.pc)
    if(NOT EXISTS "${prefix}/${file}")
      message(FATAL_ERROR "package_test: ${file} was not installed")
    endif()
  endforeach()

elseif(STEP STREQUAL "consumer_cmake")
  # A fresh build directory each time, so that nothing cached from an earlier install is reused.
  set(build "${WORK_DIR}/consumer-cmake")
  file(REMOVE_RECURSE "${build}")
  set(cuda_hint "")
  if(CUDA_ROOT)
    set(cuda_hint "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
  endif()
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/consumer" -B "${build}" -G "${GENERATOR}"
      "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_BUILD_TYPE=${CONFIG}" "-DCMAKE_CXX_COMPILER=${CXX}"
      "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_PREFIX_PATH=${prefix}" ${cuda_hint})
  run(${CMAKE_COMMAND} --build "${build}" --config "${CONFIG}")
  set(program "${build}/fmha_consumer")
  if(NOT EXISTS "${program}")
    set(program "${build}/${CONFIG}/fmha_consumer")  # multi-config generators
  endif()
  run("${program}")

elseif(STEP STREQUAL "consumer_pkgconfig")
  find_program(pkg_config NAMES pkg-config pkgconf)
  if(NOT pkg_config)
    message("package_test: pkg-config not found; skipping the pkg-config check")
    return()
  endif()
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
  execute_process(COMMAND "${pkg_config}" --cflags --libs fmha
    OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  message(STATUS "package_test: pkg-config --cflags --libs fmha: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  separate_arguments(cxx_flags UNIX_COMMAND "${CXX_FLAGS}")
  set(program "${WORK_DIR}/consumer-pkgconfig")
  file(REMOVE "${program}")
  # C++17: the oldest standard the public headers promise.
  run("${CXX}" ${cxx_flags} -std=c++17 "${SOURCE_DIR}/examples/consumer/main.cpp" ${flags} -o "${program}")
  # The program finds libcudart (a shared library) where pkg-config's -L says it is.
  execute_process(COMMAND "${pkg_config}" --libs-only-L fmha
    OUTPUT_VARIABLE lib_dirs OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  string(REGEX REPLACE "(^| )-L" "\\1" lib_dirs "${lib_dirs}")
  string(REPLACE " " ":" lib_dirs "${lib_dirs}")
  set(ENV{LD_LIBRARY_PATH} "${lib_dirs}:$ENV{LD_LIBRARY_PATH}")
  run("${program}")

else()
  message(FATAL_ERROR "package_test: STEP must be install, consumer_cmake or consumer_pkgconfig (got '${STEP}')")
endif()
