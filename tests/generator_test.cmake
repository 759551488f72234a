# A document a program writes names the program's project and version in "generator":
#   cmake -DCOMMAND="planner;recommend;...;--emit;plan" -DEXPECT="shardplan 0.1.0" -P generator_test.cmake
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 120)
if(NOT "${code}" STREQUAL "0")
  message(FATAL_ERROR "exit code ${code}, expected 0: ${err}")
endif()
string(JSON generator ERROR_VARIABLE problem GET "${out}" generator)
if(problem)
  message(FATAL_ERROR "no \"generator\" in the document: ${problem}")
endif()
if(NOT "${generator}" STREQUAL "${EXPECT}")
  message(FATAL_ERROR "\"generator\" is \"${generator}\", expected \"${EXPECT}\"")
endif()
