# `PROGRAM --version` prints exactly "NAME VERSION" and a newline on standard output, nothing on
# standard error, and exits 0:
#   cmake -DPROGRAM=path -DEXPECT="planner 0.1.0" -P version_test.cmake
execute_process(COMMAND "${PROGRAM}" --version RESULT_VARIABLE code OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 60)
message("${out}${err}")
if(NOT "${code}" STREQUAL "0")
  message(FATAL_ERROR "exit code ${code}, expected 0")
endif()
if(NOT "${out}" STREQUAL "${EXPECT}\n")
  message(FATAL_ERROR "standard output is \"${out}\", expected \"${EXPECT}\\n\"")
endif()
if(NOT "${err}" STREQUAL "")
  message(FATAL_ERROR "standard error is not empty")
endif()
