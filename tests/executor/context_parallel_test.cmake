# The executor program with --context-parallel under mpirun (ctest label mpi): a plan for 4 ranks
# runs as 2 ranks sharing each sequence × 2 data-parallel replicas, from the same initial
# parameters and with the same first loss as data parallelism; planner validate predicts its
# memory for the layout; what cannot be split is one line naming the flag or field, exit code 2.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

# The model run here, whole: llama-tiny.json's architecture at 2 blocks of width 32, so that the
# plan's prediction is for the model the ranks run.
file(WRITE ${WORK}/llama-small.json [=[{"architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
  "intermediate_size": 64, "max_position_embeddings": 8192, "mlp_bias": false,
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "tie_word_embeddings": false, "vocab_size": 128}]=])
foreach(attention flash eager)
  run_expect(0 COMMAND ${PLANNER} recommend --model ${WORK}/llama-small.json
                       --hardware ${DATA}/cpu-test.json --gpus 4 --seq-len 32 --global-batch 8
                       --micro-batch 2 --attention ${attention} --checkpointing none
                       --offload none --recipe executor --precision fp32 --strategy ddp
                       --flavour ddp --emit plan OUTPUT plan)
  file(WRITE ${WORK}/plan-${attention}.json "${plan}")
endforeach()

# Data parallelism alone: the same initial parameters; the first loss, of the same sequences.
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-flash.json --steps 2
                     --out ddp.json)
file(READ ${WORK}/ddp.json ddp)
string(JSON ddp_initial GET "${ddp}" initial_params_sha256)
string(JSON ddp_loss GET "${ddp}" loss 0)

# A plan made for the layout (its /parallel object names context 2): run with the flag it needs.
file(READ ${WORK}/plan-flash.json plan4)
string(JSON plan_cp SET "${plan4}" parallel
       [=[{"tensor": 1, "sequence_parallel": false, "async_tensor_parallel": false, "pipeline": 1,
          "schedule": "1f1b", "virtual_stages": 1, "micro_batches": 2, "context": 2}]=])
file(WRITE ${WORK}/plan-cp.json "${plan_cp}")
run_expect(2 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-cp.json --steps 1
                     --out bad.json
           EXPECT "the plan's /parallel layout is run with --tensor-parallel 1 --context-parallel 2")
run_expect(0 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-cp.json --steps 2
                     --context-parallel 2 --out run.json)
file(READ ${WORK}/run.json run)
string(JSON size GET "${run}" model context_parallel size)
string(JSON share GET "${run}" model context_parallel sequence_share)
string(JSON initial GET "${run}" initial_params_sha256)
string(JSON first_loss GET "${run}" loss 0)
if(NOT size EQUAL 2 OR NOT share EQUAL 16)
  message(FATAL_ERROR "run.json: context_parallel size ${size}, sequence share ${share}")
endif()
if(NOT initial STREQUAL ddp_initial)
  message(FATAL_ERROR "c=2: initial parameters ${initial}, data parallel ${ddp_initial}")
endif()
# The first step's loss is the mean over the same sequences: equal within fp32's reordered sums
# (the MPI tests bound it by 1e-6 relative; the runs are deterministic): the first five decimals.
string(REGEX REPLACE "^([0-9]+\\.[0-9][0-9][0-9][0-9][0-9]).*" "\\1" cp5 "${first_loss}")
string(REGEX REPLACE "^([0-9]+\\.[0-9][0-9][0-9][0-9][0-9]).*" "\\1" ddp5 "${ddp_loss}")
if(NOT cp5 STREQUAL ddp5)
  message(FATAL_ERROR "c=2: first loss ${first_loss}, data parallel ${ddp_loss}")
endif()

# planner validate predicts the run's memory for its layout (costmodel/parallel_memory, one
# stage): the executor's model code, counted to the byte (the MPI tests' derivation).
run_expect(0 COMMAND ${PLANNER} validate --plan plan-cp.json --run run.json --format json
                     OUTPUT validated)
string(JSON validated_c GET "${validated}" memory context_parallel size)
string(JSON peak_error GET "${validated}" memory peak_rel_error)
if(NOT validated_c EQUAL 2)
  message(FATAL_ERROR "planner validate of a c=2 run: context_parallel ${validated_c}")
endif()
if(peak_error GREATER 0.03 OR peak_error LESS -0.03)
  message(FATAL_ERROR "planner validate of a c=2 run: peak error ${peak_error}")
endif()
message(STATUS "c=2: losses ${first_loss} (data parallel ${ddp_loss}), validated peak error "
               "${peak_error}")

# What c cannot split: the ranks, the sequence, eager attention; and where it does not run.
run_expect(2 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-flash.json
                     --context-parallel 3 --out bad.json
           EXPECT "executor: --context-parallel: 3 × tensor-parallel 1 does not divide the 4 ranks")
run_expect(2 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-flash.json --seq-len 30
                     --context-parallel 2 --out bad.json
           EXPECT "executor: --seq-len: a sequence of 30 tokens does not split into 2 × 2 chunks")
run_expect(2 COMMAND ${mpirun} -np 4 ${EXECUTOR} --plan plan-eager.json
                     --context-parallel 2 --out bad.json
           EXPECT "/job/attention: context parallelism 2 runs ring attention on flash attention, got \"eager\"")
run_expect(2 COMMAND ${EXECUTOR} --plan plan-flash.json --backend cuda
                     --context-parallel 2 --out bad.json
           EXPECT "executor: --context-parallel: 2: context parallelism runs on the cpu backend only")
run_expect(2 COMMAND ${EXECUTOR} --plan plan-flash.json --context-parallel 0
                     --out bad.json
           EXPECT "executor: --context-parallel: must be between 1 and 1024, got 0")
