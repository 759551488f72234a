# On a GPU, without MPI: `calibrate --backend nccl` as one process that torchrun's variables make
# rank 0 of 1; then the profile it wrote, loaded through the cost model (profile_check). A world
# of one rank has no collective to time (calibrate says so in a note), so this measures cuBLAS
# GEMMs, GPT-2's attention core (the CUDA backend's bf16 eager and flash kernels: head_dim 64) and
# copy bandwidth, and exercises the NCCL world that carries the host exchanges (the topology, the
# preflight broadcasts, the slowest rank's times). On a machine without a CUDA
# device calibrate fails with "no CUDA device"; this script then prints "no CUDA device: skipped",
# which the test's SKIP_REGULAR_EXPRESSION turns into a skipped test (a cmake -P script cannot
# exit with 77 before CMake 3.29).
#   cmake -DCALIBRATE=... -DPROFILE_CHECK=... -DWORK_DIR=... -P nccl_end_to_end.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(ENV{RANK} 0)
set(ENV{WORLD_SIZE} 1)
set(ENV{LOCAL_RANK} 0)
set(ENV{MASTER_ADDR} 127.0.0.1)
set(ENV{MASTER_PORT} 29511) # a world of one opens no socket
set(profile "${WORK_DIR}/calibrated.json")
execute_process(
  COMMAND "${CALIBRATE}" --backend nccl --max-bytes 1M --warmup 1 --iters 4 --gemm-model gpt2
          --gemm-tokens 256 --attention-seq 128 --timeout-s 120 --out "${profile}" --accept-poor-fit
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err WORKING_DIRECTORY "${WORK_DIR}")
if(NOT code EQUAL 0 AND err MATCHES "no CUDA device")
  message("no CUDA device: skipped")
  return()
endif()
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "calibrate exited with ${code}")
endif()
foreach(expected "# calibrate: nccl backend (NCCL " "1 ranks on 1 node" "# note: world: not measured"
        "  bf16  " "  tf32  " "# memory copy bandwidth" "# compute efficiency (bf16"
        "# attention eager bf16 (batch 2, seq 128, heads 12, kv_heads 12, head_dim 64)"
        "# attention flash bf16 (batch 2, seq 128, heads 12, kv_heads 12, head_dim 64)"
        "# wrote ${profile}")
  string(FIND "${out}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "calibrate's output lacks \"${expected}\"")
  endif()
endforeach()
execute_process(COMMAND "${PROFILE_CHECK}" "${profile}" 0 2
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "the cost model rejected the profile")
endif()
