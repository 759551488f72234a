# The executor's ZeRO-1/2/3 send what DeepSpeed's engines send. DeepSpeed 0.19.8 ran GPT-2 scaled
# to 64 wide, 3 blocks, a 257-token vocabulary, fp32, on 2 ranks, and recorded the collectives its
# step asked deepspeed.comm for (validation/measure_deepspeed.py --buckets executor:
# tests/costmodel/data/oracle_deepspeed_executor.json): stages 1/2 all-reduce the gradients and
# all-gather the updated weights, stage 3 (every tensor below the persistence threshold) reduce-
# scatters the gradients and all-gathers the persistent weights after the step. The same job is
# planned with --recipe executor and run on 2 ranks; the bytes one rank sends per step, measured
# and predicted, must be within 1% of DeepSpeed's (which also holds a gradient-norm all-reduce of
# 8 bytes and a few small broadcasts the executor does not issue).
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK, CORPUS.
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

file(READ ${CORPUS} corpus)
string(JSON config GET "${corpus}" configs gpt2-e64-l3-v257)
file(WRITE ${WORK}/model.json "${config}")
string(JSON cases LENGTH "${corpus}" cases)
math(EXPR last "${cases} - 1")

# within_1pct(NAME VALUE REFERENCE): fails unless |VALUE - REFERENCE| <= REFERENCE / 100 (bytes,
# whole numbers; a fraction is cut off).
function(within_1pct name value reference)
  string(REGEX REPLACE "\\..*$" "" v "${value}")
  math(EXPR diff "${v} - ${reference}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  math(EXPR bound "${reference} / 100")
  if(diff GREATER bound)
    message(FATAL_ERROR "${name}: ${v} bytes per rank and step, DeepSpeed sent ${reference}")
  endif()
  message(STATUS "${name}: ${v} bytes per rank and step, DeepSpeed ${reference}")
endfunction()

foreach(i RANGE ${last})
  string(JSON wrapper GET "${corpus}" cases ${i} wrapper)  # deepspeed-zeroN
  string(REPLACE "deepspeed-" "" strategy "${wrapper}")
  set(deepspeed 0)
  string(JSON collectives GET "${corpus}" cases ${i} collectives)
  string(JSON kinds LENGTH "${collectives}")
  math(EXPR last_kind "${kinds} - 1")
  foreach(k RANGE ${last_kind})
    string(JSON kind MEMBER "${collectives}" ${k})
    string(JSON sent GET "${collectives}" ${kind} bytes_sent)
    math(EXPR deepspeed "${deepspeed} + ${sent}")
  endforeach()

  run_expect(0 COMMAND ${PLANNER} recommend --model model.json --hardware ${DATA}/cpu-test.json
                       --gpus 2 --seq-len 32 --global-batch 4 --micro-batch 2 --precision fp32
                       --recipe executor --strategy ${strategy} --emit plan OUTPUT plan)
  file(WRITE ${WORK}/plan-${strategy}.json "${plan}")
  string(JSON predicted GET "${plan}" prediction comm_bytes_per_gpu)
  within_1pct("${strategy} predicted" "${predicted}" ${deepspeed})
  run_expect(0 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan-${strategy}.json --steps 2
                       --out run-${strategy}.json)
  file(READ ${WORK}/run-${strategy}.json run)
  string(JSON measured GET "${run}" summary comm_bytes_per_step)
  within_1pct("${strategy} executor" "${measured}" ${deepspeed})
endforeach()
