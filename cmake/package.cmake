# fmha as an installed C++ package: `cmake --install` puts libfmha, include/fmha, a CMake package
# (find_package(fmha CONFIG) -> fmha::fmha) and a pkg-config file (fmha.pc) under the prefix.
# Included from the top-level CMakeLists once the fmha target is complete.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FMHA_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/fmha" CACHE STRING
    "Where the CMake package files go, relative to the install prefix")

# The CUDA tiers reach libfmha as object files ($<TARGET_OBJECTS:...>), not as link dependencies,
# so the export set holds fmha alone; its interface names only Threads and CUDA::cudart.
install(TARGETS fmha EXPORT fmhaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/fmha DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT fmhaTargets NAMESPACE fmha:: DESTINATION ${FMHA_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/fmhaConfig.cmake.in "${PROJECT_BINARY_DIR}/fmhaConfig.cmake"
  INSTALL_DESTINATION ${FMHA_INSTALL_CMAKEDIR})
# 0.x releases: a new minor version may break the API, so only the same minor version matches.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/fmhaConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/fmhaConfig.cmake" "${PROJECT_BINARY_DIR}/fmhaConfigVersion.cmake"
  DESTINATION ${FMHA_INSTALL_CMAKEDIR})

# pkg-config: the same interface as fmha::fmha. The prefix is found from where fmha.pc lies
# (${pcfiledir}), so `cmake --install --prefix <dir>` and a moved install tree both stay right.
set(FMHA_PC_CFLAGS "")
set(FMHA_PC_LIBS "-pthread")
if(FMHA_WITH_CUDA)
  set(FMHA_PC_CFLAGS " -DFMHA_WITH_CUDA=1")
  string(APPEND FMHA_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(FMHA_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(FMHA_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(FMHA_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  # lib/pkgconfig -> ../.. ; lib/x86_64-linux-gnu/pkgconfig -> ../../..
  string(REGEX REPLACE "[^/]+" ".." up "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  set(FMHA_PC_PREFIX "\${pcfiledir}/${up}")
endif()
configure_file(cmake/fmha.pc.in "${PROJECT_BINARY_DIR}/fmha.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/fmha.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
