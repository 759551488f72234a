# The executor's numbers on its command line, through the program (rehearsals: no MPI needed): a
# value given is used or refused (one line, exit code 2), never read as "not given"; integers are
# decimal; a seed is any of 0 .. 2^64-1 and one past is refused, never clamped (two seeds past
# 2^63-1 give two runs); a --scale-seq the host cannot hold is refused before anything is
# allocated (under a 4 GiB address-space limit, so that a regression fails instead of swapping).
# Arguments: EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder), SANITIZE.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)

run_expect(0 COMMAND ${PLANNER} recommend --model ${DATA}/llama-tiny.json --hardware ${DATA}/cpu-test.json
                     --gpus 2 --seq-len 64 --global-batch 4 --micro-batch 2 --attention eager
                     --checkpointing none --offload none --recipe executor --precision fp32
                     --strategy fsdp-full --flavour fsdp2 --emit plan OUTPUT plan)
file(WRITE ${WORK}/plan.json "${plan}")
set(rehearse ${EXECUTOR} --plan plan.json --rehearse-rank 0 --world 2 --out run.json)
set(small --scale-layers 1 --scale-hidden 16 --scale-heads 2 --scale-vocab 64)

foreach(case
    "--steps|0x10|--steps: must be a whole decimal number, got \"0x10\""
    "--steps|+2|--steps: must be a whole decimal number, got \"+2\""
    "--seed|99999999999999999999|--seed: must be between 0 and 18446744073709551615, got \"99999999999999999999\""
    "--seed|18446744073709551616|--seed: must be between 0 and 18446744073709551615, got \"18446744073709551616\""
    "--seed|-1|--seed: must be between 0 and 18446744073709551615, got \"-1\""
    "--scale-seq|0|--scale-seq: must be >= 1, got 0"
    "--scale-kv-heads|0|--scale-kv-heads: must be >= 1, got 0"
    "--save-every|0x2|--save-every: must be a whole decimal number, got \"0x2\""
    "--capacity-GiB|inf|--capacity-GiB: must be a decimal number, got \"inf\""
    "--lr|0x1p-3|--lr: must be a decimal number, got \"0x1p-3\""
    "--timeout-s|nan|--timeout-s: must be a decimal number, got \"nan\"")

  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flag)
  list(GET parts 1 value)
  list(GET parts 2 expect)
  run_expect(2 COMMAND ${rehearse} ${small} ${flag} "${value}" EXPECT "executor: ${expect}")
endforeach()
# An empty value (given through sh: a CMake list drops empty arguments).
foreach(case "--steps|--steps: must be a whole decimal number, got \"\""
             "--scale-seq|--scale-seq: must be a whole decimal number, got \"\""
             "--resume|--resume: must name a folder, got \"\"")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flag)
  list(GET parts 1 expect)
  run_expect(2 COMMAND sh -c "exec \"$0\" \"$@\" ${flag} ''" ${rehearse} ${small} EXPECT "executor: ${expect}")
endforeach()
run_expect(2 COMMAND ${EXECUTOR} --plan plan.json --world 02 --rehearse-rank 0x1 --out run.json
           EXPECT "executor: --rehearse-rank: must be a whole decimal number, got \"0x1\"")
run_expect(2 COMMAND ${EXECUTOR} scale-config --model gpt2 --layers 2 --hidden 64 --heads 0 --vocab 64
                     --out c.json EXPECT "executor: --heads: must be >= 1, got 0")

# Seeds past 2^63-1 are themselves: two of them give two runs, and the run records the seed.
foreach(seed 9223372036854775807 18446744073709551615)
  run_expect(0 COMMAND ${EXECUTOR} --plan plan.json --rehearse-rank 0 --world 2 --out seed-${seed}.json
                       ${small} --steps 1 --seed ${seed})
  file(READ ${WORK}/seed-${seed}.json run)
  string(JSON recorded GET "${run}" execution seed)
  string(JSON loss_${seed} GET "${run}" loss 0)
  if(NOT recorded STREQUAL seed)
    message(FATAL_ERROR "--seed ${seed}: the run records seed ${recorded}")
  endif()
endforeach()
if(loss_9223372036854775807 STREQUAL loss_18446744073709551615)
  message(FATAL_ERROR "seeds 2^63-1 and 2^64-1 gave the same loss ${loss_9223372036854775807}")
endif()
message(STATUS "first loss: ${loss_9223372036854775807} (seed 2^63-1), ${loss_18446744073709551615} (seed 2^64-1)")
# 010 steps are ten.
run_expect(0 COMMAND ${rehearse} ${small} --steps 010)
file(READ ${WORK}/run.json run)
string(JSON steps GET "${run}" execution steps)
if(NOT steps EQUAL 10)
  message(FATAL_ERROR "--steps 010 ran ${steps} steps")
endif()

# 2^31 tokens per sequence: refused naming the flag, before any allocation. (AddressSanitizer
# reserves its shadow memory past any such limit: there the limit is left out.)
set(limit "ulimit -v 4194304 &&")
if(SANITIZE)
  set(limit "")
endif()
run_expect(2 COMMAND sh -c "${limit} exec \"$0\" \"$@\"" ${rehearse} --scale-seq 2147483648
           EXPECT "executor: --scale-seq: micro-batches of 2 sequences of 2147483648 tokens")
