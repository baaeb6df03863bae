# Fails when a compilation of the fast CPU path has code outside its own namespace
# (fmha::cpu::<ISA>::) that uses AVX (VEX/EVEX-encoded instructions, ymm/zmm/mask registers).
# Such code is an inline function of a shared header or a standard-library template emitted out of
# line; the linker keeps one copy of it for the whole program, taken from whichever object comes
# first, so AVX-512 code there could run in the portable path, or outside the CPU backend, on a
# CPU without AVX-512. src/cpu/isa_target.h is what keeps it out.
#   cmake -DOBJDUMP=<objdump> -DISA=<path name> -DOBJECTS=<object files, ;-separated> -P check_cpu_objects.cmake
set(_offenders "")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${OBJDUMP} -d -C --no-show-raw-insn ${object} OUTPUT_VARIABLE _text RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${OBJDUMP} failed on ${object}")
  endif()
  # One list element per line: characters that CMake lists treat specially are replaced first.
  string(REPLACE ";" "," _text "${_text}")
  string(REPLACE "[" "(" _text "${_text}")
  string(REPLACE "]" ")" _text "${_text}")
  string(REPLACE "\n" ";" _lines "${_text}")
  set(_function "")
  set(_own OFF)
  foreach(line IN LISTS _lines)
    if(line MATCHES "^[0-9a-f]+ <(.*)>:$")
      set(_function "${CMAKE_MATCH_1}")
      string(FIND "${_function}" "fmha::cpu::${ISA}::" _at)
      if(_at EQUAL -1)
        set(_own OFF)
      else()
        set(_own ON)
      endif()
    elseif(NOT _own AND line MATCHES "^ +[0-9a-f]+:\t(v[a-z0-9]+|.*%[yz]mm|.*%k[0-7])")
      list(APPEND _offenders "${_function}")
      set(_own ON)  # one report per function
    endif()
  endforeach()
endforeach()
if(_offenders)
  list(REMOVE_DUPLICATES _offenders)
  list(JOIN _offenders "\n  " _names)
  message(FATAL_ERROR "the ${ISA} CPU path has AVX code outside its namespace, where the linker may share it:\n  ${_names}")
endif()
message(STATUS "the ${ISA} CPU path keeps its AVX code to itself")
