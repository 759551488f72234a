# The progress lines of a resumed run go on counting from the checkpoint: 2 steps saved, then 2
# resumed steps read "step 3/4" and "step 4/4" (not "step 3/2").
# Arguments: MPIRUN, EXECUTOR, PLANNER, DATA (this folder's data/), WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_expect.cmake)
start_program_test()

run_expect(0 COMMAND ${PLANNER} recommend --model ${DATA}/llama-tiny.json --hardware ${DATA}/cpu-test.json
                     --gpus 1 --seq-len 64 --global-batch 2 --micro-batch 1 --attention eager
                     --checkpointing none --offload none --recipe executor --precision fp32
                     --strategy ddp --emit plan OUTPUT plan)
file(WRITE ${WORK}/plan.json "${plan}")
set(run ${mpirun} -np 1 ${EXECUTOR} --plan plan.json --layers 1 --hidden 16 --heads 2
        --vocab 64)
run_expect(0 COMMAND ${run} --steps 2 --out saved.json --save ckpt
           EXPECT "executor: step 1/2:" "executor: step 2/2:")
run_expect(0 COMMAND ${run} --steps 2 --out resumed.json --resume ckpt
           EXPECT "executor: step 3/4:" "executor: step 4/4:")
