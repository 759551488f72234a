# The executor program with --tensor-parallel under mpirun (ctest label mpi): a plan for 4 ranks
# runs as 2 tensor-parallel ranks × 2 data-parallel replicas, with and without sequence
# parallelism, and its run document says so; what cannot be split is one line naming the flag and
# exit code 2.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

foreach(gpus 2 4)
  run_expect(0 COMMAND ${PLANNER} recommend --model ${DATA}/llama-tiny.json
                       --hardware ${DATA}/cpu-test.json --gpus ${gpus} --seq-len 32
                       --global-batch 8 --micro-batch 2 --attention eager --checkpointing none
                       --offload none --recipe executor --precision fp32 --strategy ddp
                       --flavour ddp --emit plan OUTPUT plan)
  file(WRITE ${WORK}/plan-${gpus}.json "${plan}")
endforeach()
set(small --layers 2 --hidden 32 --heads 4 --kv-heads 2 --intermediate 64 --vocab 128)

# Data parallelism alone on the same ranks: the reference the tensor-parallel runs start from.
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-4.json ${small} --steps 2 --out ddp.json)
file(READ ${WORK}/ddp.json ddp)
string(JSON ddp_initial GET "${ddp}" initial_params_sha256)
string(JSON ddp_loss GET "${ddp}" loss 0)

foreach(sp "" "--sequence-parallel")
  run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-4.json ${small} --steps 2
                       --tensor-parallel 2 ${sp} --out run.json)
  file(READ ${WORK}/run.json run)
  string(JSON size GET "${run}" model tensor_parallel size)
  string(JSON seq GET "${run}" model tensor_parallel sequence_parallel)
  string(JSON ranks LENGTH "${run}" ranks)
  string(JSON loss GET "${run}" loss 1)
  string(JSON initial GET "${run}" initial_params_sha256)
  string(JSON first_loss GET "${run}" loss 0)
  # Each rank's slice is cut from the same full initialisation as t = 1: the whole model's digest
  # is the data-parallel run's, bit for bit.
  if(NOT initial STREQUAL ddp_initial)
    message(FATAL_ERROR "t=2 ${sp}: initial parameters ${initial}, data parallel ${ddp_initial}")
  endif()
  if(NOT size EQUAL 2 OR NOT ranks EQUAL 4)
    message(FATAL_ERROR "run.json: tensor_parallel size ${size}, ${ranks} ranks")
  endif()
  message(STATUS "t=2 ${sp}: sequence_parallel ${seq}, losses ${first_loss} ${loss} (data "
                 "parallel: first loss ${ddp_loss})")
endforeach()

# planner validate reads the tensor-parallel run (the last one, with sequence parallelism): the
# memory predicted for its t (costmodel/parallel_memory, one stage).
run_expect(0 COMMAND ${PLANNER} validate --plan plan-4.json --run run.json --format json
                     OUTPUT validated)
string(JSON validated_t GET "${validated}" memory tensor_parallel size)
string(JSON validated_sp GET "${validated}" memory tensor_parallel sequence_parallel)
if(NOT validated_t EQUAL 2 OR NOT validated_sp STREQUAL "ON")
  message(FATAL_ERROR "planner validate of a t=2 run: tensor_parallel ${validated_t}, "
                      "sequence_parallel ${validated_sp}")
endif()

# What t cannot split: the ranks, the key/value heads (2), the vocabulary.
run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan-2.json ${small} --tensor-parallel 4
                     --out bad.json
           EXPECT "executor: --tensor-parallel: 4 does not divide the 2 ranks")
run_expect(2 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-4.json ${small} --tensor-parallel 4
                     --out bad.json
           EXPECT "executor: --tensor-parallel: tensor-parallel size 4 does not divide the 2 key/value heads")
run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan-2.json --layers 2 --hidden 32
                     --heads 4 --kv-heads 2 --intermediate 64 --vocab 127 --tensor-parallel 2
                     --out bad.json
           EXPECT "executor: --tensor-parallel: tensor-parallel size 2 does not divide the vocabulary of 127 tokens")

# A plan made with tensor parallelism (its /parallel object) runs with that layout or not at all:
# without the flags it names, the run is refused with the flags to give. Its micro-batch count is
# the plan's: global batch 8 / (2 replicas x micro-batch 2) = 2.
file(READ ${WORK}/plan-4.json plan4)
string(JSON plan_tp SET "${plan4}" parallel
       [=[{"tensor": 2, "sequence_parallel": true, "async_tensor_parallel": false, "pipeline": 1,
          "schedule": "1f1b", "virtual_stages": 1, "micro_batches": 2, "context": 1}]=])
file(WRITE ${WORK}/plan-4-tp.json "${plan_tp}")
run_expect(2 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-4-tp.json ${small} --steps 1
                     --out bad.json
           EXPECT "the plan's /parallel layout is run with --tensor-parallel 2 --sequence-parallel")
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-4-tp.json ${small} --steps 1
                     --tensor-parallel 2 --sequence-parallel --out run.json)
