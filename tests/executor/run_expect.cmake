# start_program_test(): an empty scratch folder ${WORK}, and ${mpirun}: MPIRUN with the options
# every program test runs it with (as root, more ranks than cores, no single-copy transport).
macro(start_program_test)
  file(REMOVE_RECURSE ${WORK})
  file(MAKE_DIRECTORY ${WORK})
  set(mpirun ${MPIRUN} --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none)
endmacro()

# run_expect(RC COMMAND ... [EXPECT text ...] [OUTPUT var]): runs a command in ${WORK}, checks its
# exit code and that each text is on its standard error (bad input, exit code 2: in one line);
# leaves its standard error in last_stderr.
function(run_expect expected_rc)
  cmake_parse_arguments(ARG "" "OUTPUT" "COMMAND;EXPECT" ${ARGN})
  execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY ${WORK} TIMEOUT 120)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "exit code ${rc}, expected ${expected_rc}: ${ARG_COMMAND}\n${out}\n${err}")
  endif()
  foreach(text IN LISTS ARG_EXPECT)
    string(FIND "${err}" "${text}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "\"${text}\" not on stderr of ${ARG_COMMAND}:\n${err}")
    endif()
  endforeach()
  if(expected_rc EQUAL 2) # bad input: one line
    string(REGEX MATCHALL "executor: " lines "${err}")
    list(LENGTH lines count)
    if(NOT count EQUAL 1)
      message(FATAL_ERROR "bad input should be one line, got:\n${err}")
    endif()
  endif()
  if(ARG_OUTPUT)
    set(${ARG_OUTPUT} "${out}" PARENT_SCOPE)
  endif()
  set(last_stderr "${err}" PARENT_SCOPE)
endfunction()
