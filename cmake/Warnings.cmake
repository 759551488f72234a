# Warnings on for every target of the project (not for the system's headers), and errors: a warning
# in project code fails the build (SHARDPLAN_WERROR=OFF turns that off, for a compiler the project
# is not built with in CI).
option(SHARDPLAN_WERROR "Treat warnings in project code as errors" ON)
add_library(shardplan_warnings INTERFACE)
target_compile_options(shardplan_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual -Wfloat-conversion
  -Wno-sign-conversion -Wnull-dereference -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough>)
if(SHARDPLAN_WERROR)
  target_compile_options(shardplan_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  # GCC 12 at -O2 reports libstdc++'s own std::string copies inlined into the caller
  # (char_traits.h's __builtin_memcpy "forming offset [32, N] is out of the bounds [0, 32]", or
  # its "specified bound between 9223372036854775810 and 18446744073709551615 exceeds maximum
  # object size" when a one-character literal is assigned; basic_string.h's constructor as a
  # "potential null pointer dereference"), wherever a string built from a literal or fmt::format
  # is moved or assigned: the strings are sound, so these three stay warnings there.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(shardplan_warnings INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=array-bounds -Wno-error=null-dereference
      -Wno-error=stringop-overflow>)
  endif()
endif()
add_library(shardplan::warnings ALIAS shardplan_warnings)
