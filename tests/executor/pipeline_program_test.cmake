# The executor program with pipeline stages under mpirun (ctest label mpi): a DDP plan runs as
# P = 2 stages on 2 ranks (1F1B and GPipe), as P = 2 × d = 2 on 4, as 2 stages × 2 TP ranks on 4
# and as 3 interleaved stages on 3, writing each stage's measured peak, which planner validate
# compares with the prediction; what a pipeline run cannot do is refused with
# one line naming the flag and the value, and exit code 2.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

# Every stage's predicted peak in planner validate's JSON within 3% of the measured one.
function(check_stage_errors validated label)
  string(JSON last LENGTH "${validated}" stages)
  math(EXPR last "${last} - 1")
  foreach(s RANGE ${last})
    string(JSON error GET "${validated}" stages ${s} rel_error)
    if(error GREATER 0.03 OR error LESS -0.03)
      message(FATAL_ERROR "${label}, stage ${s}: predicted peak off by ${error}")
    endif()
  endforeach()
endfunction()

foreach(gpus 2 4)
  run_expect(0 COMMAND ${PLANNER} recommend --model ${DATA}/llama-tiny.json
                       --hardware ${DATA}/cpu-test.json --gpus ${gpus} --seq-len 32
                       --global-batch 8 --micro-batch 1 --attention eager --checkpointing none
                       --offload none --recipe executor --precision fp32 --strategy ddp
                       --flavour ddp --emit plan OUTPUT plan)
  file(WRITE ${WORK}/plan${gpus}.json "${plan}")
endforeach()
run_expect(0 COMMAND ${PLANNER} recommend --model ${DATA}/llama-tiny.json
                     --hardware ${DATA}/cpu-test.json --gpus 2 --seq-len 32 --global-batch 8
                     --micro-batch 1 --attention eager --checkpointing none --offload none
                     --recipe executor --precision fp32 --strategy fsdp-full --flavour fsdp2
                     --emit plan OUTPUT fsdp_plan)
file(WRITE ${WORK}/fsdp.json "${fsdp_plan}")

# Runs: the document has one measured entry per stage and the trainer's count of it, and the
# losses.
foreach(case "2|1f1b|4" "2|gpipe|4" "4|1f1b|2")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 ranks)
  list(GET parts 1 schedule)
  list(GET parts 2 m)
  run_expect(0 COMMAND ${mpirun} -np ${ranks} ${EXECUTOR} --plan plan${ranks}.json --steps 2
                       --pipeline-parallel 2 --schedule ${schedule} --micro-batches ${m}
                       --out pp-${ranks}-${schedule}.json)
  file(READ ${WORK}/pp-${ranks}-${schedule}.json run)
  string(JSON kind GET "${run}" kind)
  string(JSON measured LENGTH "${run}" stages_measured)
  string(JSON counted LENGTH "${run}" stages_counted)
  string(JSON loss GET "${run}" steps 1 loss)
  if(NOT kind STREQUAL "executor pipeline run" OR NOT measured EQUAL 2 OR NOT counted EQUAL 2)
    message(FATAL_ERROR "pp-${ranks}-${schedule}.json: kind ${kind}, ${measured} measured and "
                        "${counted} counted stages")
  endif()
  foreach(s 0 1)
    string(JSON peak GET "${run}" stages_measured ${s} peak_bytes)
    string(JSON want GET "${run}" stages_counted ${s} total_bytes)
    message(STATUS "${ranks} ranks, ${schedule}: stage ${s} peak ${peak} bytes measured, "
                   "${want} counted; loss ${loss}")
  endforeach()
endforeach()

# planner validate reads a pipeline run (planner/validate_pipeline.hpp): each stage's peak
# predicted from the plan for the run's layout against the measured one, which stage holds the
# peak, the step time; as a table and as JSON. The stages' peaks are the cost model's to the byte
# (tests/executor/test_pipeline_mpi.cpp): within 3% here.
run_expect(0 COMMAND ${PLANNER} validate --plan plan4.json --run pp-4-1f1b.json OUTPUT table)
foreach(text "run: 2 pipeline stages × 2 data-parallel ranks, 1f1b, 2 micro-batches of 2 × 32 tokens"
             "predicted peak: stage 1 of 2 (2 blocks, head and loss" "step (median of 2)"
             "0.0% (stage 1 predicted, stage 1 measured)")
  string(FIND "${table}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "\"${text}\" not in planner validate's table:\n${table}")
  endif()
endforeach()
message(STATUS "planner validate --plan plan4.json --run pp-4-1f1b.json:\n${table}")
run_expect(0 COMMAND ${PLANNER} validate --plan plan4.json --run pp-4-1f1b.json --format json
                     OUTPUT validated)
string(JSON kind GET "${validated}" kind)
string(JSON stages LENGTH "${validated}" stages)
if(NOT kind STREQUAL "pipeline" OR NOT stages EQUAL 2)
  message(FATAL_ERROR "planner validate --format json: kind ${kind}, ${stages} stages")
endif()
check_stage_errors("${validated}" "1f1b")
string(JSON predicted_stage GET "${validated}" memory peak_stage_predicted)
string(JSON measured_stage GET "${validated}" memory peak_stage_measured)
if(NOT predicted_stage EQUAL measured_stage)
  message(FATAL_ERROR "peak on stage ${predicted_stage} predicted, ${measured_stage} measured")
endif()
# The interleaved schedule: 3 stages of 2 model chunks each over a 6-layer copy of the model, 3
# micro-batches of 2 × 32 tokens (messages of 32 KiB, past the eager limit: every send meets its
# receive), validated per stage within 3%.
file(READ ${DATA}/llama-tiny.json config)
string(JSON config SET "${config}" num_hidden_layers 6)
file(WRITE ${WORK}/llama-6.json "${config}")
run_expect(0 COMMAND ${PLANNER} recommend --model llama-6.json --hardware ${DATA}/cpu-test.json
                     --gpus 3 --seq-len 32 --global-batch 6 --micro-batch 1 --attention eager
                     --checkpointing none --offload none --recipe executor --precision fp32
                     --strategy ddp --flavour ddp --emit plan OUTPUT plan)
file(WRITE ${WORK}/plan3.json "${plan}")
run_expect(0 COMMAND ${mpirun} -np 3 ${EXECUTOR} --plan plan3.json --steps 2 --pipeline-parallel 3
                     --schedule interleaved-1f1b --virtual-stages 2 --micro-batches 3
                     --out pp-3-interleaved.json)
run_expect(0 COMMAND ${PLANNER} validate --plan plan3.json --run pp-3-interleaved.json
                     --format json OUTPUT validated)
check_stage_errors("${validated}" "interleaved")
run_expect(0 COMMAND ${PLANNER} validate --plan plan3.json --run pp-3-interleaved.json
                     OUTPUT table)
message(STATUS "planner validate --plan plan3.json --run pp-3-interleaved.json:\n${table}")

# Tensor parallelism inside the stages: 2 stages × 2 TP ranks with sequence parallelism on 4
# ranks, validated per stage within 3%.
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan4.json --steps 2 --pipeline-parallel 2
                     --tensor-parallel 2 --sequence-parallel --micro-batches 2
                     --out pp-4-tp.json)
run_expect(0 COMMAND ${PLANNER} validate --plan plan4.json --run pp-4-tp.json --format json
                     OUTPUT validated)
check_stage_errors("${validated}" "TP inside stages")
run_expect(0 COMMAND ${PLANNER} validate --plan plan4.json --run pp-4-tp.json OUTPUT table)
string(FIND "${table}" "run: 2 pipeline stages × 1 data-parallel ranks × 2 tensor-parallel ranks (sequence parallel), 1f1b" at)
if(at EQUAL -1)
  message(FATAL_ERROR "planner validate's table for TP inside stages:\n${table}")
endif()
message(STATUS "planner validate --plan plan4.json --run pp-4-tp.json:\n${table}")

# A malformed pipeline run document: one line naming the field, exit code 2.
file(READ ${WORK}/pp-4-1f1b.json run)
string(JSON bad REMOVE "${run}" stages_measured 1)
file(WRITE ${WORK}/bad-pp.json "${bad}")
execute_process(COMMAND ${PLANNER} validate --plan plan4.json --run bad-pp.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY ${WORK})
string(FIND "${err}" "/stages_measured: 1 stages, /pipeline/pipeline_parallel says 2" at)
string(REGEX MATCHALL "\n" newlines "${err}")
list(LENGTH newlines lines)
if(NOT rc EQUAL 2 OR at EQUAL -1 OR NOT lines EQUAL 1)
  message(FATAL_ERROR "a pipeline run with one stage of two: exit ${rc}, stderr:\n${err}")
endif()

# Refusals of the command line (before any rank starts: one process), one line each.
foreach(case
    "--pipeline-parallel#0|--pipeline-parallel: must be >= 1, got 0"
    "--pipeline-parallel#x|--pipeline-parallel: must be a whole decimal number, got \"x\""
    "--pipeline-parallel#2#--schedule#zigzag|--schedule: must be one of 1f1b, interleaved-1f1b, gpipe, got \"zigzag\""
    "--pipeline-parallel#2#--virtual-stages#0|--virtual-stages: must be >= 1, got 0"
    "--virtual-stages#2|--virtual-stages: needs --pipeline-parallel P with P > 1"
    "--pipeline-parallel#2#--micro-batches#0|--micro-batches: must be >= 1, got 0"
    "--micro-batches#2|--micro-batches: needs --pipeline-parallel P with P > 1"
    "--pipeline-parallel#2#--save#ckpt|--pipeline-parallel: --save is not run with pipeline stages"
    "--pipeline-parallel#2#--rehearse-rank#0#--world#2|--pipeline-parallel: --rehearse-rank is not run with pipeline stages")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flags)
  list(GET parts 1 expect)
  string(REPLACE "#" ";" flags "${flags}")
  run_expect(2 COMMAND ${EXECUTOR} --plan plan2.json --steps 1 ${flags} --out refused.json
             EXPECT "executor: ${expect}")
endforeach()

# Refusals of the run (the world, the model, the batch, the plan's strategy): rank 0 says it.
foreach(case
    "plan2.json|--pipeline-parallel#2#--micro-batches#3|--micro-batches: 3 does not divide the 8 sequences per data-parallel rank"
    "plan2.json|--pipeline-parallel#3|--pipeline-parallel: 3 does not divide the 2 ranks of the job"
    "plan2.json|--pipeline-parallel#2#--schedule#interleaved-1f1b#--virtual-stages#2|--pipeline-parallel: the interleaved-1f1b schedule runs on >= 3 stages, got 2"
    "plan2.json|--pipeline-parallel#2#--virtual-stages#2|--virtual-stages: 2 needs --schedule interleaved-1f1b, got 1f1b"
    "plan2.json|--pipeline-parallel#2#--layers#3#--hidden#16#--heads#2#--vocab#64|--pipeline-parallel: 2 does not divide the model's 3 layers"
    "fsdp.json|--pipeline-parallel#2|--pipeline-parallel: the plan's strategy fsdp-full shards parameters over the data-parallel group")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 plan)
  list(GET parts 1 flags)
  list(GET parts 2 expect)
  string(REPLACE "#" ";" flags "${flags}")
  run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan ${plan} --steps 1 ${flags}
                       --out refused.json EXPECT "executor: ${expect}")
endforeach()
