# End to end: a small measuring run of calibrate under mpirun (4 timed runs per size on ranks that
# share two cores: its fits may miss their goal, so --accept-poor-fit), then the profile it wrote
# loaded through the cost model (profile_check, with at least MIN_CURVES curves and MIN_ATTENTION
# attention cores). EXPECT: more texts its output must contain.
#   cmake -DMPIRUN=... -DRANKS=2 -DCALIBRATE=... -DPROFILE_CHECK=... -DWORK_DIR=... [-DEXTRA=a|b]
#         [-DMIN_CURVES=n] [-DMIN_ATTENTION=n] [-DEXPECT=text|text] -P end_to_end.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
string(REPLACE "|" ";" extra "${EXTRA}")
string(REPLACE "|" ";" expect "${EXPECT}")
if(NOT DEFINED MIN_CURVES)
  set(MIN_CURVES 1)
endif()
if(NOT DEFINED MIN_ATTENTION)
  set(MIN_ATTENTION 0)
endif()
set(profile "${WORK_DIR}/calibrated.json")
execute_process(
  COMMAND "${MPIRUN}" --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none
          -np ${RANKS} "${CALIBRATE}" --backend mpi --min-bytes 8 --max-bytes 64K --factor 4 --warmup 1
          --iters 4 --gemm-tokens 32 --out "${profile}" --accept-poor-fit ${extra}
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY "${WORK_DIR}")
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "calibrate exited with ${code}")
endif()
foreach(expected "# all_reduce on world" "#wrong" "# fit:" "# wrote ${profile}" ${expect})
  string(FIND "${out}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "calibrate's output lacks \"${expected}\"")
  endif()
endforeach()
execute_process(COMMAND "${PROFILE_CHECK}" "${profile}" ${MIN_CURVES} ${MIN_ATTENTION}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "the cost model rejected the profile")
endif()
