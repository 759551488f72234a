# Compile time: nlohmann/json and fmt are the heaviest headers the project parses (json alone
# costs a C++ file more than most of its own code), and more than half of the files reach them
# through the documents' headers. shardplan_precompile_headers(DIR) gives every C++ library and
# program defined under DIR (recursively) a precompiled header of them, built once per target
# instead of parsed once per file. SHARDPLAN_PRECOMPILED_HEADERS=OFF turns it off; the code
# includes what it uses either way, so the build does not depend on it.
function(shardplan_precompile_headers dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    get_target_property(imported ${target} IMPORTED)
    if(imported OR NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
      continue()
    endif()
    get_target_property(sources ${target} SOURCES)
    if(NOT sources MATCHES "\\.cpp")
      continue()
    endif()
    target_precompile_headers(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CXX>:<nlohmann/json.hpp$<ANGLE-R>>"
      "$<$<COMPILE_LANGUAGE:CXX>:<fmt/format.h$<ANGLE-R>>")
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    shardplan_precompile_headers(${sub})
  endforeach()
endfunction()
