# What the planner plans for a CPU device runs on the CPU executor and its device memory is the
# prediction (ctest label mpi): flash attention (the host's tiled kernel) and optimizer or
# parameter offload (the host pool), on 1 and 2 ranks under mpirun, each checked with
# `planner validate`: the peak within 0.01% (as the engine's doctest bound, engine::peak memory is
# the cost model's: the tracked allocator has no fragmentation, so the walk is the same events)
# and no optimizer state on the device where the plan offloads it.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder), RANKS
# (the rank counts, separated by |; default 1|2).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

# strategy, flavour, offload, attention
set(cases "zero2 deepspeed optimizer flash" "zero3 deepspeed params flash"
          "fsdp-full fsdp2 params flash" "zero1 deepspeed optimizer eager")
if(NOT DEFINED RANKS)
  set(RANKS 1|2)
endif()
string(REPLACE "|" ";" rank_counts "${RANKS}")
foreach(ranks IN LISTS rank_counts)
  foreach(case IN LISTS cases)
    separate_arguments(c UNIX_COMMAND "${case}")
    list(GET c 0 strategy)
    list(GET c 1 flavour)
    list(GET c 2 offload)
    list(GET c 3 attention)
    set(name "${strategy}-${flavour}-${offload}-${attention}-${ranks}")
    run_expect(0 COMMAND ${PLANNER} recommend --model ${DATA}/llama-tiny.json
                         --hardware ${DATA}/cpu-test.json --gpus ${ranks} --seq-len 64
                         --global-batch 4 --micro-batch 2 --checkpointing none --recipe executor
                         --precision fp32 --strategy ${strategy} --flavour ${flavour}
                         --offload ${offload} --attention ${attention} --emit plan OUTPUT plan)
    file(WRITE ${WORK}/${name}-plan.json "${plan}")
    run_expect(0 COMMAND ${mpirun} -np ${ranks} ${EXECUTOR} --plan ${name}-plan.json --steps 2
                         --out ${name}-run.json)
    run_expect(0 COMMAND ${PLANNER} validate --plan ${name}-plan.json --run ${name}-run.json
                         --format json OUTPUT validated)
    string(JSON error GET "${validated}" memory peak_rel_error)
    string(JSON predicted GET "${validated}" memory peak_predicted_bytes)
    string(JSON measured GET "${validated}" memory peak_measured_bytes)
    string(JSON opt GET "${validated}" memory categories optimizer_states measured_bytes)
    message(STATUS "${name}: peak predicted ${predicted} B, measured ${measured} B, error ${error}")
    if(error GREATER 0.0001 OR error LESS -0.0001)
      message(FATAL_ERROR "${name}: peak error ${error} beyond 0.01%")
    endif()
    if(NOT opt EQUAL 0)
      message(FATAL_ERROR "${name}: ${opt} bytes of optimizer states on the device")
    endif()
  endforeach()
endforeach()

# An offload no framework does: one line naming the field, exit code 2.
file(READ ${WORK}/fsdp-full-fsdp2-params-flash-2-plan.json fsdp_plan)
string(REPLACE "\"offload\": \"params\"" "\"offload\": \"optimizer\"" bad "${fsdp_plan}")
file(WRITE ${WORK}/bad-plan.json "${bad}")
run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan bad-plan.json --steps 1 --out bad.json
           EXPECT "/sharding/offload: FSDP offloads parameters, gradients and optimizer together")
