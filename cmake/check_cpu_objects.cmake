# Fails when a compilation of the fast CPU path defines a weak symbol outside its own namespace
# (fmha::cpu::<ISA>::). The linker keeps one copy of a weak symbol for the whole program, taken
# from whichever object comes first, so a standard-library function emitted by the AVX-512
# compilation could end up running in the portable path, or in code outside the CPU backend, on a
# CPU without AVX-512 (see src/common/parallel.h).
#   cmake -DNM=<nm> -DISA=<path name> -DOBJECTS=<object files, ;-separated> -P check_cpu_objects.cmake
set(_shared "")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE _symbols RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REPLACE "\n" ";" _lines "${_symbols}")
  foreach(line IN LISTS _lines)
    if(NOT line MATCHES "^[0-9a-fA-F]+ [WVu] (.*)$")
      continue()
    endif()
    set(_name "${CMAKE_MATCH_1}")
    # The C++ personality routine's reference is data, the same in every object.
    if(_name MATCHES "fmha::cpu::${ISA}::" OR _name STREQUAL "DW.ref.__gxx_personality_v0")
      continue()
    endif()
    list(APPEND _shared "${_name}")
  endforeach()
endforeach()
if(_shared)
  list(JOIN _shared "\n  " _text)
  message(FATAL_ERROR "the ${ISA} CPU path defines weak symbols shared with other code:\n  ${_text}")
endif()
message(STATUS "the ${ISA} CPU path keeps its code to itself")
