# The CUDA backends. Included from the top-level CMakeLists when a CUDA compiler is found and
# FMHA_CUDA is ON.
find_package(CUDAToolkit REQUIRED)

# Architectures to build real machine code for (PTX is embedded for the highest one).
set(FMHA_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures to compile kernels for (e.g. 75;80;90)")

target_sources(fmha PRIVATE src/cuda/registry.cu)
set_target_properties(fmha PROPERTIES CUDA_ARCHITECTURES "${FMHA_CUDA_ARCHS}")
target_compile_definitions(fmha PUBLIC FMHA_WITH_CUDA=1)
target_link_libraries(fmha PUBLIC CUDA::cudart)
