# The executor program's files (label mpi): every destination is checked before the first step,
# a plan that is not a regular file is refused before it is read, a plan's errors name its file,
# and a path that is not UTF-8 ends in the run document, not in an internal error.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

set(job --model ${DATA}/llama-tiny.json --hardware ${DATA}/cpu-test.json --gpus 2 --seq-len 64
        --global-batch 4 --micro-batch 2 --attention eager --checkpointing none --offload none
        --recipe executor)
run_expect(0 COMMAND ${PLANNER} recommend ${job} --precision fp32 --strategy fsdp-full --flavour fsdp2
                     --emit plan OUTPUT plan)
file(WRITE ${WORK}/plan.json "${plan}")

# run_refused(COMMAND ... EXPECT text): exit code 2 with the text, and no step was run.
function(run_refused)
  cmake_parse_arguments(ARG "" "EXPECT" "COMMAND" ${ARGN})
  run_expect(2 COMMAND ${ARG_COMMAND} EXPECT "${ARG_EXPECT}")
  if(last_stderr MATCHES "executor: step [0-9]+/")
    message(FATAL_ERROR "steps ran before the refusal: ${ARG_COMMAND}\n${last_stderr}")
  endif()
endfunction()

# An --out that cannot be written: refused before the first step, with errno's text.
set(missing "--out: cannot write \"/nonexistent/dir/run.json\": No such file or directory")
run_refused(COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan.json --steps 5
                    --out /nonexistent/dir/run.json EXPECT "${missing}")
run_refused(COMMAND ${EXECUTOR} --plan plan.json --rehearse-rank 1 --world 2 --steps 5
                    --out /nonexistent/dir/run.json EXPECT "${missing}")
file(MAKE_DIRECTORY ${WORK}/folder.json)
run_refused(COMMAND ${EXECUTOR} --plan plan.json --rehearse-rank 0 --world 2 --steps 5
                    --out folder.json EXPECT "--out: cannot write \"folder.json\": it is a directory")
file(GLOB left RELATIVE ${WORK} ${WORK}/*run.json* ${WORK}/.*run.json*)
if(left)
  message(FATAL_ERROR "a refused --out left: ${left}")
endif()

# Plans that are no regular file are refused before they are read; a plan's errors name it.
run_refused(COMMAND ${EXECUTOR} --plan /dev/zero --rehearse-rank 0 --world 2 --out x.json
            EXPECT "executor: /dev/zero: is a character device, not a regular file")
run_refused(COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan folder.json --out x.json
            EXPECT "executor: folder.json: is a directory, not a regular file")
file(WRITE ${WORK}/empty.json "{}")
run_refused(COMMAND ${EXECUTOR} --plan empty.json --rehearse-rank 0 --world 2 --out x.json
            EXPECT "executor: empty.json: /")

# A checkpoint folder whose name is not UTF-8: the run document says it with U+FFFD.
string(ASCII 255 254 bad)
run_expect(0 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan.json --steps 1 --save "ck${bad}"
                     --out run.json)
file(READ ${WORK}/run.json run)
string(JSON saved GET "${run}" execution saved dir)
string(ASCII 239 191 189 replacement) # U+FFFD in UTF-8
if(NOT saved STREQUAL "ck${replacement}${replacement}")
  message(FATAL_ERROR "run.json names the checkpoint \"${saved}\"")
endif()
