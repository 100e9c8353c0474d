# Precompiled headers, made once and shared. LibTorch's ATen/ATen.h is some 300k lines after
# preprocessing; parsing it takes longer than compiling most of dtensor's files. Two headers are
# compiled, each by a target of its own: dtensor_pch (ATen, c10d's Backend) for the library, the
# examples and the benchmarks, and dtensor_test_pch (the same plus GoogleTest and GoogleMock, at test
# code's -O1) for every test program. docs/architecture.md ("Build") has the measurements.
#
# GCC uses a precompiled header only in a compile with the same code model, optimization and
# command-line macros as the one that made it, and otherwise parses the header as text without a
# word (-Winvalid-pch only warns). Hence the owners of the headers are targets with no macros of
# their own; every program compiles as position-independent code (-fPIC, as the libraries do, rather
# than the executables' usual -fPIE); and -Werror=invalid-pch makes a header that cannot be used an
# error instead of a silent slowdown. Under clang (./dev fuzz) the headers are included as text
# (-include) instead: clang's precompiled header records the absolute paths it was made from, so a
# fresh clone elsewhere made different bytes and ccache missed every object that used it (the fuzz
# build recompiled in full in each CI run).

# dtensor_add_precompiled_header(name HEADERS header... LINK target...): the target `name` compiles
# `header...` with the include directories and macros of `target...`.
function(dtensor_add_precompiled_header name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "HEADERS;LINK")
  set(anchor "${CMAKE_BINARY_DIR}/pch/${name}.cpp")
  file(CONFIGURE OUTPUT "${anchor}" CONTENT "// Compiles the precompiled header ${name} (cmake/PrecompiledHeaders.cmake).\n")
  add_library(${name} OBJECT "${anchor}")
  target_link_libraries(${name} PRIVATE ${ARG_LINK})
  target_precompile_headers(${name} PRIVATE ${ARG_HEADERS})
  set_target_properties(${name} PROPERTIES DTENSOR_PCH_HEADERS "${ARG_HEADERS}")
endfunction()

# dtensor_use_precompiled_header(target name): `target` compiles with the header `name` made.
function(dtensor_use_precompiled_header target name)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    get_target_property(headers ${name} DTENSOR_PCH_HEADERS)
    foreach(header IN LISTS headers)
      string(REGEX REPLACE "^<(.*)>$" "\\1" header "${header}")
      target_compile_options(${target} PRIVATE "SHELL:-include ${header}")
    endforeach()
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM ${name})
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)  # no -fPIE ...
    target_compile_options(${target} PRIVATE -fPIC)                            # ... but the libraries' -fPIC
  endif()
  target_compile_options(${target} PRIVATE -Werror=invalid-pch)
endfunction()
