# Unity (jumbo) builds: a target's sources are compiled in batches, each batch one translation unit
# that #includes its files. Every translation unit of dtensor pays for LibTorch's headers (loading the
# precompiled header alone takes 1.7 s) and for the inline torch code it instantiates; a batch pays
# once for all its files. docs/architecture.md ("Build") has the measurements.
#
# CMake's own UNITY_BUILD would do the batching, but its batch files #include sources by absolute
# path, so a fresh clone in another directory misses ccache's direct mode (the batch file's text
# differs) and every batch is preprocessed again to look it up. These batch files name their sources
# relative to themselves: the same text in every clone whose build tree sits at the same place in it.
#
# Batches never cross a directory (a batch is one layer's or one test family's files) and hold at most
# DTENSOR_UNITY_BATCH_SIZE files, listed in the target's order; a batch compiles with the union of its
# files' own COMPILE_OPTIONS and COMPILE_DEFINITIONS. Files in one batch share a translation
# unit, so their file-local names (anonymous namespaces, statics) must differ; a clash is a compile
# error naming both, never a silent merge. DTENSOR_UNITY_BUILD=OFF compiles every file on its own, for
# an edit-compile loop where one file changes at a time.

option(DTENSOR_UNITY_BUILD "Compile sources in batches (unity builds): a much faster cold build" ON)
set(DTENSOR_UNITY_BATCH_SIZE 8 CACHE STRING "Most source files per unity batch")

# dtensor_unity_batches(target): replaces the target's .cpp sources by batch files under
# <build>/unity/<target>/ (a directory with one file keeps it). Call it after the target's last
# target_sources(), and after its sources' properties are set. The files leave the target rather than
# being marked HEADER_FILE_ONLY: that property belongs to the directory, so another target compiling the
# same file (dtensor_nccl_compile_check) would lose it.
function(dtensor_unity_batches target)
  if(NOT DTENSOR_UNITY_BUILD)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  get_target_property(target_source_dir ${target} SOURCE_DIR)
  set(batch_dir "${CMAKE_BINARY_DIR}/unity/${target}")
  set(directories "")
  set(kept "")  # sources the target keeps as they are
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.cpp$")
      list(APPEND kept "${source}")
      continue()
    endif()
    get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${target_source_dir}")
    get_filename_component(directory "${path}" DIRECTORY)
    file(RELATIVE_PATH key "${PROJECT_SOURCE_DIR}" "${directory}")
    string(MAKE_C_IDENTIFIER "${key}" key)
    list(APPEND directories ${key})
    list(APPEND files_${key} "${path}")
  endforeach()
  list(REMOVE_DUPLICATES directories)
  set(batch_files "")
  foreach(key IN LISTS directories)
    list(LENGTH files_${key} count)
    if(count EQUAL 1)
      list(APPEND kept ${files_${key}})  # a batch of one would only rename the file
      continue()
    endif()
    # As many batches as the size allows, filled evenly (9 files in batches of 8 make 5 + 4, not 8 + 1).
    math(EXPR batches "(${count} + ${DTENSOR_UNITY_BATCH_SIZE} - 1) / ${DTENSOR_UNITY_BATCH_SIZE}")
    set(index 0)
    foreach(path IN LISTS files_${key})
      math(EXPR batch "${index} * ${batches} / ${count}")
      file(RELATIVE_PATH relative "${batch_dir}" "${path}")
      string(APPEND text_${key}_${batch} "#include \"${relative}\"\n")
      # A file's own compile options and definitions go to its batch.
      foreach(property COMPILE_OPTIONS COMPILE_DEFINITIONS)
        get_source_file_property(values "${path}" TARGET_DIRECTORY ${target} ${property})
        if(values)
          list(APPEND ${property}_${key}_${batch} ${values})
        endif()
      endforeach()
      math(EXPR index "${index} + 1")
    endforeach()
    math(EXPR last "${batches} - 1")
    foreach(batch RANGE ${last})
      set(batch_file "${batch_dir}/${key}_${batch}.cpp")
      # Written only when its text changes, so that configuring again rebuilds nothing.
      file(CONFIGURE OUTPUT "${batch_file}" CONTENT "// Unity batch of ${target} (cmake/Unity.cmake)\n${text_${key}_${batch}}"
        @ONLY)
      foreach(property COMPILE_OPTIONS COMPILE_DEFINITIONS)
        if(${property}_${key}_${batch})
          list(REMOVE_DUPLICATES ${property}_${key}_${batch})
          set_source_files_properties("${batch_file}" TARGET_DIRECTORY ${target} PROPERTIES
            ${property} "${${property}_${key}_${batch}}")
        endif()
      endforeach()
      list(APPEND batch_files "${batch_file}")
    endforeach()
  endforeach()
  set_property(TARGET ${target} PROPERTY SOURCES ${kept} ${batch_files})
endfunction()
