# The CUDA backends. Included from the top-level CMakeLists when a CUDA compiler is found and
# FMHA_CUDA is ON. Every kernel instantiation (tier × direction × dtype × head dim) is its own
# generated .cu file, compiled only for the architectures its tier needs.
find_package(CUDAToolkit REQUIRED)

set(FMHA_CUDA_ARCHS "80;90" CACHE STRING
    "CUDA architectures to compile kernels for (e.g. 75;80;90; CUDA 13 supports sm_75 and up). The simt tier is built for all of them, sm80 for those >= 80")
set(FMHA_HEAD_DIMS "32;64;96;128;192;256" CACHE STRING
    "Head-dim buckets to compile GPU kernels for (subset of 32;64;96;128;192;256)")
set(FMHA_TUNED_HEAD_DIMS "64;128" CACHE STRING
    "Head-dim buckets compiled in every kernel variant (FMHA_SIMT_CONFIG, FMHA_SIMT_BWD_CONFIG, FMHA_SM80_FWD_CONFIG, FMHA_SM80_BWD_CONFIG, FMHA_SM90_FWD_CONFIG; of 64, 128, 256); the others get each tier's default only")
set(FMHA_DECODE_HEAD_DIMS "64;128;256" CACHE STRING
    "Head-dim buckets the sm80 decode kernel (KV cache, seqlen_q <= 16; fp16 and bf16) is compiled for, of those in FMHA_HEAD_DIMS")
option(FMHA_PTXAS_VERBOSE "Print registers and spills of every kernel (-Xptxas -v)" OFF)

set(_fmha_all_head_dims 32 64 96 128 192 256)
foreach(hd IN LISTS FMHA_HEAD_DIMS)
  if(NOT hd IN_LIST _fmha_all_head_dims)
    message(FATAL_ERROR "FMHA_HEAD_DIMS: ${hd} is not one of ${_fmha_all_head_dims}")
  endif()
endforeach()
# Every kernel variant of every tier compiles at these head dims; at 32, 96 and 192 some do not
# (the simt forward's micro tiles need multiples of 64, the sm80 backward's 8-warp variants split
# dQ's columns unevenly there), so a build tuned there would fail in its compile steps: refused
# here instead.
set(_fmha_tunable_head_dims 64 128 256)
foreach(hd IN LISTS FMHA_TUNED_HEAD_DIMS)
  if(NOT hd IN_LIST _fmha_tunable_head_dims)
    message(FATAL_ERROR "FMHA_TUNED_HEAD_DIMS: ${hd} cannot be tuned: not every kernel variant compiles at it "
                        "(the head dims that can: ${_fmha_tunable_head_dims})")
  endif()
endforeach()

set(_fmha_simt_archs "")
set(_fmha_sm80_archs "")
set(_fmha_sm90 OFF)
foreach(arch IN LISTS FMHA_CUDA_ARCHS)
  string(REGEX REPLACE "[^0-9]" "" arch_number "${arch}")
  if(arch_number LESS 75)
    message(FATAL_ERROR "FMHA_CUDA_ARCHS: ${arch} is below sm_75, the oldest architecture CUDA 13 supports")
  endif()
  if(arch_number EQUAL 90)
    # The Hopper tier needs the arch-specific target (wgmma, setmaxnreg): sm_90a machine code.
    set(_fmha_sm90 ON)
    set(arch 90)
  endif()
  list(APPEND _fmha_simt_archs ${arch})
  if(arch_number GREATER_EQUAL 80)
    list(APPEND _fmha_sm80_archs ${arch})
  endif()
endforeach()

function(_fmha_min_arch out archs)
  set(min 0)
  foreach(arch IN LISTS archs)
    string(REGEX REPLACE "[^0-9]" "" n "${arch}")
    if(min EQUAL 0 OR n LESS min)
      set(min ${n})
    endif()
  endforeach()
  set(${out} ${min} PARENT_SCOPE)
endfunction()
_fmha_min_arch(FMHA_SIMT_MIN_ARCH "${_fmha_simt_archs}")
_fmha_min_arch(FMHA_SM80_MIN_ARCH "${_fmha_sm80_archs}")

# Variants per tier and direction: must match kFwdVariants / kBwdVariants in simt_config.h and
# sm80_config.h (the dispatchers static_assert it).
set(FMHA_SIMT_FWD_VARIANTS 5)
set(FMHA_SIMT_BWD_VARIANTS 3)
set(FMHA_SM80_FWD_VARIANTS 5)
set(FMHA_SM80_BWD_VARIANTS 4)
set(FMHA_SM90_FWD_VARIANTS 7)
# The sm90 tier's head dims: the compiled buckets from 64 up (smaller ones run on sm80).
set(FMHA_SM90_HEAD_DIMS_X "")
set(FMHA_CUDA_SM90 0)
if(_fmha_sm90)
  set(FMHA_CUDA_SM90 1)
  foreach(hd IN LISTS FMHA_HEAD_DIMS)
    if(hd GREATER_EQUAL 64)
      string(APPEND FMHA_SM90_HEAD_DIMS_X "X(${hd}) ")
    endif()
  endforeach()
endif()
# Each tier's "compact" variants (the last of each direction: shapes for GPUs with less shared
# memory) are also compiled at these head dims outside FMHA_TUNED_HEAD_DIMS, where some defaults
# need more than those GPUs offer and the compact shapes fit.
set(FMHA_SIMT_COMPACT_HEAD_DIMS 32 96 192)
set(FMHA_SM80_COMPACT_HEAD_DIMS 96 192 256)
# The sm90 forward's `spec` variant is compiled at these head dims outside FMHA_TUNED_HEAD_DIMS too
# (FMHA_SM90_FWD_CONFIG=spec picks it there): at least those where it is the dense calls' default
# (sm90_config.h, default_fwd_variant: 64, 128 and 256; left out, the call runs pingpong).
set(FMHA_SM90_SPEC_HEAD_DIMS "64;128;256" CACHE STRING
    "Head dims where the sm90 forward's spec variant is compiled outside FMHA_TUNED_HEAD_DIMS (its dense default at 64, 128, 256)")
math(EXPR FMHA_SM90_FWD_SPEC "${FMHA_SM90_FWD_VARIANTS} - 1")
math(EXPR FMHA_SIMT_FWD_COMPACT "${FMHA_SIMT_FWD_VARIANTS} - 1")
math(EXPR FMHA_SIMT_BWD_COMPACT "${FMHA_SIMT_BWD_VARIANTS} - 1")
math(EXPR FMHA_SM80_FWD_COMPACT "${FMHA_SM80_FWD_VARIANTS} - 1")
math(EXPR FMHA_SM80_BWD_COMPACT "${FMHA_SM80_BWD_VARIANTS} - 1")
set(FMHA_TUNED_HEAD_DIMS_X "")
foreach(hd IN LISTS FMHA_TUNED_HEAD_DIMS)
  if(hd IN_LIST FMHA_HEAD_DIMS)
    string(APPEND FMHA_TUNED_HEAD_DIMS_X "X(${hd}) ")
  endif()
endforeach()

foreach(tier SIMT SM80)
  set(FMHA_${tier}_COMPACT_HEAD_DIMS_X "")
  foreach(hd IN LISTS FMHA_${tier}_COMPACT_HEAD_DIMS)
    if(hd IN_LIST FMHA_HEAD_DIMS AND NOT hd IN_LIST FMHA_TUNED_HEAD_DIMS)
      string(APPEND FMHA_${tier}_COMPACT_HEAD_DIMS_X "X(${hd}) ")
    endif()
  endforeach()
endforeach()

set(FMHA_SM90_SPEC_HEAD_DIMS_X "")
foreach(hd IN LISTS FMHA_SM90_SPEC_HEAD_DIMS)
  if(hd IN_LIST FMHA_HEAD_DIMS AND NOT hd IN_LIST FMHA_TUNED_HEAD_DIMS)
    string(APPEND FMHA_SM90_SPEC_HEAD_DIMS_X "X(${hd}) ")
  endif()
endforeach()

set(FMHA_DECODE_HEAD_DIMS_X "")
set(_fmha_decode_head_dims "")
foreach(hd IN LISTS FMHA_DECODE_HEAD_DIMS)
  if(hd IN_LIST FMHA_HEAD_DIMS)
    string(APPEND FMHA_DECODE_HEAD_DIMS_X "X(${hd}) ")
    list(APPEND _fmha_decode_head_dims ${hd})
  endif()
endforeach()

set(FMHA_HEAD_DIMS_X "")
foreach(hd IN LISTS FMHA_HEAD_DIMS)
  string(APPEND FMHA_HEAD_DIMS_X "X(${hd}) ")
endforeach()
string(REPLACE ";" "," FMHA_HEAD_DIMS_TEXT "${FMHA_HEAD_DIMS}")
string(REPLACE ";" "," FMHA_CUDA_ARCHS_TEXT "${FMHA_CUDA_ARCHS}")
set(_fmha_gen "${CMAKE_CURRENT_BINARY_DIR}/fmha_generated")
configure_file(src/cuda/instances.h.in "${_fmha_gen}/cuda/instances.h" @ONLY)

# Writes one instantiation file and appends it to the list `out`.
function(_fmha_instance out name header body)
  set(FMHA_INSTANCE_HEADER "${header}")
  set(FMHA_INSTANCE_BODY "${body}")
  configure_file("${PROJECT_SOURCE_DIR}/src/cuda/instance.cu.in" "${_fmha_gen}/${name}.cu" @ONLY)
  set(${out} ${${out}} "${_fmha_gen}/${name}.cu" PARENT_SCOPE)
endfunction()

# A variant entry "tag:value" (the file-name tag and the C++ template argument).
function(_fmha_split_variant entry tag_out value_out)
  string(FIND "${entry}" ":" colon)
  string(SUBSTRING "${entry}" 0 ${colon} tag)
  math(EXPR colon "${colon} + 1")
  string(SUBSTRING "${entry}" ${colon} -1 value)
  set(${tag_out} "${tag}" PARENT_SCOPE)
  set(${value_out} "${value}" PARENT_SCOPE)
endfunction()

# "v0:0;v1:1;...": every variant of a tier's direction.
function(_fmha_all_variants out count)
  math(EXPR last "${count} - 1")
  set(list "")
  foreach(v RANGE ${last})
    list(APPEND list "v${v}:${v}")
  endforeach()
  set(${out} "${list}" PARENT_SCOPE)
endfunction()

set(_fmha_simt_sources "")
set(_fmha_sm80_sources "")
set(_fmha_sm90_sources "")
foreach(hd IN LISTS FMHA_HEAD_DIMS)
  set(args "const fmha::cuda::AttentionArgs&, cudaStream_t")
  # Forward instances: every variant at the tuned head dims, the default one elsewhere.
  if(hd IN_LIST FMHA_TUNED_HEAD_DIMS)
    _fmha_all_variants(simt_variants ${FMHA_SIMT_FWD_VARIANTS})
    _fmha_all_variants(simt_bwd_variants ${FMHA_SIMT_BWD_VARIANTS})
    _fmha_all_variants(sm80_variants ${FMHA_SM80_FWD_VARIANTS})
    _fmha_all_variants(sm80_bwd_variants ${FMHA_SM80_BWD_VARIANTS})
  else()
    set(simt_variants "default:fmha::cuda::simt::default_fwd_variant(${hd})")
    set(simt_bwd_variants "default:fmha::cuda::simt::default_bwd_variant(${hd})")
    if(hd IN_LIST FMHA_SIMT_COMPACT_HEAD_DIMS)
      list(APPEND simt_variants "v${FMHA_SIMT_FWD_COMPACT}:${FMHA_SIMT_FWD_COMPACT}")
      list(APPEND simt_bwd_variants "v${FMHA_SIMT_BWD_COMPACT}:${FMHA_SIMT_BWD_COMPACT}")
    endif()
    set(sm80_variants "default:DEFAULT")
    set(sm80_bwd_variants "default:DEFAULT")
    if(hd IN_LIST FMHA_SM80_COMPACT_HEAD_DIMS)
      list(APPEND sm80_variants "v${FMHA_SM80_FWD_COMPACT}:${FMHA_SM80_FWD_COMPACT}")
      list(APPEND sm80_bwd_variants "v${FMHA_SM80_BWD_COMPACT}:${FMHA_SM80_BWD_COMPACT}")
    endif()
  endif()
  foreach(entry IN LISTS simt_variants)
    _fmha_split_variant("${entry}" tag v)
    _fmha_instance(_fmha_simt_sources "simt_fwd_fp32_hd${hd}_${tag}" "cuda/simt/simt_launch.cuh"
      "template fmha::Status fmha::cuda::simt::forward<${hd}, ${v}>(${args});\ntemplate size_t fmha::cuda::simt::forward_shared_bytes<${hd}, ${v}>();")
  endforeach()
  foreach(entry IN LISTS simt_bwd_variants)
    _fmha_split_variant("${entry}" tag v)
    _fmha_instance(_fmha_simt_sources "simt_bwd_fp32_hd${hd}_${tag}" "cuda/simt/simt_launch.cuh"
      "template fmha::Status fmha::cuda::simt::backward<${hd}, ${v}>(${args});\ntemplate size_t fmha::cuda::simt::backward_shared_bytes<${hd}, ${v}>(bool);")
  endforeach()
  if(_fmha_sm80_archs)
    foreach(dtype fp16 bf16 tf32)
      set(t "fmha::cuda::sm80::${dtype}_t")
      foreach(entry IN LISTS sm80_variants)
        _fmha_split_variant("${entry}" tag v)
        if(v STREQUAL "DEFAULT")
          set(v "fmha::cuda::sm80::default_fwd_variant(sizeof(${t}), ${hd})")
        endif()
        _fmha_instance(_fmha_sm80_sources "sm80_fwd_${dtype}_hd${hd}_${tag}" "cuda/sm80/sm80_launch.cuh"
          "template fmha::Status fmha::cuda::sm80::forward<${t}, ${hd}, ${v}>(${args});\ntemplate size_t fmha::cuda::sm80::forward_shared_bytes<${t}, ${hd}, ${v}>();")
      endforeach()
      foreach(entry IN LISTS sm80_bwd_variants)
        _fmha_split_variant("${entry}" tag v)
        if(v STREQUAL "DEFAULT")
          set(v "fmha::cuda::sm80::default_bwd_variant(sizeof(${t}), ${hd})")
        endif()
        _fmha_instance(_fmha_sm80_sources "sm80_bwd_${dtype}_hd${hd}_${tag}" "cuda/sm80/sm80_launch.cuh"
          "template fmha::Status fmha::cuda::sm80::backward<${t}, ${hd}, ${v}>(${args});\ntemplate size_t fmha::cuda::sm80::backward_shared_bytes<${t}, ${hd}, ${v}>(bool);")
      endforeach()
    endforeach()
    # Split tf32 (Precision::tf32x3): one configuration per direction at every head dim
    # (sm80_config.h split_fwd_variant / split_bwd_variant).
    set(t "fmha::cuda::sm80::tf32x3_t")
    set(v "fmha::cuda::sm80::default_fwd_variant_of<${t}>(${hd})")
    _fmha_instance(_fmha_sm80_sources "sm80_fwd_tf32x3_hd${hd}" "cuda/sm80/sm80_launch.cuh"
      "template fmha::Status fmha::cuda::sm80::forward<${t}, ${hd}, ${v}>(${args});\ntemplate size_t fmha::cuda::sm80::forward_shared_bytes<${t}, ${hd}, ${v}>();")
    set(v "fmha::cuda::sm80::default_bwd_variant_of<${t}>(${hd})")
    _fmha_instance(_fmha_sm80_sources "sm80_bwd_tf32x3_hd${hd}" "cuda/sm80/sm80_launch.cuh"
      "template fmha::Status fmha::cuda::sm80::backward<${t}, ${hd}, ${v}>(${args});\ntemplate size_t fmha::cuda::sm80::backward_shared_bytes<${t}, ${hd}, ${v}>(bool);")
  endif()
endforeach()

# The decode kernel: one instance per 16-bit dtype at each decode head dim (no variants).
if(_fmha_sm80_archs)
  foreach(hd IN LISTS _fmha_decode_head_dims)
    foreach(dtype fp16 bf16)
      set(t "fmha::cuda::sm80::${dtype}_t")
      _fmha_instance(_fmha_sm80_sources "sm80_decode_${dtype}_hd${hd}" "cuda/sm80/sm80_decode_launch.cuh"
        "template fmha::Status fmha::cuda::sm80::decode<${t}, ${hd}>(const fmha::cuda::DecodeArgs&, cudaStream_t);\ntemplate size_t fmha::cuda::sm80::decode_shared_bytes<${t}, ${hd}>();")
    endforeach()
  endforeach()
endif()

# sm90 forward instances: every variant at the tuned head dims, the default elsewhere and `spec`
# at FMHA_SM90_SPEC_HEAD_DIMS (fp16, bf16);
# fp32 (tf32) in the default variant at head dims up to 128.
if(_fmha_sm90)
  foreach(hd IN LISTS FMHA_HEAD_DIMS)
    if(hd LESS 64)
      continue()
    endif()
    set(sm90_variants "default:fmha::cuda::sm90::kFwdDefault")
    if(hd IN_LIST FMHA_TUNED_HEAD_DIMS)
      _fmha_all_variants(sm90_variants ${FMHA_SM90_FWD_VARIANTS})
    elseif(hd IN_LIST FMHA_SM90_SPEC_HEAD_DIMS)
      list(APPEND sm90_variants "v${FMHA_SM90_FWD_SPEC}:${FMHA_SM90_FWD_SPEC}")
    endif()
    foreach(dtype fp16 bf16)
      set(t "fmha::cuda::sm90::${dtype}_t")
      foreach(entry IN LISTS sm90_variants)
        _fmha_split_variant("${entry}" tag v)
        _fmha_instance(_fmha_sm90_sources "sm90_fwd_${dtype}_hd${hd}_${tag}" "cuda/sm90/sm90_launch.cuh"
          "template fmha::Status fmha::cuda::sm90::forward<${t}, ${hd}, ${v}>(const fmha::cuda::sm90::FwdParams&, int, cudaStream_t);\ntemplate size_t fmha::cuda::sm90::forward_shared_bytes<${t}, ${hd}, ${v}>();")
      endforeach()
      # The backward: one configuration per head dim, up to kBwdMaxHeadDim (256; BwdConfig).
      _fmha_instance(_fmha_sm90_sources "sm90_bwd_${dtype}_hd${hd}" "cuda/sm90/sm90_launch.cuh"
        "template fmha::Status fmha::cuda::sm90::backward<${t}, ${hd}>(const fmha::cuda::sm90::BwdParams&, cudaStream_t);\ntemplate size_t fmha::cuda::sm90::backward_shared_bytes<${t}, ${hd}>();")
    endforeach()
    # The tf32 forward (fp32 storage): the default configuration only, head dims up to
    # kTf32MaxHeadDim (128); one TU each.
    if(hd LESS_EQUAL 128)
      set(t "fmha::cuda::sm90::fp32_t")
      _fmha_instance(_fmha_sm90_sources "sm90_fwd_fp32_hd${hd}_default" "cuda/sm90/sm90_launch.cuh"
        "template fmha::Status fmha::cuda::sm90::forward<${t}, ${hd}, fmha::cuda::sm90::kFwdDefault>(const fmha::cuda::sm90::FwdParams&, int, cudaStream_t);\ntemplate size_t fmha::cuda::sm90::forward_shared_bytes<${t}, ${hd}, fmha::cuda::sm90::kFwdDefault>();")
    endif()
    # The split-tf32 forward and backward (fp32 storage, tf32x3): head dim 64 only
    # (kTf32x3MaxHeadDim, kTf32x3BwdMaxHeadDim).
    if(hd EQUAL 64)
      set(t "fmha::cuda::sm90::tf32x3_t")
      _fmha_instance(_fmha_sm90_sources "sm90_fwd_tf32x3_hd${hd}_default" "cuda/sm90/sm90_launch.cuh"
        "template fmha::Status fmha::cuda::sm90::forward<${t}, ${hd}, fmha::cuda::sm90::kFwdDefault>(const fmha::cuda::sm90::FwdParams&, int, cudaStream_t);\ntemplate size_t fmha::cuda::sm90::forward_shared_bytes<${t}, ${hd}, fmha::cuda::sm90::kFwdDefault>();")
      _fmha_instance(_fmha_sm90_sources "sm90_bwd_tf32x3_hd${hd}" "cuda/sm90/sm90_launch.cuh"
        "template fmha::Status fmha::cuda::sm90::backward<${t}, ${hd}>(const fmha::cuda::sm90::BwdParams&, cudaStream_t);\ntemplate size_t fmha::cuda::sm90::backward_shared_bytes<${t}, ${hd}>();")
    endif()
    # The tf32 backward (fp32 storage): head dims up to kTf32BwdMaxHeadDim (128; BwdConfig).
    if(hd LESS_EQUAL 128)
      set(t "fmha::cuda::sm90::fp32_t")
      _fmha_instance(_fmha_sm90_sources "sm90_bwd_fp32_hd${hd}" "cuda/sm90/sm90_launch.cuh"
        "template fmha::Status fmha::cuda::sm90::backward<${t}, ${hd}>(const fmha::cuda::sm90::BwdParams&, cudaStream_t);\ntemplate size_t fmha::cuda::sm90::backward_shared_bytes<${t}, ${hd}>();")
    endif()
  endforeach()
endif()

# Kernels of one tier: an object library with that tier's architectures, linked into fmha.
function(_fmha_tier name archs sources)
  add_library(${name} OBJECT ${sources})
  set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${archs}" POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${name} PRIVATE "${PROJECT_SOURCE_DIR}/include" "${PROJECT_SOURCE_DIR}/src" "${_fmha_gen}")
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-fno-strict-aliasing>)
  if(FMHA_PTXAS_VERBOSE)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
  target_sources(fmha PRIVATE $<TARGET_OBJECTS:${name}>)
endfunction()

_fmha_tier(fmha_cuda_simt "${_fmha_simt_archs}" "${_fmha_simt_sources}")
if(_fmha_sm80_archs)
  _fmha_tier(fmha_cuda_sm80 "${_fmha_sm80_archs}" "${_fmha_sm80_sources}")
  target_sources(fmha PRIVATE src/cuda/sm80/sm80_dispatch.cpp)
endif()

if(_fmha_sm90)
  # sm_90a only: the architecture-specific target that has wgmma and setmaxnreg.
  _fmha_tier(fmha_cuda_sm90 OFF "${_fmha_sm90_sources}")
  target_compile_options(fmha_cuda_sm90 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>)
  target_sources(fmha PRIVATE src/cuda/sm90/sm90_dispatch.cpp src/cuda/sm90/sm90_tma.cpp)
endif()

target_sources(fmha PRIVATE src/cuda/registry.cu src/cuda/merge.cu src/cuda/append_kv.cu src/cuda/common/host.cpp
  src/cuda/common/tune_device.cpp src/cuda/simt/simt_dispatch.cpp)
target_include_directories(fmha PRIVATE "${_fmha_gen}")
set_target_properties(fmha PROPERTIES CUDA_ARCHITECTURES "${FMHA_CUDA_ARCHS}")
target_compile_definitions(fmha PUBLIC FMHA_WITH_CUDA=1)
target_link_libraries(fmha PUBLIC CUDA::cudart)
