# The executor's numbers on its command line, through the program (rehearsals: no MPI needed): a
# value given is used or refused (one line, exit code 2), never read as "not given"; integers are
# decimal; a seed is any of 0 .. 2^64-1 and one past is refused, never clamped (two seeds past
# 2^63-1 give two runs); a --seq-len the host cannot hold is refused before anything is
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
set(small --layers 1 --hidden 16 --heads 2 --vocab 64)

foreach(case
    "--steps|0x10|--steps: must be a whole decimal number, got \"0x10\""
    "--steps|+2|--steps: must be a whole decimal number, got \"+2\""
    "--seed|99999999999999999999|--seed: must be between 0 and 18446744073709551615, got \"99999999999999999999\""
    "--seed|18446744073709551616|--seed: must be between 0 and 18446744073709551615, got \"18446744073709551616\""
    "--seed|-1|--seed: must be between 0 and 18446744073709551615, got \"-1\""
    "--seq-len|0|--seq-len: must be >= 1, got 0"
    "--kv-heads|0|--kv-heads: must be >= 1, got 0"
    "--save-every|0x2|--save-every: must be a whole decimal number, got \"0x2\""
    "--gpu-memory-GiB|inf|--gpu-memory-GiB: must be a decimal number, got \"inf\""
    "--lr|0x1p-3|--lr: must be a decimal number, got \"0x1p-3\""
    "--timeout-s|nan|--timeout-s: must be a decimal number, got \"nan\""
    "--tensor-parallel|0|--tensor-parallel: must be between 1 and 1024, got 0"
    "--tensor-parallel|0x2|--tensor-parallel: must be a whole decimal number, got \"0x2\""
    "--tensor-parallel|2|--tensor-parallel: 2: tensor parallelism is not rehearsed (--rehearse-rank)")

  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flag)
  list(GET parts 1 value)
  list(GET parts 2 expect)
  run_expect(2 COMMAND ${rehearse} ${small} ${flag} "${value}" EXPECT "executor: ${expect}")
endforeach()
# An empty value (given through sh: a CMake list drops empty arguments).
foreach(case "--steps|--steps: must be a whole decimal number, got \"\""
             "--seq-len|--seq-len: must be a whole decimal number, got \"\""
             "--resume|--resume: must name a folder, got \"\"")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flag)
  list(GET parts 1 expect)
  run_expect(2 COMMAND sh -c "exec \"$0\" \"$@\" ${flag} ''" ${rehearse} ${small} EXPECT "executor: ${expect}")
endforeach()
run_expect(2 COMMAND ${rehearse} ${small} --sequence-parallel
           EXPECT "executor: --sequence-parallel: needs --tensor-parallel of 2 or more, got 1")
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
run_expect(2 COMMAND sh -c "${limit} exec \"$0\" \"$@\"" ${rehearse} --seq-len 2147483648
           EXPECT "executor: --seq-len: micro-batches of 2 sequences of 2147483648 tokens")

# The names planner and scale-config use for the same things; the old spellings are refused with
# one line naming the new flag.
foreach(case "--scale-layers|1|--layers" "--scale-seq|32|--seq-len" "--capacity-GiB|1|--gpu-memory-GiB")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flag)
  list(GET parts 1 value)
  list(GET parts 2 new)
  run_expect(2 COMMAND ${rehearse} ${small} ${flag} ${value} EXPECT "executor: ${flag}: renamed: give ${new}")
endforeach()

# A plan made for a smaller device (planner --gpu-memory-GiB, written as capacity/gpu_memory_GiB)
# runs as on a device of that size: 0.001 GiB (about 1 MiB) holds not even a rank's shard of the
# tiny model's embedding (llama-tiny: 8192 words x hidden 128 = 1048576 fp32 weights, 4 MiB; half
# of it, 2 MiB, on each of the 2 ranks).
# --gpu-memory-GiB on the executor's command line replaces the plan's.
string(JSON small_device SET "${plan}" capacity "{\"gpu_memory_GiB\": 0.001}")
file(WRITE ${WORK}/small-device-plan.json "${small_device}")
run_expect(3 COMMAND ${EXECUTOR} --plan small-device-plan.json --rehearse-rank 0 --world 2 --out run.json
                     --steps 1 EXPECT "out of memory: allocating")
run_expect(0 COMMAND ${EXECUTOR} --plan small-device-plan.json --rehearse-rank 0 --world 2 --out run.json
                     --steps 1 --gpu-memory-GiB 64)

# --help says what each option's value is (a count, a size in its unit, a file, a name), not TEXT
# for every one (the options read text and check it themselves).
foreach(sub "" "scale-config" "consolidate")
  execute_process(COMMAND ${EXECUTOR} ${sub} --help RESULT_VARIABLE code OUTPUT_VARIABLE help)
  if(NOT code EQUAL 0 OR help MATCHES " TEXT")
    message(FATAL_ERROR "executor ${sub} --help (exit ${code}) shows TEXT:\n${help}")
  endif()
endforeach()
