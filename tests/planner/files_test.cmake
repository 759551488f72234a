# The planner program's files, where only a process shows them: standard output to a full device,
# a character device given as --svg, reads that must not wait or fill the memory, a write cut by
# a file size limit, twenty processes writing one --svg at once.
#   cmake -DPLANNER=... -DWORK=... -P files_test.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

# run(RC EXPECT_ERR COMMAND ... [OUTPUT_FILE f]): the command's exit code and its standard error,
# which must contain EXPECT_ERR (for a failure: on one line).
function(run expected_rc expected_err)
  cmake_parse_arguments(ARG "" "OUTPUT_FILE" "COMMAND" ${ARGN})
  set(output_file "${WORK}/stdout.txt")
  if(ARG_OUTPUT_FILE)
    set(output_file "${ARG_OUTPUT_FILE}")
  endif()
  execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc ERROR_VARIABLE err
                  OUTPUT_FILE ${output_file} WORKING_DIRECTORY ${WORK} TIMEOUT 60)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "exit code ${rc}, expected ${expected_rc}: ${ARG_COMMAND}\n${err}")
  endif()
  string(FIND "${err}" "${expected_err}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "\"${expected_err}\" not on stderr of ${ARG_COMMAND}:\n${err}")
  endif()
  if(NOT expected_rc EQUAL 0)
    string(REGEX REPLACE "\n$" "" one "${err}")
    if(one MATCHES "\n")
      message(FATAL_ERROR "more than one line on stderr of ${ARG_COMMAND}:\n${err}")
    endif()
  endif()
endfunction()

function(expect_kind path kind)
  execute_process(COMMAND stat -c %F ${path} OUTPUT_VARIABLE got OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT got STREQUAL kind)
    message(FATAL_ERROR "${path} is a ${got}, expected a ${kind}")
  endif()
endfunction()

# A full device of this test's own where one can be made (mknod, as root), so that a program that
# renames over it replaces nothing of the machine's; else /dev/full.
set(full /dev/full)
execute_process(COMMAND mknod ${WORK}/full c 1 7 RESULT_VARIABLE rc ERROR_QUIET)
if(rc EQUAL 0)
  execute_process(COMMAND dd if=/dev/zero of=${WORK}/full bs=1 count=1 ERROR_VARIABLE err)
  if(err MATCHES "No space left on device")
    set(full ${WORK}/full)
  endif()
endif()
message(STATUS "full device: ${full}")

set(no_space "No space left on device")
run(2 "planner: --svg: cannot write \"${full}\": ${no_space}" COMMAND ${PLANNER} recommend --svg ${full})
expect_kind(${full} "character special file")
run(2 "planner: standard output: cannot write: ${no_space}"
    COMMAND ${PLANNER} recommend --format json OUTPUT_FILE ${full})
run(2 "planner: standard output: cannot write: ${no_space}"
    COMMAND ${PLANNER} recommend --emit plan OUTPUT_FILE ${full})
expect_kind(${full} "character special file")

# Reads that would not end: refused at once (a FIFO without a writer, /dev/zero).
run(2 "planner: /dev/zero: is a character device, not a regular file"
    COMMAND ${PLANNER} estimate --strategy ddp --model /dev/zero)
execute_process(COMMAND mkfifo ${WORK}/fifo.json)
run(2 "planner: ${WORK}/fifo.json: is a FIFO, not a regular file"
    COMMAND ${PLANNER} estimate --strategy ddp --job ${WORK}/fifo.json)

# A write cut short (a file size limit of one block; its signal ignored, so the write fails with
# EFBIG) leaves neither the file nor a temporary. (Lines, not ';': a CMake list would split there.)
run(2 "planner: --svg: cannot write \"m.svg\": File too large"
    COMMAND sh -c "trap '' XFSZ\nulimit -f 1\nexec '${PLANNER}' recommend --svg m.svg")
file(GLOB left RELATIVE ${WORK} ${WORK}/*svg* ${WORK}/.*svg*)
if(left)
  message(FATAL_ERROR "a failed write left: ${left}")
endif()

# Twenty processes write one --svg at once: each succeeds, one whole file is left, nothing else.
set(script "")
foreach(i RANGE 1 20)
  string(APPEND script "'${PLANNER}' recommend --svg same.svg > /dev/null 2>> errors.txt || echo ${i} >> failed.txt &\n")
endforeach()
execute_process(COMMAND sh -c "${script}wait" WORKING_DIRECTORY ${WORK} TIMEOUT 120)
if(EXISTS ${WORK}/failed.txt)
  file(READ ${WORK}/errors.txt errors)
  message(FATAL_ERROR "concurrent --svg same.svg failed:\n${errors}")
endif()
file(READ ${WORK}/same.svg svg)
if(NOT svg MATCHES "^<svg" OR NOT svg MATCHES "</svg>\n?$")
  message(FATAL_ERROR "same.svg is not one whole chart")
endif()
file(GLOB left RELATIVE ${WORK} ${WORK}/.same.svg*)
if(left)
  message(FATAL_ERROR "temporaries left: ${left}")
endif()
