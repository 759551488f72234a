# cmake --install puts the programs and their data where the installed programs find them, away
# from the source tree; a wrong SHARDPLAN_DATA_DIR is one line and exit code 2.
#   cmake -DBUILD_DIR=... -DWORK=... -P install_test.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${err}")
endif()
foreach(f bin/planner bin/calibrate bin/executor share/shardplan/hardware_profiles/h100-sxm5-80gb.json
          share/shardplan/examples/models/llama-2-7b/config.json)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# The installed planner lists the installed profiles and plans with the installed presets.
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=SHARDPLAN_DATA_DIR ${WORK}/prefix/bin/planner hardware
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY ${WORK})
if(NOT rc EQUAL 0 OR NOT out MATCHES "h100-sxm5-80gb" OR NOT out MATCHES "${WORK}/prefix/share/shardplan/hardware_profiles")
  message(FATAL_ERROR "installed planner hardware (rc ${rc}):\n${out}${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=SHARDPLAN_DATA_DIR ${WORK}/prefix/bin/planner estimate
                        --model llama-2-7b --hardware h100-sxm5-80gb --gpus 8 --strategy zero3
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY ${WORK})
if(NOT rc EQUAL 0 OR NOT out MATCHES "llama-2-7b")
  message(FATAL_ERROR "installed planner estimate (rc ${rc}):\n${out}${err}")
endif()

# A data folder without the data: exit code 2, one line naming the variable.
execute_process(COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_DATA_DIR=${WORK}/nowhere ${WORK}/prefix/bin/planner hardware
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY ${WORK})
string(REGEX REPLACE "\n$" "" one "${err}")
if(NOT rc EQUAL 2 OR NOT err MATCHES "SHARDPLAN_DATA_DIR" OR one MATCHES "\n" OR NOT out STREQUAL "")
  message(FATAL_ERROR "wrong SHARDPLAN_DATA_DIR: rc ${rc}, stdout:\n${out}\nstderr:\n${err}")
endif()

# A data folder whose profile folder is empty: the same.
file(MAKE_DIRECTORY ${WORK}/empty/hardware_profiles ${WORK}/empty/examples/models)
execute_process(COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_DATA_DIR=${WORK}/empty ${WORK}/prefix/bin/planner hardware
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY ${WORK})
if(NOT rc EQUAL 2 OR NOT err MATCHES "no profiles" OR NOT out STREQUAL "")
  message(FATAL_ERROR "empty profile folder: rc ${rc}, stdout:\n${out}\nstderr:\n${err}")
endif()
