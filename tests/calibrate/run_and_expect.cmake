# Runs a command and checks its exit code and, optionally, that standard error is exactly one line
# containing a text (EXPECT_ONE_LINE) or contains a text on any of its lines (EXPECT_CONTAINS).
# Used by the CLI tests:
#   cmake -DCOMMAND=a|b|c -DEXPECT_CODE=2 [-DEXPECT_ONE_LINE=text] [-DEXPECT_CONTAINS=text] [-DWORK_DIR=dir]
#         [-DOUTPUT_FILE=file] -P run_and_expect.cmake
# (the command's words are separated by '|'; OUTPUT_FILE receives its standard output). A command
# that does not end within a minute fails.
string(REPLACE "|" ";" command "${COMMAND}")
if(WORK_DIR)
  file(MAKE_DIRECTORY "${WORK_DIR}")
endif()
set(output OUTPUT_VARIABLE out)
if(OUTPUT_FILE)
  set(output OUTPUT_FILE "${OUTPUT_FILE}")
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE code ${output} ERROR_VARIABLE err
                WORKING_DIRECTORY "${WORK_DIR}" TIMEOUT 60)
message("${out}${err}")
if(NOT "${code}" STREQUAL "${EXPECT_CODE}")
  message(FATAL_ERROR "exit code ${code}, expected ${EXPECT_CODE}")
endif()
if(DEFINED EXPECT_ONE_LINE)
  string(REGEX REPLACE "\n$" "" trimmed "${err}")
  if(trimmed MATCHES "\n")
    message(FATAL_ERROR "standard error has more than one line")
  endif()
  string(FIND "${trimmed}" "${EXPECT_ONE_LINE}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "standard error does not contain: ${EXPECT_ONE_LINE}")
  endif()
endif()
if(DEFINED EXPECT_CONTAINS)
  string(FIND "${err}" "${EXPECT_CONTAINS}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "standard error does not contain: ${EXPECT_CONTAINS}")
  endif()
endif()
