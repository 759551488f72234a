# The header-only dependencies from a prepared folder instead of the system's packages, for a
# machine that has a compiler, CMake and the CUDA toolkit but no package manager (a rented GPU
# node): `scripts/gpu_check.sh --prepare DIR` fills DIR on a machine that has the packages, and
# `-DSHARDPLAN_DEPS_DIR=DIR` builds from it. DIR holds
#
#   include/   nlohmann/, CLI/, fmt/, Eigen/, doctest/   (the headers, as the packages install them)
#   cmake/     doctest.cmake, doctestAddTests.cmake      (doctest_discover_tests)
#   README     what was copied, from which package and version
#
# Each library becomes an INTERFACE IMPORTED target with the name its package's CMake config
# gives, so the rest of the build does not know where it came from. fmt is used in its
# header-only mode (FMT_HEADER_ONLY: fmt/format.h then includes format-inl.h, as the package's
# own fmt::fmt-header-only target does), so no compiled fmt library is needed.
set(_deps_include ${SHARDPLAN_DEPS_DIR}/include)
if(NOT IS_DIRECTORY ${_deps_include})
  message(FATAL_ERROR "SHARDPLAN_DEPS_DIR: ${SHARDPLAN_DEPS_DIR} has no include/ folder "
                      "(fill it with scripts/gpu_check.sh --prepare ${SHARDPLAN_DEPS_DIR})")
endif()

# shardplan_prepared_library(TARGET HEADER [DEFINITIONS...]): HEADER (relative to include/) must
# be there; the target adds include/ as a system folder (no warnings from the libraries' code).
function(shardplan_prepared_library target header)
  if(NOT EXISTS ${_deps_include}/${header})
    message(FATAL_ERROR "SHARDPLAN_DEPS_DIR: ${_deps_include}/${header} is missing "
                        "(fill the folder with scripts/gpu_check.sh --prepare)")
  endif()
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${_deps_include})
  if(ARGN)
    set_target_properties(${target} PROPERTIES INTERFACE_COMPILE_DEFINITIONS "${ARGN}")
  endif()
endfunction()

shardplan_prepared_library(nlohmann_json::nlohmann_json nlohmann/json.hpp)
shardplan_prepared_library(CLI11::CLI11 CLI/CLI.hpp)
shardplan_prepared_library(fmt::fmt fmt/format-inl.h FMT_HEADER_ONLY=1)
shardplan_prepared_library(Eigen3::Eigen Eigen/Dense)
if(SHARDPLAN_BUILD_TESTS)
  shardplan_prepared_library(doctest::doctest doctest/doctest.h)
  # include(doctest) in tests/ finds doctest_discover_tests here, as doctestConfig.cmake arranges.
  if(NOT EXISTS ${SHARDPLAN_DEPS_DIR}/cmake/doctest.cmake)
    message(FATAL_ERROR "SHARDPLAN_DEPS_DIR: ${SHARDPLAN_DEPS_DIR}/cmake/doctest.cmake is missing")
  endif()
  list(APPEND CMAKE_MODULE_PATH ${SHARDPLAN_DEPS_DIR}/cmake)
endif()
message(STATUS "shardplan: nlohmann_json, CLI11, fmt (header-only), Eigen3 and doctest (for the "
               "tests) from ${SHARDPLAN_DEPS_DIR}")
