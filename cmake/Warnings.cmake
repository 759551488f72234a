# Warnings on for every target of the project (not for the system's headers).
add_library(shardplan_warnings INTERFACE)
target_compile_options(shardplan_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual -Wfloat-conversion
  -Wno-sign-conversion -Wnull-dereference -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough>)
add_library(shardplan::warnings ALIAS shardplan_warnings)
