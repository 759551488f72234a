# Compile time: nlohmann/json and fmt are the heaviest headers the project parses (json alone
# costs a C++ file more than most of its own code), and more than half of the files reach them
# through the documents' headers. shardplan_precompile_headers(DIR) gives every C++ library and
# program defined under DIR (recursively) a shared precompiled header of them, built once per set
# of flags that a precompiled header must match instead of once per target: neither compiler
# accepts a header precompiled with another position-independence setting, clang refuses one built
# with other sanitizers (the libFuzzer targets' -fsanitize=fuzzer), and GCC one built without the
# project's warnings (-Wpedantic changes what it predefines). Definitions may differ: a target's own
# -D flags come after the header and touch nothing in it.
# SHARDPLAN_PRECOMPILED_HEADERS=OFF turns it off; the code includes what it uses either way, so the
# build does not depend on it.
set(_shardplan_pch_headers
  "$<$<COMPILE_LANGUAGE:CXX>:<nlohmann/json.hpp$<ANGLE-R>>"
  "$<$<COMPILE_LANGUAGE:CXX>:<fmt/format.h$<ANGLE-R>>")

# _shardplan_pch_host(PIC WARNINGS OPTIONS OUT): the host target for that position independence,
# with or without the project's warnings, and those compile options, made on first use; its only
# source is an empty file, so it compiles nothing but the header.
function(_shardplan_pch_host pic warnings options out)
  string(MD5 key "${pic};${warnings};${options}")
  string(SUBSTRING ${key} 0 8 key)
  set(host shardplan_pch_${key})
  if(NOT TARGET ${host})
    set(source ${PROJECT_BINARY_DIR}/shardplan_pch.cpp)
    if(NOT EXISTS ${source})
      file(WRITE ${source} "// The host of a shared precompiled header (cmake/PrecompiledHeaders.cmake).\n")
    endif()
    add_library(${host} OBJECT ${source})
    target_link_libraries(${host} PRIVATE nlohmann_json::nlohmann_json fmt::fmt)
    if(warnings)
      target_link_libraries(${host} PRIVATE shardplan::warnings)
    endif()
    set_target_properties(${host} PROPERTIES POSITION_INDEPENDENT_CODE ${pic})
    if(options)
      set_target_properties(${host} PROPERTIES COMPILE_OPTIONS "${options}")
    endif()
    target_precompile_headers(${host} PRIVATE ${_shardplan_pch_headers})
  endif()
  set(${out} ${host} PARENT_SCOPE)
endfunction()

function(shardplan_precompile_headers dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    get_target_property(imported ${target} IMPORTED)
    if(imported OR NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
      continue()
    endif()
    get_target_property(sources ${target} SOURCES)
    if(NOT sources MATCHES "\\.cpp" OR target MATCHES "^shardplan_pch_")
      continue()
    endif()
    get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
    if(type MATCHES "^(SHARED_LIBRARY|MODULE_LIBRARY)$")
      set(pic ON)
    elseif(NOT pic)
      set(pic OFF)
    endif()
    get_target_property(options ${target} COMPILE_OPTIONS)
    if(NOT options)
      set(options "")
    endif()
    get_target_property(links ${target} LINK_LIBRARIES)
    if(links MATCHES "shardplan::warnings")
      set(warnings ON)
    else()
      set(warnings OFF)
    endif()
    _shardplan_pch_host(${pic} ${warnings} "${options}" host)
    target_precompile_headers(${target} REUSE_FROM ${host})
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    shardplan_precompile_headers(${sub})
  endforeach()
endfunction()
