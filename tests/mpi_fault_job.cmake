# One rank of an mpirun job fails on purpose (--inject-fault): the whole job must end, in time,
# with the expected exit code and a line that names the failed rank and its phase.
#   cmake -DMPIRUN=... -DRANKS=N -DCOMMAND=program|arg|... -DEXPECT_RC=code|nonzero
#         -DEXPECT=regex -DMAX_S=seconds -DWORK=folder [-DPLANNER=... -DDATA=...]
#         -P mpi_fault_job.cmake
# With PLANNER, a plan for N ranks of a tiny model (DATA/llama-tiny.json) is written to
# WORK/plan.json first. EXPECT is matched against standard error and output together (mpirun
# relays the ranks' standard error); MAX_S bounds the job's wall time, mpirun's start included.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

if(PLANNER)
  execute_process(
    COMMAND "${PLANNER}" recommend --model ${DATA}/llama-tiny.json --hardware ${DATA}/cpu-test.json
            --gpus ${RANKS} --seq-len 32 --global-batch ${RANKS} --micro-batch 1 --attention eager
            --checkpointing none --offload none --precision fp32 --recipe executor --strategy fsdp-full
            --flavour fsdp2 --emit plan
    RESULT_VARIABLE rc OUTPUT_VARIABLE plan ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "planner: exit code ${rc}\n${err}")
  endif()
  file(WRITE "${WORK}/plan.json" "${plan}")
endif()

string(REPLACE "|" ";" command "${COMMAND}")
string(TIMESTAMP start "%s")
execute_process(
  COMMAND "${MPIRUN}" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none
          -np ${RANKS} ${command}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY "${WORK}"
  TIMEOUT 120)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message(STATUS "exit code ${rc} after ${seconds} s:\n${err}")

if(EXPECT_RC STREQUAL "nonzero")
  if(rc EQUAL 0 OR NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "exit code ${rc}, expected a non-zero exit code")
  endif()
elseif(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}")
endif()
if(seconds GREATER MAX_S)
  message(FATAL_ERROR "the job took ${seconds} s, more than ${MAX_S} s")
endif()
if(NOT "${err}${out}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "no line matches \"${EXPECT}\"")
endif()
