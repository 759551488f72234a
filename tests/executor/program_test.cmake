# The executor program under mpirun (ctest label mpi): a plan made by the planner runs on 2 ranks
# and writes its run document; a rehearsal of rank 1 allocates rank 1's measured peak; under a
# capacity too small for the plan every rank ends with exit code 3 and the out-of-memory line;
# bad input is one line naming the field and exit code 2.
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

set(job --model ${DATA}/llama-tiny.json --hardware ${DATA}/cpu-test.json --gpus 2 --seq-len 64
        --global-batch 4 --micro-batch 2 --attention eager --checkpointing none --offload none
        --recipe executor)
run_expect(0 COMMAND ${PLANNER} recommend ${job} --precision fp32 --strategy fsdp-full --flavour fsdp2
                     --emit plan OUTPUT plan)
file(WRITE ${WORK}/plan.json "${plan}")
run_expect(0 COMMAND ${PLANNER} recommend ${job} --precision bf16 --strategy fsdp-full --flavour fsdp2
                     --emit plan OUTPUT bf16_plan)
file(WRITE ${WORK}/bf16-plan.json "${bf16_plan}")

# A run on 2 ranks writes its document.
run_expect(0 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan.json --steps 2 --out run.json)
file(READ ${WORK}/run.json run)
string(JSON kind GET "${run}" kind)
string(JSON ranks LENGTH "${run}" ranks)
string(JSON rank1_peak GET "${run}" ranks 1 memory peak_bytes)
string(JSON predicted GET "${run}" prediction peak_bytes)
if(NOT kind STREQUAL "shardplan.run" OR NOT ranks EQUAL 2)
  message(FATAL_ERROR "run.json: kind ${kind}, ${ranks} ranks")
endif()
message(STATUS "peak of rank 1: ${rank1_peak} bytes measured, ${predicted} predicted")

# The same run with each group's collectives on a thread of its own (--collective-streams): the
# same losses (the same sums in the same order) and the same tracked memory as a blocking run that
# issues its gathers ahead as planned, and a run document saying the collectives overlapped, so
# that validate takes the time the compute waited for them as the exposed communication.
run_expect(0 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan.json --steps 2 --out ahead.json
                     --prefetch-as-planned)
run_expect(0 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan.json --steps 2 --out streams.json
                     --collective-streams)
file(READ ${WORK}/ahead.json ahead)
file(READ ${WORK}/streams.json streams)
foreach(field "summary;memory;peak_bytes" "ranks;1;time;steps;1;loss" "ranks;0;time;steps;0;loss")
  string(JSON a GET "${ahead}" ${field})
  string(JSON b GET "${streams}" ${field})
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "collective streams: ${field} is ${b}, a blocking run's ${a}")
  endif()
endforeach()
string(JSON overlap_blocking GET "${ahead}" summary time collectives_overlap)
string(JSON overlap_streams GET "${streams}" summary time collectives_overlap)
string(JSON waited GET "${streams}" summary time comm_wait_s)
if(overlap_blocking OR NOT overlap_streams)
  message(FATAL_ERROR "collectives_overlap: ${overlap_blocking} blocking, ${overlap_streams} streams")
endif()
run_expect(0 COMMAND ${PLANNER} validate --plan plan.json --run streams.json --format json
           OUTPUT validated)
string(JSON measured_comm GET "${validated}" time parts communication measured_s)
if(NOT measured_comm EQUAL waited)
  message(FATAL_ERROR "validate: exposed communication ${measured_comm} s, the run waited ${waited} s")
endif()
message(STATUS "collective streams: the compute waited ${waited} s a step for collectives")
run_expect(2 COMMAND ${EXECUTOR} --plan plan.json --rehearse-rank 0 --world 2 --out x.json
                     --collective-streams EXPECT "--collective-streams: a rehearsal")

# A rehearsal of rank 1 of the 2-rank plan in one process allocates rank 1's peak.
run_expect(0 COMMAND ${EXECUTOR} --plan plan.json --rehearse-rank 1 --world 2 --steps 2 --out rehearsal.json)
file(READ ${WORK}/rehearsal.json rehearsal)
string(JSON rehearsed_peak GET "${rehearsal}" ranks 0 memory peak_bytes)
string(JSON excluded GET "${rehearsal}" summary time collective_time_excluded)
if(NOT rehearsed_peak EQUAL rank1_peak OR NOT excluded)
  message(FATAL_ERROR "rehearsal of rank 1: peak ${rehearsed_peak}, rank 1 measured ${rank1_peak}; "
                      "collective time excluded: ${excluded}")
endif()

# Out of memory: exit code 3, with the category, the sizes and the plan's prediction.
run_expect(3 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan plan.json --steps 1 --out oom.json --gpu-memory-GiB 0.01
           EXPECT "out of memory: allocating" "would exceed the capacity of" "the plan predicts a peak of")
string(REGEX MATCHALL "executor: rank [0-9]+ on [^:]+: out of memory" oom_lines "${last_stderr}")
list(LENGTH oom_lines oom_count)
message(STATUS "out-of-memory lines: ${oom_count} of 2 ranks")
run_expect(3 COMMAND ${EXECUTOR} --plan plan.json --rehearse-rank 0 --world 2 --out oom.json --gpu-memory-GiB 0.01
           EXPECT "out of memory: allocating")

# Bad input: one line naming the field, exit code 2.
run_expect(2 COMMAND ${mpirun} -np 2 ${EXECUTOR} --plan bf16-plan.json --out x.json
           EXPECT "/job/precision: the CPU executor runs fp32, bf16-mixed and fp16-mixed, got \"bf16\"")
run_expect(2 COMMAND ${mpirun} -np 1 ${EXECUTOR} --plan plan.json --out x.json
           EXPECT "/cluster/gpus: the plan is for 2 ranks, the run has 1")
run_expect(2 COMMAND ${EXECUTOR} --plan plan.json --out x.json --steps 0 EXPECT "--steps: must be between")
run_expect(2 COMMAND ${EXECUTOR} --plan missing.json --out x.json EXPECT "missing.json")
string(REGEX MATCHALL "executor: " lines "${last_stderr}")
list(LENGTH lines count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "bad input should be one line, got:\n${last_stderr}")
endif()

# The CUDA backend's options: a backend that does not exist, checkpoints (cpu only), and a
# rehearsal of rank 0 on the GPU: it runs where there is one (the run document names the device)
# and is refused with one line naming --backend where there is none (or no CUDA in the build).
run_expect(2 COMMAND ${EXECUTOR} --plan plan.json --out x.json --backend gpu
           EXPECT "--backend: must be cpu or cuda, got \"gpu\"")
run_expect(2 COMMAND ${EXECUTOR} --plan plan.json --out x.json --backend cuda --save ckpt
           EXPECT "--save: checkpoints are written and read by the cpu backend only")
execute_process(COMMAND ${EXECUTOR} --backend cuda --plan plan.json --rehearse-rank 0 --world 2
                        --steps 2 --out gpu-rehearsal.json
                RESULT_VARIABLE rc ERROR_VARIABLE err WORKING_DIRECTORY ${WORK} TIMEOUT 120)
if(rc EQUAL 0)
  file(READ ${WORK}/gpu-rehearsal.json gpu_run)
  string(JSON device GET "${gpu_run}" environment device)
  string(JSON reserved GET "${gpu_run}" summary memory device reserved_peak_bytes)
  message(STATUS "GPU rehearsal on ${device}: ${reserved} bytes reserved at the peak")
elseif(rc EQUAL 2)
  if(NOT err MATCHES "^executor: --backend: cuda: this (host has no CUDA device|build has no CUDA backend)")
    message(FATAL_ERROR "--backend cuda without a GPU: ${err}")
  endif()
  message(STATUS "no GPU here: ${err}")
else()
  message(FATAL_ERROR "--backend cuda rehearsal: exit code ${rc}: ${err}")
endif()
